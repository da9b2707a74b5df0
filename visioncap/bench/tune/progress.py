"""How a tuning run reports while it works (kept apart so the CLI can import it without the runner)."""

from __future__ import annotations


class TuneProgress:
    """What the runner reports while it works (the CLI shows a progress bar); the default says nothing."""

    def step(self, description: str) -> None:
        """A step starts."""

    def advance(self) -> None:
        """The current step is done."""

    def more(self, steps: int) -> None:
        """The run found `steps` more to do than it said at the start (a candidate served again)."""

    def note(self, line: str) -> None:
        """A result worth a line of its own."""
