"""Runs a pipeline: source -> detect -> track -> select -> outbox -> caption -> store."""

from visioncap.pipeline.runner import PipelineRunner, RunSummary

__all__ = ["PipelineRunner", "RunSummary"]
