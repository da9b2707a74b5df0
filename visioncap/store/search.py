"""Read-side queries of the API: filtered newest-first pages, camera summaries, rows changed since a watermark.

Free text goes to SQLite FTS5 or PostgreSQL full-text search (both made by `schema.ensure_schema`). Text is
never passed to either as query syntax: only its words are, quoted for FTS5 and joined with & for to_tsquery,
so any input is a valid query (every word must match; the last also as a prefix).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, cast

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
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import QueryableAttribute
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement, Executable

from visioncap.config.api import DEFAULT_SCAN_ROWS
from visioncap.store.records import (
    CaptionCountRecord,
    CaptionEventCountRecord,
    CaptionRecord,
    CaptionStatus,
    CaptionZoneRecord,
)
from visioncap.store.schema import PG_TS_CONFIG, PG_TSVECTOR_COLUMN

WORD = re.compile(r"\w+", re.UNICODE)

# Readers get plain rows (the columns of `captions` as attributes), not ORM objects: building 50 mapped objects
# per page cost more than the query itself, and nothing on the read side changes them.
CaptionRow = Row[Any]
# The frame geometry and the zones' polygons only serve drawing on one image (read through CaptionStore.get).
DRAWING_ONLY = frozenset({"frame_width", "frame_height", "image_region", "zone_shapes"})
CAPTION_COLUMNS = tuple(column for column in CaptionRecord.__table__.c if column.name not in DRAWING_ONLY)
_NEWEST_FIRST = (CaptionRecord.captured_at.desc(), CaptionRecord.id.desc())

# SQLite calls the time-limit check every this many virtual-machine steps (~20 ms of work: a walk takes ~5 steps a
# row): rarely enough that a search seldom waits for the GIL while other threads run Python, often enough for a
# limit of a fraction of a second.
_SQLITE_PROGRESS_STEPS = 100_000
_PG_QUERY_CANCELED = "57014"  # SQLSTATE of a statement stopped by statement_timeout (or a cancel request)


@dataclass(frozen=True, slots=True)
class CaptionFilter:
    """What a caller asks for; every part is optional and they combine with AND."""

    cameras: Sequence[str] = ()
    since: datetime | None = None  # inclusive
    until: datetime | None = None  # exclusive
    text: str | None = None
    min_people: int | None = None
    statuses: Sequence[CaptionStatus] = ()
    zones: Sequence[str] = ()  # a person in any of them
    min_dwell_s: float | None = None  # ... for at least this long (in one of `zones`, when given)


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
    by_status: dict[CaptionStatus, int] = field(default_factory=lambda: dict.fromkeys(CaptionStatus, 0))


def fts5_query(free_text: str) -> str | None:
    """Words of `free_text` as an FTS5 query (every word, the last also as a prefix); None without words."""
    words = WORD.findall(free_text)
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
        words = WORD.findall(free_text)
        if not words:
            return CaptionRecord.id.is_(None)
        # Only word characters reach to_tsquery, so its syntax cannot be injected; the last word is a prefix.
        tsquery = " & ".join([*words[:-1], f"{words[-1]}:*"])
        matched = text(f"{PG_TSVECTOR_COLUMN} @@ to_tsquery('{PG_TS_CONFIG}'::regconfig, :q)").bindparams(q=tsquery)
        return cast(ColumnElement[bool], matched)  # a boolean SQL expression; `text` is typed as any clause
    words = WORD.findall(free_text) or [""]
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
        conditions.append(not_indexed(engine, CaptionRecord.status).in_(list(query.statuses)))
    if query.text:
        conditions.append(_text_condition(engine, query.text))
    if query.zones or query.min_dwell_s is not None:
        conditions.append(_zone_condition(query.zones, query.min_dwell_s))
    return conditions


def _zone_condition(zones: Sequence[str], min_dwell_s: float | None) -> ColumnElement[bool]:
    """Rows with a person in one of `zones` (any zone without), for at least `min_dwell_s`: through the zones'
    side table and its (zone, dwell) index."""
    stays = select(CaptionZoneRecord.caption_id)
    if zones:
        stays = stays.where(CaptionZoneRecord.zone.in_(list(zones)))
    if min_dwell_s is not None:
        stays = stays.where(CaptionZoneRecord.dwell_s >= min_dwell_s)
    return CaptionRecord.id.in_(stays)


def filter_conditions(engine: Engine, query: CaptionFilter) -> list[ColumnElement[bool]]:
    """Every filter of `query` as terms of one statement (no walk, no budget)."""
    return _conditions(engine, query)


def after_position(after: Position | None) -> list[ColumnElement[bool]]:
    """Rows strictly older than `after` (all rows without one)."""
    if after is None:
        return []
    return [
        # The plain term gives the index its range end: the OR alone made SQLite start every page at the top.
        CaptionRecord.captured_at <= after.captured_at,
        or_(
            CaptionRecord.captured_at < after.captured_at,
            and_(CaptionRecord.captured_at == after.captured_at, CaptionRecord.id < after.id),
        ),
    ]


def newer_than(cut: Position | None) -> list[ColumnElement[bool]]:
    """Rows strictly newer than `cut` (all rows without one)."""
    if cut is None:
        return []
    return [
        CaptionRecord.captured_at >= cut.captured_at,  # the index's range start, as in after_position
        or_(
            CaptionRecord.captured_at > cut.captured_at,
            and_(CaptionRecord.captured_at == cut.captured_at, CaptionRecord.id > cut.id),
        ),
    ]


def just_above(cut: Position) -> Position:
    """The cursor whose next page starts at `cut` itself: rows older than it are those at or below `cut`."""
    return Position(cut.captured_at, cut.id + 1)


def walk_conditions(query: CaptionFilter) -> list[ColumnElement[bool]]:
    """The terms an index walks in newest-first order: one camera (its own index) and the time range.

    Every other term is checked row by row on that walk, which is what a scan budget has to bound.
    """
    conditions: list[ColumnElement[bool]] = []
    if len(query.cameras) == 1:
        conditions.append(CaptionRecord.camera == query.cameras[0])
    if query.since is not None:
        conditions.append(CaptionRecord.captured_at >= query.since)
    if query.until is not None:
        conditions.append(CaptionRecord.captured_at < query.until)
    return conditions


def row_checks(engine: Engine, query: CaptionFilter) -> list[ColumnElement[bool]]:
    """The terms no index orders by, checked on each row a walk meets; empty: a page reads only its own rows."""
    conditions: list[ColumnElement[bool]] = []
    if query.min_people:  # 0 holds for every row
        conditions.append(CaptionRecord.people_count >= query.min_people)
    if query.statuses:
        conditions.append(not_indexed(engine, CaptionRecord.status).in_(list(query.statuses)))
    if query.text:
        conditions.append(_text_condition(engine, query.text))
    if query.zones or query.min_dwell_s is not None:
        conditions.append(_zone_condition(query.zones, query.min_dwell_s))
    return conditions


def camera_check(engine: Engine, query: CaptionFilter) -> list[ColumnElement[bool]]:
    """Several cameras as a check on a walk of the capture-time index.

    Alone, several cameras are served by the camera index (SQLite stops each camera's part of the walk once the
    page is full); on a walk with a budget to count, the cameras are checked on the one walk instead.
    """
    if len(query.cameras) < 2:
        return []
    return [not_indexed(engine, CaptionRecord.camera).in_(list(query.cameras))]


def nth(conn: Connection, conditions: Sequence[ColumnElement[bool]], n: int) -> Position | None:
    """Where a newest-first walk of the rows meeting `conditions` is after `n` rows: the first row it has not
    examined; None when fewer rows remain. Reads the index alone (capture time and id are in it)."""
    statement = select(CaptionRecord.captured_at, CaptionRecord.id).where(*conditions)
    found = conn.execute(statement.order_by(*_NEWEST_FIRST).offset(n).limit(1)).first()
    return Position(found.captured_at, found.id) if found is not None else None


def _bounded_walk(
    conn: Connection,
    walk: Sequence[ColumnElement[bool]],
    checks: Sequence[ColumnElement[bool]],
    size: int,
    scan_rows: int,
) -> tuple[list[CaptionRow], Position | None]:
    """The first `size` rows of the walk that meet `checks`, examining at most `scan_rows` rows of it.

    The walk is cut off where it would be after `scan_rows` rows (`nth`, from the index alone: 0.4 ms for
    20,000 rows), and the page query is confined to rows above the cut, so a filter that matches little costs
    the window, not the table. Returns the rows and, when the page did not fill above it, the cut: the first row
    not examined, where the next page starts.
    """
    cut = nth(conn, walk, scan_rows)
    statement = select(*CAPTION_COLUMNS).where(*walk, *checks, *newer_than(cut))
    rows = list(conn.execute(statement.order_by(*_NEWEST_FIRST).limit(size)))
    return rows, cut if len(rows) < size else None


# The full-text matches _sqlite_text_page ranks at most before it walks a window instead.
_FTS_BATCH = 256
# A window of the walk whose ids span more than this many times its rows is narrowed (_sqlite_text_window).
_FTS_SPAN = 2
_FTS_FIRST_WINDOW = 1024


def _sqlite_settled(
    conn: Connection, walk: Sequence[ColumnElement[bool]], floor: datetime, below: int, scan_rows: int
) -> bool:
    """Whether every row the walk meets down to `floor` (capture time) has been read from the full-text index
    (id >= below), looking at `scan_rows` rows of the walk at most (False beyond: not known)."""
    walked = select(CaptionRecord.id).where(*walk, CaptionRecord.captured_at >= floor)
    newest = walked.order_by(*_NEWEST_FIRST).limit(scan_rows).subquery()
    lowest, count = conn.execute(select(func.min(newest.c.id), func.count()).select_from(newest)).one()
    return bool(count < scan_rows and (lowest is None or lowest >= below))


def _sqlite_text_page(
    engine: Engine,
    conn: Connection,
    query: CaptionFilter,
    match: str,
    size: int,
    after: Position | None,
    scan_rows: int,
) -> tuple[list[CaptionRow], Position | None]:
    """The first `size` rows of a text search newest first, and where the search stopped when the page is partial.

    `id IN (SELECT rowid ... MATCH)` makes SQLite collect every match and fetch each row to sort by capture time
    (seconds for a word in a third of a million captions). FTS5 instead hands out matches lazily by rowid,
    newest rowid first, and rowids follow capture time closely (rows are written as frames are selected). So a
    batch of the newest matches is ranked by (captured_at, id); the page is final when the batch held every
    match, or when its `size`-th best is known to be final: no row older by rowid than the batch (`id < below`)
    is newer than it. That check walks the capture-time index above the `size`-th best row only, which is short
    exactly when the batch was enough. Otherwise (a filter that rejects most matches, rowids out of capture-time
    order) the page comes from a bounded window of the walk (`_sqlite_text_window`).
    """
    others = [*_conditions(engine, replace(query, text=None)), *after_position(after)]
    walk = [*walk_conditions(query), *after_position(after)]
    batch = min(_FTS_BATCH, max(1, scan_rows // 4))
    # One statement: the newest matches' rowids, each with its capture time when the row passes the other filters
    # (a left join), so the batch's oldest rowid is known without binding the batch back as a list.
    newest_matches = text(
        "SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match ORDER BY rowid DESC LIMIT :batch"
    )
    matches = newest_matches.bindparams(match=match, batch=batch).columns(rowid=Integer).subquery("matches")
    ranked = select(matches.c.rowid, CaptionRecord.captured_at).select_from(
        matches.outerjoin(CaptionRecord, and_(CaptionRecord.id == matches.c.rowid, *others))
    )
    found = conn.execute(ranked).all()
    best = sorted(((at, row_id) for row_id, at in found if at is not None), reverse=True)[:size]
    if len(found) == batch and not (
        len(best) == size and _sqlite_settled(conn, walk, best[-1][0], min(row_id for row_id, _ in found), scan_rows)
    ):
        # No match of the batch passed the filters: a short first window would find as little.
        first = _FTS_FIRST_WINDOW if best else scan_rows
        return _sqlite_text_window(engine, conn, query, match, size, after, scan_rows, first)
    if not best:
        return [], None
    statement = select(*CAPTION_COLUMNS).where(CaptionRecord.id.in_([row_id for _, row_id in best]))
    return list(conn.execute(statement.order_by(*_NEWEST_FIRST))), None


def _sqlite_text_window(
    engine: Engine,
    conn: Connection,
    query: CaptionFilter,
    match: str,
    size: int,
    after: Position | None,
    scan_rows: int,
    first: int,
) -> tuple[list[CaptionRow], Position | None]:
    """A text search as a bounded walk: windows of the walk, each checked against the full-text matches whose
    rowids lie between the window's lowest and highest id; `scan_rows` rows in all, `first` in the first one.

    While ids follow capture time (also with a re-run of old video interleaved) those matches are at most about
    as many as the window's rows. A window whose ids spread wider, with more matches among them, is narrowed
    until that holds, down to a single row, so every request moves on. A first short window fills the page of a
    common word without reading the matches of the whole budget.
    """
    base = walk_conditions(query)
    checks = [*row_checks(engine, replace(query, text=None)), *camera_check(engine, query)]
    first = min(first, scan_rows)
    rows: list[CaptionRow] = []
    cut: Position | None = None
    for budget in (first, scan_rows - first):
        if budget <= 0:
            break
        walk = [*base, *after_position(after)]
        window = budget
        while True:
            cut = nth(conn, walk, window)
            # The ids of the window's capture-time range, ends included: a few rows more at the ends only widen
            # the matches read, and the plain range is read from the index without checking each row's position.
            ends = [*base, *([CaptionRecord.captured_at <= after.captured_at] if after else [])]
            ends += [CaptionRecord.captured_at >= cut.captured_at] if cut else []
            ids = select(func.min(CaptionRecord.id), func.max(CaptionRecord.id)).where(*ends)
            lowest, highest = conn.execute(ids).one()
            if lowest is None:
                return rows, None  # nothing left to walk
            if window == 1 or highest - lowest < _FTS_SPAN * window:
                break
            # Ids spread wide (rows written out of capture-time order): fine still if the word is rare there.
            in_range = text(
                "SELECT count(*) FROM (SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match "
                "AND rowid BETWEEN :lowest AND :highest LIMIT :cap)"
            ).bindparams(match=match, lowest=lowest, highest=highest, cap=_FTS_SPAN * window + 1)
            if conn.scalar(in_range) <= _FTS_SPAN * window:
                break
            window = max(1, window // 8)
        in_window = text(
            "SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match AND rowid BETWEEN :lowest AND :highest"
        ).bindparams(match=match, lowest=lowest, highest=highest)
        matching = CaptionRecord.id.in_(in_window.columns(rowid=CaptionRecord.id.type))
        statement = select(*CAPTION_COLUMNS).where(*walk, *checks, matching, *newer_than(cut))
        rows += conn.execute(statement.order_by(*_NEWEST_FIRST).limit(size - len(rows)))
        if len(rows) >= size or cut is None:
            return rows, None
        after = just_above(cut)
    return rows, cut


def _pg_text_matches(conn: Connection, engine: Engine, query: CaptionFilter, after: Position | None) -> float:
    """The planner's estimate of the rows the text (within the walked range) matches: what reading them all
    from the GIN index would cost."""
    assert query.text is not None
    statement = select(CaptionRecord.id).where(
        *walk_conditions(query), _text_condition(engine, query.text), *after_position(after)
    )
    plan = conn.execute(_Explain(statement)).scalar_one()
    return float(plan[0]["Plan"]["Plan Rows"])


class _Explain(Executable, ClauseElement):
    """`EXPLAIN (FORMAT JSON)` of a statement, with its parameters bound as when it runs."""

    inherit_cache = False

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement


@compiles(_Explain, "postgresql")
def _explain_postgresql(element: _Explain, compiler: SQLCompiler, **kw: Any) -> str:
    return "EXPLAIN (FORMAT JSON) " + compiler.process(element.statement, **kw)


class SearchTimeout(Exception):
    """The database stopped a search at its time limit."""


@dataclass(frozen=True, slots=True)
class SearchLimits:
    """What one search may cost the database."""

    scan_rows: int = DEFAULT_SCAN_ROWS  # rows a newest-first walk (or the full-text ranking) examines at most
    timeout_s: float | None = None  # PostgreSQL: each statement; SQLite: the whole search


@contextmanager
def limited(engine: Engine, timeout_s: float | None) -> Iterator[Connection]:
    """A connection whose statements the database stops after `timeout_s`; SearchTimeout when it does."""
    with engine.connect() as conn:
        if timeout_s is None:
            yield conn
            return
        if engine.dialect.name == "postgresql":
            # Local to the transaction, which ends with the connection: the pool's next user gets the default.
            milliseconds = str(max(1, round(timeout_s * 1000)))
            conn.execute(text("SELECT set_config('statement_timeout', :ms, true)").bindparams(ms=milliseconds))
            try:
                yield conn
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) == _PG_QUERY_CANCELED:
                    raise SearchTimeout(f"stopped after {timeout_s:g} s") from exc
                raise
            return
        if engine.dialect.name != "sqlite":
            yield conn
            return
        raw = conn.connection.driver_connection
        deadline = time.monotonic() + timeout_s
        stopped = False

        def progress() -> int:
            nonlocal stopped
            stopped = time.monotonic() >= deadline
            return int(stopped)

        raw.set_progress_handler(progress, _SQLITE_PROGRESS_STEPS)  # type: ignore[union-attr]
        try:
            yield conn
        except OperationalError as exc:
            if stopped:
                raise SearchTimeout(f"stopped after {timeout_s:g} s") from exc
            raise
        finally:
            raw.set_progress_handler(None, 0)  # type: ignore[union-attr]


def search_captions(
    engine: Engine,
    query: CaptionFilter,
    limit: int,
    after: Position | None = None,
    limits: SearchLimits = SearchLimits(),
) -> tuple[list[CaptionRow], Position | None]:
    """Up to `limit` rows, newest first (capture time, then id), after `after`; and the next page's position.

    Bounded whatever the filters and the table's size. Terms an index walks in order (one camera, the time range)
    read only the page's rows. Other terms (people, status, text with them; several cameras with them) are
    checked row by row on a newest-first walk that examines at most `limits.scan_rows` rows; when that budget
    runs out before the page is full, the page is partial (fewer than `limit` rows, possibly none) and the
    position returned is just above the first row not examined, so the next page carries on from there.

    Text is served by the full-text index where it can be. SQLite: the newest FTS5 matches are ranked
    (`_sqlite_text_page`), else a bounded window is walked. PostgreSQL: the tsvector is a stored column (schema
    step 7) with statistics, so for text alone the planner either walks the capture-time index checking each
    row's stored tsvector, or reads the few matches from the GIN index and sorts them (0.1-2 ms on a million
    rows). With other terms the GIN index is left to the planner only while it expects at most `scan_rows`
    matches; more go to the bounded walk.

    Raises SearchTimeout when the database stopped a statement at `limits.timeout_s`.
    """
    size = limit + 1
    cut: Position | None = None
    with limited(engine, limits.timeout_s) as conn:
        if query.text and engine.dialect.name == "sqlite":
            match = fts5_query(query.text)
            if match is None:
                return [], None  # no words: nothing matches
            rows, cut = _sqlite_text_page(engine, conn, query, match, size, after, limits.scan_rows)
        else:
            checks = row_checks(engine, query)
            served = not checks or (
                query.text is not None
                and (len(checks) == 1 or _pg_text_matches(conn, engine, query, after) <= limits.scan_rows)
            )
            if served:
                statement = select(*CAPTION_COLUMNS).where(*_conditions(engine, query), *after_position(after))
                rows = list(conn.execute(statement.order_by(*_NEWEST_FIRST).limit(size)))
            else:
                walk = [*walk_conditions(query), *after_position(after)]
                checks += camera_check(engine, query)
                rows, cut = _bounded_walk(conn, walk, checks, size, limits.scan_rows)
    if len(rows) > limit:
        rows = rows[:limit]
        return rows, Position(rows[-1].captured_at, rows[-1].id)
    return rows, just_above(cut) if cut is not None else None


def not_indexed(engine: Engine, column: QueryableAttribute[Any] | ColumnElement[Any]) -> ColumnElement[Any]:
    """`column` as SQLite must not pick an index for (a unary +); as is elsewhere.

    Without statistics SQLite prefers any equality to a range or an ORDER BY index: for `status` (nine rows in ten
    are captioned) that meant reading most of the table and sorting it.
    """
    if engine.dialect.name != "sqlite":
        return column.expression if isinstance(column, QueryableAttribute) else column
    return literal_column(f"+captions.{column.key}", column.type)


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
            not_indexed(engine, CaptionRecord.status) == CaptionStatus.CAPTIONED.value,
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


def status_counts(engine: Engine) -> dict[CaptionStatus, int]:
    """Rows by status over all cameras (from the trigger-kept counts)."""
    counts = CaptionCountRecord.__table__
    query = select(counts.c.status, func.sum(counts.c.row_count)).group_by(counts.c.status)
    with engine.connect() as conn:
        return {status: int(total) for status, total in conn.execute(query) if total}
