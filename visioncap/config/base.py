"""Shared base for configuration models: unknown keys are errors, not silently ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A config section: every field described, extra keys refused, immutable once loaded."""

    # allow_inf_nan: `.inf` or "nan" for a timeout or rate is a typo that would fail only deep inside a run.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
