"""Which person frames are worth a caption."""

from __future__ import annotations

from pydantic import Field

from visioncap.config.base import StrictModel


class SelectionConfig(StrictModel):
    """Caption the first frame of each run of person frames, then at most one per interval while it lasts."""

    interval_s: float = Field(
        default=10.0,
        gt=0,
        description="While people stay in view, at most one further caption per this many seconds of video.",
    )
    gap_s: float = Field(
        default=1.0,
        ge=0,
        description=(
            "A run of person frames ends after this many seconds of video without people; shorter gaps "
            "(a missed detection, someone briefly hidden) continue the run."
        ),
    )
