"""Bodies of /v1/summaries."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from visioncap.config.sources import CAMERA_ID_PATTERN
from visioncap.summaries.store import Summary


class SummaryRequest(BaseModel):
    """A window of some cameras' captions to summarise."""

    model_config = ConfigDict(extra="forbid")

    cameras: list[Annotated[str, Field(pattern=CAMERA_ID_PATTERN)]] = Field(
        min_length=1, max_length=16, description="Camera ids whose captions are read."
    )
    start: datetime = Field(description="Window start (inclusive); without a zone: UTC.")
    end: datetime = Field(description="Window end (exclusive); without a zone: UTC.")


class SummaryView(BaseModel):
    """A stored summary."""

    id: int = Field(description="Summary id.")
    kind: str = Field(description="`request` (POST /v1/summaries), `hourly` or `daily` (a digest).")
    cameras: list[str] = Field(description="Cameras the window covers.")
    window_start: datetime = Field(description="Window start (UTC).")
    window_end: datetime = Field(description="Window end (UTC).")
    text: str = Field(description="The summary the VLM wrote.")
    citations: list[int] = Field(description="Caption ids the summary cites, all in the window.")
    caption_count: int = Field(description="Captions the window held.")
    depth: int = Field(description="Levels of summaries: 1 when the window fit one request.")
    requests: int = Field(description="VLM requests made.")
    created_at: datetime | None = Field(description="When it was stored.")

    @classmethod
    def of(cls, summary: Summary) -> SummaryView:
        assert summary.id is not None
        return cls(
            id=summary.id,
            kind=summary.kind,
            cameras=list(summary.cameras),
            window_start=summary.window_start,
            window_end=summary.window_end,
            text=summary.text,
            citations=list(summary.citations),
            caption_count=summary.caption_count,
            depth=summary.depth,
            requests=summary.requests,
            created_at=summary.created_at,
        )


class SummaryList(BaseModel):
    summaries: list[SummaryView] = Field(description="Newest first.")
