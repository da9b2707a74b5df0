"""The caption store: the only place that writes or reads caption rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from visioncap.errors import VisioncapError
from visioncap.store.records import Base, CaptionRecord

CAPTIONED = "captioned"
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class NewCaption:
    """Everything stored about one selected frame."""

    pipeline: str
    camera: str
    source: str
    frame_index: int
    offset_s: float
    captured_at: datetime
    reason: str
    people: list[dict[str, Any]]
    image_width: int
    image_height: int
    model: str
    caption: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None


class CaptionStore:
    """Adds and lists caption rows; each write is its own transaction."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    def create_schema(self) -> None:
        try:
            Base.metadata.create_all(self._engine)
        except SQLAlchemyError as exc:
            raise VisioncapError(f"cannot prepare the database at {self._engine.url!r}: {exc}") from exc

    def add(self, new: NewCaption) -> CaptionRecord:
        record = CaptionRecord(
            pipeline=new.pipeline,
            camera=new.camera,
            source=new.source,
            frame_index=new.frame_index,
            offset_s=new.offset_s,
            captured_at=new.captured_at,
            reason=new.reason,
            people=new.people,
            people_count=len(new.people),
            image_width=new.image_width,
            image_height=new.image_height,
            status=FAILED if new.error is not None else CAPTIONED,
            caption=new.caption,
            error=new.error,
            model=new.model,
            prompt_tokens=new.prompt_tokens,
            completion_tokens=new.completion_tokens,
            latency_ms=new.latency_ms,
        )
        with self._sessions.begin() as session:
            session.add(record)
        return record

    def get(self, caption_id: int) -> CaptionRecord | None:
        with self._sessions() as session:
            return session.get(CaptionRecord, caption_id)

    def list(self, camera: str | None = None, limit: int = 50) -> list[CaptionRecord]:
        """Newest first (by capture time, then id)."""
        query = select(CaptionRecord).order_by(CaptionRecord.captured_at.desc(), CaptionRecord.id.desc())
        if camera is not None:
            query = query.where(CaptionRecord.camera == camera)
        with self._sessions() as session:
            return list(session.scalars(query.limit(limit)))

    def count(self, status: str | None = None) -> int:
        query = select(func.count()).select_from(CaptionRecord)
        if status is not None:
            query = query.where(CaptionRecord.status == status)
        with self._sessions() as session:
            return int(session.scalar(query) or 0)
