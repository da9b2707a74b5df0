"""Read-side queries of the API: filtered newest-first pages, camera summaries, rows changed since a watermark.

Free text goes to SQLite FTS5 or PostgreSQL full-text search (both made by `schema.ensure_schema`). Text is
never passed to either as query syntax: only its words are, quoted for FTS5 and joined with & for to_tsquery,
so any input is a valid query (every word must match; the last also as a prefix).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Engine, and_, func, or_, select, text
from sqlalchemy.orm import Session

from visioncap.store.records import CaptionRecord, CaptionStatus
from visioncap.store.schema import PG_TS_CONFIG, PG_TSVECTOR

_WORD = re.compile(r"\w+", re.UNICODE)


@dataclass(frozen=True, slots=True)
class CaptionFilter:
    """What a caller asks for; every part is optional and they combine with AND."""

    cameras: Sequence[str] = ()
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    text: str | None = None
    min_people: int | None = None
    statuses: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class Position:
    """A row's place in newest-first order: the keyset cursor."""

    captured_at: datetime
    id: int


@dataclass(slots=True)
class CameraSummary:
    camera: str
    last_frame_at: datetime | None = None
    last_caption_at: datetime | None = None
    events: int = 0
    by_status: dict[str, int] = field(default_factory=lambda: {status.value: 0 for status in CaptionStatus})


def fts5_query(free_text: str) -> str | None:
    """Words of `free_text` as an FTS5 query (every word, the last also as a prefix); None without words."""
    words = _WORD.findall(free_text)
    if not words:
        return None
    quoted = [f'"{word}"' for word in words]
    quoted[-1] += "*"
    return " ".join(quoted)


def _text_condition(engine: Engine, free_text: str) -> ColumnElement[bool]:
    dialect = engine.dialect.name
    if dialect == "sqlite":
        match = fts5_query(free_text)
        if match is None:
            return CaptionRecord.id.is_(None)  # no words: nothing matches
        subquery = text("SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match").bindparams(match=match)
        return CaptionRecord.id.in_(subquery.columns(rowid=CaptionRecord.id.type))
    if dialect == "postgresql":
        words = _WORD.findall(free_text)
        if not words:
            return CaptionRecord.id.is_(None)
        # Only word characters reach to_tsquery, so its syntax cannot be injected; the last word is a prefix.
        tsquery = " & ".join([*words[:-1], f"{words[-1]}:*"])
        return text(f"{PG_TSVECTOR} @@ to_tsquery('{PG_TS_CONFIG}'::regconfig, :q)").bindparams(q=tsquery)
    words = _WORD.findall(free_text) or [""]
    return and_(*(CaptionRecord.caption.ilike(f"%{word}%") for word in words))


def _conditions(engine: Engine, query: CaptionFilter) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if query.cameras:
        conditions.append(CaptionRecord.camera.in_(list(query.cameras)))
    if query.since is not None:
        conditions.append(CaptionRecord.captured_at >= query.since)
    if query.until is not None:
        conditions.append(CaptionRecord.captured_at < query.until)
    if query.min_people is not None:
        conditions.append(CaptionRecord.people_count >= query.min_people)
    if query.statuses:
        conditions.append(CaptionRecord.status.in_(list(query.statuses)))
    if query.text:
        conditions.append(_text_condition(engine, query.text))
    return conditions


def search_captions(
    engine: Engine, query: CaptionFilter, limit: int, after: Position | None = None
) -> tuple[list[CaptionRecord], Position | None]:
    """Up to `limit` rows, newest first (capture time, then id), after `after`; and the next page's position."""
    statement = select(CaptionRecord).where(*_conditions(engine, query))
    if after is not None:
        statement = statement.where(
            or_(
                CaptionRecord.captured_at < after.captured_at,
                and_(CaptionRecord.captured_at == after.captured_at, CaptionRecord.id < after.id),
            )
        )
    statement = statement.order_by(CaptionRecord.captured_at.desc(), CaptionRecord.id.desc()).limit(limit + 1)
    with Session(engine, expire_on_commit=False) as session:
        rows = list(session.scalars(statement))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, Position(rows[-1].captured_at, rows[-1].id)


def camera_summaries(engine: Engine) -> list[CameraSummary]:
    """Per camera: newest frame stored, newest caption, distinct events and rows by status; by camera name."""
    by_status = select(CaptionRecord.camera, CaptionRecord.status, func.count(), func.max(CaptionRecord.captured_at))
    by_status = by_status.group_by(CaptionRecord.camera, CaptionRecord.status)
    events = select(CaptionRecord.camera, func.count(func.distinct(CaptionRecord.event_key)))
    events = events.where(CaptionRecord.event_key != "").group_by(CaptionRecord.camera)
    summaries: dict[str, CameraSummary] = {}
    with Session(engine) as session:
        for camera, status, count, newest in session.execute(by_status):
            summary = summaries.setdefault(camera, CameraSummary(camera))
            summary.by_status[status] = summary.by_status.get(status, 0) + int(count)
            if newest is not None and (summary.last_frame_at is None or newest > summary.last_frame_at):
                summary.last_frame_at = newest
            if status == CaptionStatus.CAPTIONED:
                summary.last_caption_at = newest
        for camera, count in session.execute(events):
            summaries.setdefault(camera, CameraSummary(camera)).events = int(count)
    return [summaries[name] for name in sorted(summaries)]


def latest_change(engine: Engine) -> datetime | None:
    """The newest `updated_at` of any row: where a live stream starts (the database's clock, not ours)."""
    with Session(engine) as session:
        return session.scalar(select(func.max(CaptionRecord.updated_at)))


def captioned_since(
    engine: Engine,
    since: datetime,
    cameras: Sequence[str] = (),
    min_people: int | None = None,
    overlap: timedelta = timedelta(seconds=5),
    limit: int = 200,
) -> list[CaptionRecord]:
    """Captioned rows changed at or after `since - overlap`, oldest change first.

    The overlap covers writers whose transactions commit after a later-stamped one; callers drop the
    (id, updated_at) pairs they have already sent.
    """
    query = CaptionFilter(cameras=cameras, min_people=min_people, statuses=(CaptionStatus.CAPTIONED,))
    statement = (
        select(CaptionRecord)
        .where(*_conditions(engine, query), CaptionRecord.updated_at >= since - overlap)
        .order_by(CaptionRecord.updated_at, CaptionRecord.id)
        .limit(limit)
    )
    with Session(engine, expire_on_commit=False) as session:
        return list(session.scalars(statement))
