"""Read-side queries of the API: filtered newest-first pages, camera summaries, rows changed since a watermark.

Free text goes to SQLite FTS5 or PostgreSQL full-text search (both made by `schema.ensure_schema`). Text is
never passed to either as query syntax: only its words are, quoted for FTS5 and joined with & for to_tsquery,
so any input is a valid query (every word must match; the last also as a prefix).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Row,
    and_,
    func,
    literal_column,
    or_,
    select,
    text,
)
from sqlalchemy.orm import Session

from visioncap.store.records import CaptionCountRecord, CaptionEventCountRecord, CaptionRecord, CaptionStatus
from visioncap.store.schema import PG_TS_CONFIG, PG_TSVECTOR_COLUMN

_WORD = re.compile(r"\w+", re.UNICODE)

# Readers get plain rows (the columns of `captions` as attributes), not ORM objects: building 50 mapped objects
# per page cost more than the query itself, and nothing on the read side changes them.
CaptionRow = Row[Any]
# The frame geometry only serves drawing boxes on one image (read through CaptionStore.get).
_CAPTION_COLUMNS = tuple(
    column for column in CaptionRecord.__table__.c if column.name not in {"frame_width", "frame_height", "image_region"}
)


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
        return text(f"{PG_TSVECTOR_COLUMN} @@ to_tsquery('{PG_TS_CONFIG}'::regconfig, :q)").bindparams(q=tsquery)
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
        # The order-by index (capture time, or updated_at for the stream) must drive: SQLite without statistics
        # chose the status index instead, reading most of a million rows (1.2-6 s).
        conditions.append(_not_indexed(engine, CaptionRecord.status).in_(list(query.statuses)))
    if query.text:
        conditions.append(_text_condition(engine, query.text))
    return conditions


def _after(after: Position | None) -> list[ColumnElement[bool]]:
    if after is None:
        return []
    return [
        or_(
            CaptionRecord.captured_at < after.captured_at,
            and_(CaptionRecord.captured_at == after.captured_at, CaptionRecord.id < after.id),
        )
    ]


# Sizes of the successive batches of full-text matches _sqlite_text_page reads before it gives up.
_FTS_BATCHES = (256, 2048, 16384)
_NEWEST_FIRST = (CaptionRecord.captured_at.desc(), CaptionRecord.id.desc())


def _sqlite_text_page(
    engine: Engine, conn: Connection, query: CaptionFilter, match: str, size: int, after: Position | None
) -> list[CaptionRow] | None:
    """The first `size` rows of a text search newest first, reading only the newest matches; None: undecided.

    `id IN (SELECT rowid ... MATCH)` makes SQLite collect every match and fetch each row to sort by capture time
    (seconds for a word in a third of a million captions). FTS5 instead hands out matches lazily by rowid,
    newest rowid first, and rowids follow capture time closely (rows are written as frames are selected). So
    batches of the newest matches are ranked by (captured_at, id) until the `size`-th best is known to be final:
    no row older by rowid than the batches read (`id < below`) is newer than it. That check scans the capture-time
    index above the `size`-th best row only, which is short exactly when the batches were enough.
    """
    others = [*_conditions(engine, replace(query, text=None)), *_after(after)]
    best: list[tuple[datetime, int]] = []
    below: int | None = None
    for batch in _FTS_BATCHES:
        sql = "SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match"
        params: dict[str, object] = {"match": match, "batch": batch}
        if below is not None:
            sql += " AND rowid < :below"
            params["below"] = below
        # One statement per batch: the matches' rowids, each with its capture time when the row passes the other
        # filters (a left join), so the batch's oldest rowid is known without binding the batch back as a list.
        matches = text(sql + " ORDER BY rowid DESC LIMIT :batch").bindparams(**params).columns(rowid=Integer)
        matches = matches.subquery("matches")
        ranked = select(matches.c.rowid, CaptionRecord.captured_at).select_from(
            matches.outerjoin(CaptionRecord, and_(CaptionRecord.id == matches.c.rowid, *others))
        )
        found = conn.execute(ranked).all()
        if found:
            kept = ((at, row_id) for row_id, at in found if at is not None)
            best = sorted([*best, *kept], reverse=True)[:size]
            below = min(row_id for row_id, _ in found)
        if len(found) < batch:  # every match has been ranked
            break
        if len(best) == size:
            newest_unread = select(CaptionRecord.id).where(
                CaptionRecord.id < below, CaptionRecord.captured_at >= best[-1][0]
            )
            if query.until is not None:
                newest_unread = newest_unread.where(CaptionRecord.captured_at < query.until)
            if after is not None:
                newest_unread = newest_unread.where(CaptionRecord.captured_at <= after.captured_at)
            if conn.scalar(newest_unread.limit(1)) is None:
                break
    else:
        return None
    if not best:
        return []
    statement = select(*_CAPTION_COLUMNS).where(CaptionRecord.id.in_([row_id for _, row_id in best]))
    return list(conn.execute(statement.order_by(*_NEWEST_FIRST)))


def search_captions(
    engine: Engine, query: CaptionFilter, limit: int, after: Position | None = None
) -> tuple[list[CaptionRow], Position | None]:
    """Up to `limit` rows, newest first (capture time, then id), after `after`; and the next page's position.

    PostgreSQL needs no shortcut: the tsvector is a stored column (schema step 7) with statistics, so the planner
    estimates how many rows a search matches (prefixes included) and either walks the capture-time index, checking
    each row's stored tsvector, or reads the few matches from the GIN index and sorts them. On a million rows
    every search of the benchmark takes 0.1-2 ms that way; a word common long ago but absent lately is the case a
    newest-first walk is slow for.
    """
    dialect = engine.dialect.name
    match = fts5_query(query.text) if query.text and dialect == "sqlite" else None
    with engine.connect() as conn:
        rows = _sqlite_text_page(engine, conn, query, match, limit + 1, after) if match is not None else None
        if rows is None:
            statement = select(*_CAPTION_COLUMNS).where(*_conditions(engine, query), *_after(after))
            rows = list(conn.execute(statement.order_by(*_NEWEST_FIRST).limit(limit + 1)))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, Position(rows[-1].captured_at, rows[-1].id)


def _not_indexed(engine: Engine, column: ColumnElement[Any]) -> ColumnElement[Any]:
    """`column` as SQLite must not pick an index for (a unary +); as is elsewhere.

    Without statistics SQLite prefers any equality to a range or an ORDER BY index: for `status` (nine rows in ten
    are captioned) that meant reading most of the table and sorting it.
    """
    if engine.dialect.name != "sqlite":
        return column
    return literal_column(f"+captions.{column.name}", column.type)  # type: ignore[attr-defined]


def camera_summaries(engine: Engine) -> list[CameraSummary]:
    """Per camera: newest frame stored, newest caption, distinct events and rows by status; by camera name.

    Counts come from the tables the triggers of schema step 8 keep; the newest times from the camera's
    capture-time index (one short walk per camera). Nothing here reads every row.
    """
    counts = CaptionCountRecord.__table__
    events = CaptionEventCountRecord.__table__
    cameras = select(counts.c.camera).where(counts.c.row_count > 0).distinct().subquery()
    newest = select(func.max(CaptionRecord.captured_at)).where(CaptionRecord.camera == cameras.c.camera)
    newest_caption = (
        select(CaptionRecord.captured_at)
        .where(
            CaptionRecord.camera == cameras.c.camera,
            _not_indexed(engine, CaptionRecord.status) == CaptionStatus.CAPTIONED.value,
        )
        .order_by(CaptionRecord.captured_at.desc())
        .limit(1)
    )
    times = select(cameras.c.camera, newest.scalar_subquery(), newest_caption.scalar_subquery())
    summaries: dict[str, CameraSummary] = {}
    with engine.connect() as conn:
        for camera, last_frame_at, last_caption_at in conn.execute(times):
            summaries[camera] = CameraSummary(camera, last_frame_at=last_frame_at, last_caption_at=last_caption_at)
        for camera, status, count in conn.execute(select(counts).where(counts.c.row_count > 0)):
            summary = summaries.setdefault(camera, CameraSummary(camera))
            summary.by_status[status] = summary.by_status.get(status, 0) + int(count)
        for camera, count in conn.execute(select(events).where(events.c.event_count > 0)):
            summaries.setdefault(camera, CameraSummary(camera)).events = int(count)
    return [summaries[name] for name in sorted(summaries)]


def status_counts(engine: Engine) -> dict[str, int]:
    """Rows by status over all cameras (from the trigger-kept counts)."""
    counts = CaptionCountRecord.__table__
    query = select(counts.c.status, func.sum(counts.c.row_count)).group_by(counts.c.status)
    with engine.connect() as conn:
        return {status: int(total) for status, total in conn.execute(query) if total}


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
) -> list[CaptionRow]:
    """Captioned rows changed at or after `since - overlap`, oldest change first.

    The overlap covers writers whose transactions commit after a later-stamped one; callers drop the
    (id, updated_at) pairs they have already sent.
    """
    query = CaptionFilter(cameras=cameras, min_people=min_people, statuses=(CaptionStatus.CAPTIONED,))
    statement = (
        select(*_CAPTION_COLUMNS)
        .where(*_conditions(engine, query))
        .where(CaptionRecord.updated_at >= since - overlap)
        .order_by(CaptionRecord.updated_at, CaptionRecord.id)
        .limit(limit)
    )
    with engine.connect() as conn:
        return list(conn.execute(statement))
