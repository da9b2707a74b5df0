"""Database tables."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect, Float, Index, Integer, String, Text, TypeDecorator, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite would hand back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: store times with a timezone")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


class CaptionStatus(StrEnum):
    """Where a selected frame is in the outbox."""

    PENDING = "pending"  # saved, waiting for (or between attempts at) a caption
    CAPTIONED = "captioned"
    FAILED = "failed"  # the VLM refused it for good (e.g. HTTP 400); the error says why
    SKIPPED = "skipped"  # never sent: coalesced, queue full, too old; the error says why


class CaptionRecord(Base):
    """One selected frame and what became of it. Rows are written before any VLM call (the outbox)."""

    __tablename__ = "captions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    camera: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    frame_index: Mapped[int] = mapped_column(Integer)
    offset_s: Mapped[float] = mapped_column(Float)
    captured_at: Mapped[datetime] = mapped_column(UtcDateTime())
    reason: Mapped[str] = mapped_column(String(32))
    event_key: Mapped[str] = mapped_column(String(96))
    event_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    score: Mapped[float] = mapped_column(Float, default=0.0)
    people: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    people_count: Mapped[int] = mapped_column(Integer)
    image_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    image_width: Mapped[int] = mapped_column(Integer)
    image_height: Mapped[int] = mapped_column(Integer)
    image_tokens: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    caption: Mapped[str | None] = mapped_column(Text, nullable=True)
    structured: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    model: Mapped[str] = mapped_column(String(256))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)
    # Geometry for drawing `people` (frame pixels) on the stored image; null when the writer did not record it.
    frame_width: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    frame_height: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    image_region: Mapped[list[int] | None] = mapped_column(JSON, nullable=True, default=None)  # [x1, y1, x2, y2]

    __table_args__ = (
        # A camera sees one frame at a time: re-running a file finds its frames already stored.
        UniqueConstraint("camera", "captured_at", name="uq_captions_camera_captured"),
        Index("ix_captions_status", "status"),
        # The API's newest-first pages (all cameras, one camera) and its live stream (rows changed since).
        Index("ix_captions_captured_id", "captured_at", "id"),
        Index("ix_captions_camera_captured_id", "camera", "captured_at", "id"),
        Index("ix_captions_updated_id", "updated_at", "id"),
    )


class CameraRecord(Base):
    """What the pipeline last reported of one camera: its state and the newest frame it analysed."""

    __tablename__ = "cameras"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(Text)  # path or URL, credentials masked (visioncap.redact)
    state: Mapped[str] = mapped_column(String(16))  # a CameraState value, or "failed" (the source gave up)
    state_since: Mapped[datetime] = mapped_column(UtcDateTime())
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Capture time (same clock as captions.captured_at) of the newest analysed frame; written every few seconds.
    last_frame_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    frames_analysed: Mapped[int] = mapped_column(Integer, default=0)  # in the reporting run
    reported_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class CaptionCountRecord(Base):
    """Rows of `captions` per camera and status, kept by triggers (schema step 8) so no request counts rows."""

    __tablename__ = "caption_counts"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    row_count: Mapped[int] = mapped_column(Integer)


class CaptionEventRecord(Base):
    """Rows of `captions` per camera and event key, kept by the same triggers: the distinct events of a camera."""

    __tablename__ = "caption_events"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_key: Mapped[str] = mapped_column(String(96), primary_key=True)
    row_count: Mapped[int] = mapped_column(Integer)


class CaptionEventCountRecord(Base):
    """Distinct non-empty event keys per camera (rows of `caption_events`), kept by triggers on that table."""

    __tablename__ = "caption_event_counts"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_count: Mapped[int] = mapped_column(Integer)
