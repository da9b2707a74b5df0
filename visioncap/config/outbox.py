"""The durable queue between selection and the VLM."""

from __future__ import annotations

from pydantic import Field

from visioncap.config.base import StrictModel


class OutboxConfig(StrictModel):
    """Selected frames are saved and recorded as pending before any VLM call, then captioned with retries."""

    capacity: int = Field(
        default=256,
        ge=1,
        description="Most frames waiting for a caption; when full, frames of the same event are coalesced (the "
        "best kept) and others are recorded as skipped.",
    )
    retry_initial_s: float = Field(default=1.0, gt=0, description="First wait after a transient VLM failure.")
    retry_max_s: float = Field(default=30.0, gt=0, description="Longest wait between attempts at one frame.")
    drain_timeout_s: float = Field(
        default=600.0,
        ge=0,
        description="When all sources have ended, seconds to wait for pending captions; what is left stays "
        "pending and is captioned first by the next run.",
    )
    journal_capacity: int = Field(
        default=10_000,
        ge=1,
        description="Most frames kept in the local journal (DATA_DIR/journal/) while the database is away; beyond "
        "it, frames are counted and logged as skipped (journal_full). Each entry is a JSON file of about 1 KB "
        "beside the frame's own image.",
    )
    store_retry_max_s: float = Field(
        default=5.0,
        gt=0,
        description="Longest wait between attempts to write the journal to the database while it is away.",
    )
