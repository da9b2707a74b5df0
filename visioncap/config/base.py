"""Shared base for configuration models: unknown keys are errors, not silently ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section: every field described, extra keys refused, immutable once loaded."""

    model_config = ConfigDict(extra="forbid", frozen=True)
