"""Runs a pipeline: source -> detect -> track -> select -> outbox -> caption -> store.

Nothing is imported here: the runner pulls in the caption client (the openai SDK), which importers of a part
(metrics, the outbox) must not pay for.
"""
