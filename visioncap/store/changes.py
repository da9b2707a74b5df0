"""The live stream's read side: captioned rows in the order they were stored or last changed, after a position.

Schema step 9 stamps every insert and update of a caption row, in the writer's transaction, with a change
position `(change_xid, change_seq)`. On SQLite `change_xid` is 0 and `change_seq` a counter bumped under the
database's single write lock, so positions are in commit order. On PostgreSQL `change_seq` comes from a sequence
(handed out at the write, not the commit) and `change_xid` is the writer's transaction id; a reader takes only
rows whose transaction is older than its snapshot's xmin. Every such transaction has ended, and every one still
running or yet to start has an id at or above that xmin, so no row can later appear at or before a position a
reader has passed: a keyset walk on the position misses nothing and repeats nothing.

Two consequences on PostgreSQL: a write transaction left open anywhere in the cluster (idle in transaction, a
prepared transaction) holds every stream back until it ends (`idle_in_transaction_session_timeout` bounds it);
and transaction ids belong to one cluster: rows copied into another cluster by dump and restore keep ids that
cluster may not have reached, and streams would send them all as new once it does. `UPDATE captions SET
change_xid = 0` once after such a restore (the trigger stamps each row anew in the new cluster's terms) puts them
right; each new stream logs a warning until then. pg_upgrade keeps the ids and needs nothing.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import BigInteger, ColumnElement, Connection, Engine, Row, literal, literal_column, select, text, tuple_

from visioncap.store.records import CaptionRecord, CaptionStatus
from visioncap.store.schema import CHANGE_SEQ_COLUMN, CHANGE_XID_COLUMN, SQLITE_CHANGE_COUNTER
from visioncap.store.search import DRAWING_ONLY, not_indexed

log = logging.getLogger(__name__)

# Rows one page hands back (what a stream holds in memory at a time), and rows of the position index one call
# walks at most: a filter that matches few rows (one quiet camera among busy ones) still moves the position on
# by this many changes per call instead of walking everything since the client's position each time.
PAGE_ROWS = 100
SCAN_ROWS = 5000

CAPTION_COLUMNS = tuple(column for column in CaptionRecord.__table__.c if column.name not in DRAWING_ONLY)
_XID = literal_column(CHANGE_XID_COLUMN, BigInteger)
_SEQ = literal_column(CHANGE_SEQ_COLUMN, BigInteger)
# Transactions below it have all ended (PostgreSQL); evaluated once per statement, from the statement's snapshot.
_PG_XMIN = literal_column("pg_snapshot_xmin(pg_current_snapshot())::text::bigint", BigInteger)
# Rows whose transaction a stream's start snapshot already saw committed.
_PG_NOT_SEEN = text(f"NOT pg_visible_in_snapshot({CHANGE_XID_COLUMN}::text::xid8, CAST(:seen AS pg_snapshot))")
_MAX_BIGINT = 2**63 - 1
_TOKEN = re.compile(r"(\d{1,19})\.(\d{1,19})")

ChangeRow = Row[Any]  # the columns of `captions` (less the frame geometry) plus change_xid and change_seq


@dataclass(frozen=True, slots=True, order=True)
class ChangePosition:
    """A place in the order of changes: every change at or before it is behind a reader that holds it."""

    xid: int
    seq: int

    def token(self) -> str:
        """The SSE event id: opaque to clients, parsed back by `parse`."""
        return f"{self.xid}.{self.seq}"

    @classmethod
    def parse(cls, token: str) -> ChangePosition:
        """Raises ValueError for anything `token()` cannot have made."""
        match = _TOKEN.fullmatch(token)
        if match is None:
            raise ValueError("not a stream position")
        xid, seq = int(match[1]), int(match[2])
        if xid > _MAX_BIGINT or seq > _MAX_BIGINT:
            raise ValueError("not a stream position")
        return cls(xid, seq)

    @classmethod
    def of(cls, row: ChangeRow) -> ChangePosition:
        return cls(row.change_xid, row.change_seq)


@dataclass(frozen=True, slots=True)
class StreamStart:
    """Where a new stream starts.

    `seen` (PostgreSQL): the snapshot taken at the start, as text. Rows of transactions that were running then
    are after the start, so the position sits at the snapshot's xmin; rows of transactions at or above the xmin
    that had already committed are visible in `seen` and are skipped as before the start.
    """

    position: ChangePosition
    seen: str | None = None


@dataclass(frozen=True, slots=True)
class ChangePage:
    """Rows after a position, and where the next call starts: after the last row when the page is full, else
    after every change looked at (matching the filter or not)."""

    rows: list[ChangeRow]
    position: ChangePosition
    more: bool  # call again at once: the page or the walk stopped at its bound


def stream_start(engine: Engine) -> StreamStart:
    """The position of now: rows committed from here on are after it."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            xmin, xmax, snapshot, newest = conn.execute(
                text(
                    "SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint, s::text, "
                    f"(SELECT max({CHANGE_XID_COLUMN}) FROM captions) FROM (SELECT pg_current_snapshot() AS s) AS now"
                )
            ).one()
            if newest is not None and newest >= xmax:
                log.warning(
                    "captions carry transaction ids up to %d, beyond this cluster's %d (restored from another "
                    "cluster?): streams will send those rows as new once the ids are reached; run UPDATE captions "
                    "SET change_xid = 0 once",
                    newest,
                    xmax,
                )
            # No transaction running: nothing at or above xmin is visible, no row to skip.
            return StreamStart(ChangePosition(xmin, 0), snapshot if xmin < xmax else None)
        return StreamStart(ChangePosition(0, _sqlite_counter(conn)))


def is_reachable(engine: Engine, position: ChangePosition) -> bool:
    """Whether this database can have handed out `position`: one from another database (or one restored from a
    backup) may lie ahead of everything written here, and a stream resumed there would skip new rows."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            xmax = conn.scalar(text("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"))
            # A start position sits at a snapshot's xmin, which is at most its xmax: the next id to be handed out.
            return position.xid <= int(xmax)
        return position.xid == 0 and position.seq <= _sqlite_counter(conn)


def _sqlite_counter(conn: Connection) -> int:
    return int(conn.scalar(text(f"SELECT seq FROM {SQLITE_CHANGE_COUNTER} WHERE id = 1")) or 0)


def _bound(position: ChangePosition) -> ColumnElement[Any]:
    # BIGINT: transaction ids pass 2**31 on a busy cluster, and a plain int would be bound as INTEGER.
    return tuple_(literal(position.xid, BigInteger), literal(position.seq, BigInteger))


def _walk_end(conn: Connection, after: ChangePosition, scan: int) -> tuple[ChangePosition, int] | None:
    """The position of the `scan`-th final change after `after` (or of the last one), and how many were walked."""
    walk = select(_XID.label("x"), _SEQ.label("s")).select_from(CaptionRecord.__table__)
    walk = walk.where(tuple_(_XID, _SEQ) > _bound(after))
    if conn.dialect.name == "postgresql":
        walk = walk.where(_XID < _PG_XMIN)
    window = walk.order_by(_XID, _SEQ).limit(scan).subquery()
    last = select(window.c.x, window.c.s, literal_column("count(*) OVER ()").label("n")).order_by(
        window.c.x.desc(), window.c.s.desc()
    )
    found = conn.execute(last.limit(1)).first()
    return None if found is None else (ChangePosition(found.x, found.s), int(found.n))


def changes_after(
    engine: Engine,
    after: ChangePosition,
    cameras: Sequence[str] = (),
    min_people: int | None = None,
    limit: int = PAGE_ROWS,
    scan: int = SCAN_ROWS,
    seen: str | None = None,
) -> ChangePage:
    """Captioned rows (of `cameras`, with at least `min_people`) changed after `after`, in change order.

    Two statements, each from its own snapshot: the first fixes the end of this call's walk among changes that are
    final (none can appear at or before it any more), the second reads the matching rows up to that end. A row
    changed again in between has left the range for a later position, where it is read then.
    """
    with engine.connect() as conn:
        walked = _walk_end(conn, after, scan)
        if walked is None:
            return ChangePage([], after, more=False)
        end, count = walked
        query = (
            select(*CAPTION_COLUMNS, _XID, _SEQ)
            .where(tuple_(_XID, _SEQ) > _bound(after), tuple_(_XID, _SEQ) <= _bound(end))
            .where(not_indexed(conn.engine, CaptionRecord.status) == CaptionStatus.CAPTIONED.value)
        )
        if cameras:
            query = query.where(not_indexed(conn.engine, CaptionRecord.camera).in_(list(cameras)))
        if min_people is not None:
            query = query.where(CaptionRecord.people_count >= min_people)
        if seen is not None and conn.dialect.name == "postgresql":
            query = query.where(_PG_NOT_SEEN.bindparams(seen=seen))
        rows = cast(list[ChangeRow], list(conn.execute(query.order_by(_XID, _SEQ).limit(limit))))
    if len(rows) == limit:
        return ChangePage(rows, ChangePosition.of(rows[-1]), more=True)
    return ChangePage(rows, end, more=count == scan)


def past_seen(position: ChangePosition, seen: str | None) -> str | None:
    """`seen`, or None once `position` is past every transaction it could skip (its xmax): the check is dropped."""
    if seen is None:
        return None
    xmax = int(seen.split(":")[1])
    return None if position.xid >= xmax else seen
