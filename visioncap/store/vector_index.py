"""The vector index: a first pass over every caption vector, so that search by meaning covers the whole archive.

Each vector is kept in memory as its 384 sign bits (48 bytes; 48 MB at a million rows) beside the row's camera,
capture time, people count and status. A search masks the rows its filters keep (exactly: every filter of a
semantic search is one of those columns), takes the `k` rows nearest by Hamming distance of the bits (at most
`per_code` of them sharing one code, so that copies of one caption cannot fill every slot), and the caller re-ranks
those candidates exactly (cosine of the float vectors, read from `caption_vectors` with every
filter checked again in SQL). A mask that keeps few rows needs no first pass: the caller ranks all of them exactly.

From LISTS_MIN_ROWS rows (2M) the build also makes inverted lists: spherical k-means on a sample of the vectors
(LISTS = 256 centroids), each row's list the centroid nearest its vector, and the columns ordered by list, so that
a list is a slice. A search then reads the rows its filters keep in the lists whose centroids are nearest the query,
enough of them to hold PROBE_SHARE (4 %) of the rows kept and PROBE_ROWS_PER_CANDIDATE rows per candidate asked
for, plus every row appended since the build and every row whose vector changed since (its list is its old
vector's); the caller's candidates grow (x4) until the page fills, and with them the lists read. At 10M rows the
whole scan is 120 ms, the lists' share of it a few (benchmarks/results/search_quality-10m-postgres.md); a stale
share of rows outside the lists (new or changed since) makes `maintain` rebuild.

Why not sqlite-vec's `vec0`: its k-NN is a brute-force scan whose cost grows with k as well as with the rows
(measured here at 200,000 rows: bit[384] 40 ms at k = 50, 120 ms at k = 200, 630 ms at k = 1000; float[384]
300-450 ms at any k), and it exists on SQLite only. One index in the process serves both databases; PostgreSQL has
no pgvector package here.

Kept fresh from the table: every search first reads the vectors written above the highest id it holds (an index
range read; nothing when none are new), and those written below it since its last look (by `written_at`, the
database's clock, with LATE_OVERLAP_S of overlap for writers that commit late): a caption captioned after newer
ones (an outbox retry once the VLM is back) or captioned again (regenerate) is searchable as soon as its vector
is committed, its entry replaced in place. Rows deleted (retention) stay as candidates that the exact pass drops
until the next rebuild (`maintain`, which the background embedder calls when idle, rebuilds when the table and
the index differ by more than a few percent). The first build runs in a thread of its own; until it is done searches
rank the bounded window they always did (`ready` is False, /readyz says so). A rebuild reads into a state of its own
while searches go on with the state searched (kept fresh as always); what was written while it read is read into
it before it is swapped in, so searches wait only for that catch-up, not for the whole read (212 s at 10M rows).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import Engine, bindparam, text
from sqlalchemy.exc import SQLAlchemyError

from visioncap.store.binary_rows import binary_rows, postgres_vectors
from visioncap.store.embeddings import DIMENSIONS
from visioncap.store.records import CaptionStatus
from visioncap.store.schema import VECTORS_TABLE

log = logging.getLogger(__name__)

_BYTES = DIMENSIONS // 8
_LOAD_BATCH = 20_000
# Rebuilt when this share of the index is gone from the table (retention) or missing from it.
_STALE_SHARE = 0.05
# Rows of room at least, at creation and past a build: a small index would otherwise double its columns at the
# first few captions it takes (5 % of a few hundred rows is a handful).
_MIN_ROOM = 1024
# Inverted lists from this many rows: below it the first pass reads every row kept (15 ms at a million), above it
# the rows of the lists whose centroids are nearest the query (120 ms at 10M read whole, measured).
LISTS_MIN_ROWS = 2_000_000
# Lists: few and big, so that a caption's neighbours mostly share its list, and cheap to assign at the build
# (a row's list is the nearest of these centroids: 256 x 384 multiply-adds a row).
LISTS = 256
_TRAIN_ROWS_PER_LIST = 64  # k-means on a sample of this many rows a list
_KMEANS_ROUNDS = 8
_TRAIN_ROWS_MIN_PER_LIST = 8  # fewer found in the sample (ids very sparse): no lists
_SAMPLE_DRAWS_MAX = 2_000_000  # ids drawn for the sample at most (a table at 1 % density yields 20,000 rows)
# A search reads at least this share of the rows its filters keep, and at least this many rows per candidate
# asked for, from its nearest lists (then rows written since the build and rows changed since, whole).
PROBE_SHARE = 0.04
PROBE_ROWS_PER_CANDIDATE = 256
_STATUSES = {status: code for code, status in enumerate(CaptionStatus)}

# `c.id >` too: without it PostgreSQL merge-joins each batch against the captions from the first id up (1.4 s a
# batch at 5M rows: a 10M-row build ran for minutes, its cost growing with the square of the rows).
_NEW_VECTORS_SQL = (
    f"SELECT v.caption_id, c.camera, c.captured_at, c.people_count, c.status, v.embedding, v.written_at "
    f"FROM {VECTORS_TABLE} v JOIN captions c ON c.id = v.caption_id WHERE v.caption_id > {{after}} "
    "AND c.id > {after} ORDER BY v.caption_id LIMIT {batch}"
)
_NEW_VECTORS = text(_NEW_VECTORS_SQL.format(after=":after", batch=":batch"))
# PostgreSQL: the same in binary format (store/binary_rows.py), psycopg's placeholders.
_NEW_VECTORS_PG = _NEW_VECTORS_SQL.format(after="%(after)s", batch="%(batch)s")
# Vectors written below the highest id held, since a moment: their ids and write times first (few, and mostly
# already read), the rows of those not read yet after.
_LATE_WRITES = text(
    f"SELECT caption_id, written_at FROM {VECTORS_TABLE} WHERE written_at >= :since AND caption_id <= :max_id"
)
_LATE_VECTORS = text(
    f"SELECT v.caption_id, c.camera, c.captured_at, c.people_count, c.status, v.embedding, v.written_at "
    f"FROM {VECTORS_TABLE} v JOIN captions c ON c.id = v.caption_id WHERE v.caption_id IN :ids"
).bindparams(bindparam("ids", expanding=True))
_LAST_WRITE = text(f"SELECT max(written_at) FROM {VECTORS_TABLE}")
_ID_RANGE = text(f"SELECT count(*), min(caption_id), max(caption_id) FROM {VECTORS_TABLE}")
_SAMPLE = text(f"SELECT caption_id, embedding FROM {VECTORS_TABLE} WHERE caption_id IN :ids").bindparams(
    bindparam("ids", expanding=True)
)
# How far before the latest write time seen the next look starts: a writer's transaction that stamped its rows
# and committed up to this much later is still read. Its cost: the ids and times of this many seconds of writes
# (one index range) on each refresh.
LATE_OVERLAP_S = 60.0
# The remembered (id, written_at) are pruned to the overlap once there are this many.
_SEEN_PRUNE = 4096


def _micros(moment: datetime | str) -> int:
    """Capture time as integer microseconds since the epoch (naive times are UTC, as the store writes them)."""
    if isinstance(moment, str):  # raw SQLite text
        moment = datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        return int((moment - datetime(1970, 1, 1)).total_seconds() * 1_000_000)
    return int(moment.timestamp() * 1_000_000)


def bits_of(vectors: np.ndarray) -> np.ndarray:
    """Sign bits of each row of `vectors` (n, DIMENSIONS), packed: (n, DIMENSIONS // 8) uint8."""
    return np.packbits(vectors > 0, axis=1)


@dataclass(frozen=True, slots=True)
class IndexFilter:
    """The filters the mask applies: those of a semantic search, and the top of its ranking (the cursor's)."""

    cameras: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None
    min_people: int | None = None
    statuses: Sequence[CaptionStatus] = ()
    top: tuple[datetime, int] | None = None  # rows at or below this (captured_at, id)


@dataclass(slots=True)
class _Lists:
    """Inverted lists over the rows held at the build: list c is the rows at positions starts[c]:starts[c + 1]
    (the build orders the columns by list, then by code, then by id). Rows appended since (positions from
    `covered`) and rows whose vector changed since (`moved`: a list is its old vector's) are read whole by every
    search until the next build."""

    centroids: np.ndarray  # (LISTS, DIMENSIONS) float32, unit length
    starts: np.ndarray  # (LISTS + 1,) int64
    # Each covered row's run: the rows of one list with one code (identical bits) are contiguous and share a
    # number, so a search keeps the first few copies of a code with one linear pass, before any sort. A moved row
    # gets a number of its own (its bits are no longer its run's).
    runs: np.ndarray  # (covered,) int32
    covered: int
    moved: set[int]

    def stale(self, size: int) -> bool:
        return (size - self.covered) + len(self.moved) > _STALE_SHARE * max(self.covered, 1)


def train_centroids(sample: np.ndarray, lists: int, rng: np.random.Generator) -> np.ndarray:
    """Spherical k-means: `lists` unit centroids of the sample's rows (a list left empty restarts at a random row)."""
    unit = sample / np.maximum(np.linalg.norm(sample, axis=1, keepdims=True), 1e-12)
    centroids = unit[rng.choice(len(unit), lists, replace=len(unit) < lists)].copy()
    for _ in range(_KMEANS_ROUNDS):
        labels = np.argmax(unit @ centroids.T, axis=1)
        sums = np.zeros_like(centroids)
        np.add.at(sums, labels, unit)
        empty = np.bincount(labels, minlength=lists) == 0
        sums[empty] = unit[rng.choice(len(unit), int(empty.sum()))]
        centroids = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    trained: np.ndarray = centroids.astype(np.float32)
    return trained


def nearest_lists(centroids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each vector's list: the centroid of greatest inner product."""
    labels: np.ndarray = np.argmax(vectors @ centroids.T, axis=1).astype(np.int16)
    return labels


class _Columns:
    """Growable arrays (doubling), so that appending a few new rows does not copy the index."""

    def __init__(self, capacity: int = _MIN_ROOM) -> None:
        self.size = 0
        # The newest row held by (capture time in microseconds, id), the order of a first page: a search whose top
        # is at or past it keeps every row without comparing 10M times. Only ever raised (a row captioned again
        # with an earlier time leaves it above the newest row): a bound that is too high costs a mask, never a row.
        self.latest = (-(2**63), 0)
        self.ids = np.zeros(capacity, np.int64)
        self.bits = np.zeros((capacity, _BYTES), np.uint8)
        self.cameras = np.zeros(capacity, np.int32)
        self.times = np.zeros(capacity, np.int64)
        self.people = np.zeros(capacity, np.int32)
        self.statuses = np.zeros(capacity, np.int8)

    def append(self, ids: np.ndarray, bits: np.ndarray, cameras: np.ndarray, times: np.ndarray,
               people: np.ndarray, statuses: np.ndarray) -> None:  # fmt: skip
        end = self.size + len(ids)
        if end > len(self.ids):
            capacity = max(end, 2 * len(self.ids))
            for name in _COLUMN_NAMES:
                old = getattr(self, name)
                grown = np.zeros((capacity, *old.shape[1:]), old.dtype)
                grown[: self.size] = old[: self.size]
                setattr(self, name, grown)
        self.ids[self.size : end] = ids
        self.bits[self.size : end] = bits
        self.cameras[self.size : end] = cameras
        self.times[self.size : end] = times
        self.people[self.size : end] = people
        self.statuses[self.size : end] = statuses
        self.size = end
        self.note_latest(times, ids)

    def note_latest(self, times: np.ndarray, ids: np.ndarray) -> None:
        if len(times):
            at = int(np.max(times))
            self.latest = max(self.latest, (at, int(np.max(ids[times == at]))))

    def reorder(self, order: np.ndarray) -> None:
        """The rows put in `order` (positions of every row), a column at a time, so that a build at 10M rows holds
        one column twice at most rather than the whole index (730 MB). Room is left for the rows the index takes
        before the lists go stale and it is built again: at capacity, the first new caption doubled every column
        (770 MB more at 10M rows)."""
        capacity = len(order) + int(_STALE_SHARE * len(order)) + _MIN_ROOM
        for name in _COLUMN_NAMES:
            old = getattr(self, name)
            ordered = np.zeros((capacity, *old.shape[1:]), old.dtype)
            np.take(old, order, axis=0, out=ordered[: len(order)], mode="clip")  # unbuffered: order is valid
            setattr(self, name, ordered)


_COLUMN_NAMES = ("ids", "bits", "cameras", "times", "people", "statuses")


@dataclass(slots=True)
class _Loaded:
    """What one build read and what was read into it since: searched whole, swapped whole by the next build."""

    columns: _Columns
    lists: _Lists | None = None  # from LISTS_MIN_ROWS rows at the build
    codes: dict[str, int] = field(default_factory=dict)  # camera -> the code its rows hold
    max_id: int = 0  # the highest id read
    # The latest `written_at` read (None: no vector carries one yet), and the (id, written_at) read within
    # LATE_OVERLAP_S of it, so that the overlap is not read twice.
    written: float | None = None
    seen: dict[int, float] = field(default_factory=dict)


class VectorIndex:
    """The in-memory first pass over every vector of one database; thread-safe. Get it with `index_for`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()  # the state searched (its arrays and camera codes), and its swap
        self._loading = threading.Lock()  # one reader of new vectors into the state searched at a time
        self._building = threading.Lock()  # one build at a time
        self._state = _Loaded(_Columns())
        # The last mask made, kept for the next call with the same filters over the same rows: a search counts the
        # rows its filters keep, then asks for the nearest of them (and again with more candidates), each a pass
        # over 10M rows' columns (20-40 ms) when made afresh. Bumped by each change in place.
        self._masked: tuple[Any, np.ndarray, np.ndarray | None] | None = None
        self._changes = 0
        self._ready = threading.Event()
        self.built_s: float | None = None  # how long the last full build took
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def holding(cls, columns: _Columns, lists: _Lists | None, codes: dict[str, int]) -> VectorIndex:
        """An index of these columns that never reads a table: for measuring and testing the first pass."""
        index = cls(None)  # type: ignore[arg-type]  # never reads a table
        index._state = _Loaded(columns, lists, dict(codes))
        return index

    # -- state -------------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def size(self) -> int:
        return self._state.columns.size

    @property
    def lists(self) -> int:
        """Inverted lists held (0: none; every search scans the rows its filters keep)."""
        held = self._state.lists
        return 0 if held is None else len(held.centroids)

    def nbytes(self) -> int:
        """Memory the arrays hold (their capacity)."""
        state = self._state
        columns, lists = state.columns, state.lists
        extra = 0 if lists is None else int(lists.centroids.nbytes + lists.starts.nbytes + lists.runs.nbytes)
        return extra + sum(int(getattr(columns, name).nbytes) for name in _COLUMN_NAMES)

    def describe(self) -> str:
        """One line for /readyz."""
        if not self.ready:
            state = f"building ({self.error})" if self.error else "building"
            return f"vector index {state}: until it is ready, the newest rows under the filters are ranked exactly"
        lists = f" in {self.lists} lists" if self.lists else ""
        return (
            f"vector index over {self.size} vectors (sign bits{lists}, {self.nbytes() // 1_000_000} MB in memory, "
            f"built in {self.built_s or 0:.1f} s), candidates re-ranked exactly; filters keeping few rows ranked "
            "exactly"
        )

    def start(self) -> None:
        """Build in a thread of its own (once)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._build, name="vector-index", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float) -> bool:
        self.start()
        return self._ready.wait(timeout_s)

    def _build(self) -> None:
        while True:
            try:
                self.rebuild()
                return
            except SQLAlchemyError as exc:  # the database away (or not migrated yet): try again shortly
                self.error = type(exc).__name__
                log.warning("vector index: build failed, retrying: %s", exc)
                time.sleep(5.0)

    # -- loading -----------------------------------------------------------------------------------

    def rebuild(self) -> None:
        """Every vector of the table, read afresh into a state of its own, then swapped in whole: searches
        meanwhile use the state searched and keep it fresh; they wait only for the rows written while the build
        read (a catch-up under the lock refreshes take), not for the whole read (minutes at 10M rows)."""
        started = time.monotonic()
        with self._building:
            with self.engine.connect() as conn:
                written = conn.scalar(_LAST_WRITE)  # before the rows: what is written meanwhile is read after
                count, low, high = conn.execute(_ID_RANGE).one()
                centroids = self._centroids(conn, count, low, high) if (count or 0) >= LISTS_MIN_ROWS else None
            # Camera codes of its own, as its rows take them: copying the state searched's would race a refresh
            # that adds a camera to them in place, and a state's codes need only match its own columns.
            state = _Loaded(_Columns())
            state.written = None if written is None else float(written)
            labels: list[np.ndarray] = []
            state.max_id = self._read(state, state.columns, state.codes, 0, centroids, labels)
            if centroids is not None and state.columns.size:
                state.columns, state.lists = group(state.columns, centroids, np.concatenate(labels))
            with self._loading:
                self._catch_up(state)
                with self._lock:
                    self._state = state
                    self._masked = None
        self.built_s = time.monotonic() - started
        self.error = None
        self._ready.set()

    def _centroids(self, conn: Any, count: int, low: int, high: int) -> np.ndarray | None:
        """Centroids trained on the vectors of ids drawn at random between the lowest and the highest, or None
        (no lists) when too few are found. Retention leaves gaps in the ids: as many are drawn as the ids' density
        says the sample needs, so a table of sparse ids still yields one."""
        rng = np.random.default_rng(high)
        wanted = LISTS * _TRAIN_ROWS_PER_LIST
        span = high - low + 1
        draws = min(span, _SAMPLE_DRAWS_MAX, math.ceil(1.25 * wanted * span / max(count, 1)))
        drawn = np.unique(rng.integers(low, high + 1, draws)).tolist()
        found = [blob for _, blob in _vectors_of(conn, drawn)][:wanted]
        if len(found) < LISTS * _TRAIN_ROWS_MIN_PER_LIST:
            log.warning("vector index: %d vectors sampled for %d lists: no lists", len(found), LISTS)
            return None
        sample = np.frombuffer(b"".join(bytes(blob) for blob in found), np.float32).reshape(len(found), DIMENSIONS)
        return train_centroids(sample, LISTS, rng)

    def refresh(self) -> None:
        """The vectors written since the last read: above the highest id held, and below it (captioned late or
        again) since the last write time seen."""
        if not self.ready:
            return
        with self._loading:
            self._catch_up(self._state)

    def _catch_up(self, state: _Loaded) -> None:
        """Reads into `state` what was written since its last read (under `_loading`; the arrays change under
        `_lock`, as searches may be reading them)."""
        codes = dict(state.codes)
        late = self._read_late(state)
        added = _Columns(16)
        max_id = self._read(state, added, codes, state.max_id)
        if not late and added.size == 0:
            return
        with self._lock:
            state.codes = codes
            if late:
                self._replace(state, late)
            if added.size:
                state.columns.append(
                    added.ids[: added.size],
                    added.bits[: added.size],
                    added.cameras[: added.size],
                    added.times[: added.size],
                    added.people[: added.size],
                    added.statuses[: added.size],
                )
                state.max_id = max_id

    def maintain(self) -> bool:
        """Rebuild when the table and the index differ by more than a few percent; whether it did."""
        if not self.ready:
            return False
        with self.engine.connect() as conn:
            stored = int(conn.scalar(text(f"SELECT count(*) FROM {VECTORS_TABLE}")) or 0)
        lists = self._state.lists
        lists_stale = lists is not None and lists.stale(self.size)
        grown_into_lists = lists is None and self.size >= LISTS_MIN_ROWS
        if abs(self.size - stored) <= max(100, _STALE_SHARE * max(stored, 1)) and not (lists_stale or grown_into_lists):
            return False
        self.rebuild()
        return True

    def _read(
        self,
        state: _Loaded,
        columns: _Columns,
        codes: dict[str, int],
        after: int,
        centroids: np.ndarray | None = None,
        labels: list[np.ndarray] | None = None,
    ) -> int:
        """The vectors above id `after` appended to `columns` (`state`'s write-time cursor moved on by them);
        with `centroids`, each row's list into `labels`."""
        with self.engine.connect() as conn:
            while True:
                bounds = {"after": after, "batch": _LOAD_BATCH}
                rows: Sequence[Any] = (
                    binary_rows(conn, _NEW_VECTORS_PG, bounds)
                    if conn.dialect.name == "postgresql"
                    else conn.execute(_NEW_VECTORS, bounds).all()
                )
                if not rows:
                    return after
                vectors = _append_rows(columns, codes, rows)
                if centroids is not None and labels is not None:
                    labels.append(nearest_lists(centroids, vectors))
                self._note_written(state, rows)
                after = int(rows[-1][0])
                if len(rows) < _LOAD_BATCH:
                    return after

    @staticmethod
    def _note_written(state: _Loaded, rows: Sequence[Any]) -> None:
        """Moves `state`'s write-time cursor on by `rows` (written_at last) and remembers those within the overlap."""
        stamps = [float(row[6]) for row in rows if row[6] is not None]
        if not stamps:
            return
        state.written = max(stamps) if state.written is None else max(state.written, max(stamps))
        since = state.written - LATE_OVERLAP_S
        state.seen.update((int(row[0]), float(row[6])) for row in rows if row[6] is not None and row[6] >= since)
        if len(state.seen) > _SEEN_PRUNE:
            state.seen = {row_id: at for row_id, at in state.seen.items() if at >= since}

    def _read_late(self, state: _Loaded) -> list[Any]:
        """The vectors written below `state`'s highest id since its last look, not yet read into it."""
        if state.max_id == 0:
            return []
        since = -np.inf if state.written is None else state.written - LATE_OVERLAP_S
        with self.engine.connect() as conn:
            writes = conn.execute(_LATE_WRITES, {"since": since, "max_id": state.max_id}).all()
            fresh = [int(row_id) for row_id, at in writes if state.seen.get(int(row_id)) != float(at)]
            if not fresh:
                return []
            rows = list(conn.execute(_LATE_VECTORS, {"ids": fresh}).all())
        self._note_written(state, rows)
        return rows

    def _replace(self, state: _Loaded, rows: Sequence[Any]) -> None:
        """Each row's entry in `state` replaced in place (captioned again), or added (captioned late); under the
        lock. One pass over the ids finds those already held, however many rows come late at once (an outage's
        backlog)."""
        columns = state.columns
        self._changes += 1
        added = _Columns(max(1, len(rows)))
        _append_rows(added, state.codes, rows)
        held = columns.ids[: columns.size]
        places = {int(held[at]): at for at in np.flatnonzero(np.isin(held, added.ids[: added.size]))}
        fresh = []
        for n in range(added.size):
            at = places.get(int(added.ids[n]))
            if at is None:
                fresh.append(n)
                continue
            columns.bits[at], columns.cameras[at] = added.bits[n], added.cameras[n]
            columns.times[at], columns.people[at] = added.times[n], added.people[n]
            columns.note_latest(added.times[n : n + 1], added.ids[n : n + 1])
            columns.statuses[at] = added.statuses[n]
            if state.lists is not None and at < state.lists.covered:
                state.lists.moved.add(int(at))  # its list is its old vector's
                state.lists.runs[at] = -1 - at  # and its run no longer its code's
        if fresh:
            picks = np.asarray(fresh)
            columns.append(
                added.ids[picks], added.bits[picks], added.cameras[picks],
                added.times[picks], added.people[picks], added.statuses[picks],
            )  # fmt: skip

    # -- searching ---------------------------------------------------------------------------------

    def _keeps_every_row(self, columns: _Columns, where: IndexFilter) -> bool:
        """Whether the filters keep every row held, known without a pass over the rows: no filter but the top, and
        the top at or past the latest row (a first page's top is the newest row)."""
        if where.cameras or where.since or where.until or where.min_people or where.statuses:
            return False
        if where.top is None:
            return True
        return columns.latest <= (_micros(where.top[0]), where.top[1])

    def _mask(self, columns: _Columns, where: IndexFilter) -> np.ndarray:
        """The rows `where` keeps (under the lock), made once for a run of calls with the same filters."""
        key = (
            columns, columns.size, self._changes, tuple(where.cameras), where.since, where.until, where.min_people,
            tuple(where.statuses), where.top,
        )  # fmt: skip
        if self._masked is None or self._masked[0] != key:
            self._masked = (key, self._new_mask(columns, where), None)
        return self._masked[1]

    def _masked_rows(self, columns: _Columns, where: IndexFilter) -> tuple[np.ndarray, np.ndarray | None]:
        """The mask and, with lists, the rows it keeps in each list: counted on the first search that probes the
        lists, not for `count` (which an exact search's scope stops at)."""
        mask = self._mask(columns, where)
        assert self._masked is not None  # `_mask` just made it
        key, _, kept = self._masked
        lists = self._state.lists
        if kept is None and lists is not None:
            kept = _kept_per_list(lists, mask)
            self._masked = (key, mask, kept)
        return mask, kept

    def _new_mask(self, columns: _Columns, where: IndexFilter) -> np.ndarray:
        size = columns.size
        mask = np.ones(size, bool)
        if where.cameras:
            held = self._state.codes
            codes = [held[camera] for camera in where.cameras if camera in held]
            # One camera (the usual filter): a compare, 4x faster than isin over 10M codes.
            mask &= (columns.cameras[:size] == codes[0]) if len(codes) == 1 else np.isin(columns.cameras[:size], codes)
        times = columns.times[:size]
        if where.since is not None:
            mask &= times >= _micros(where.since)
        if where.until is not None:
            mask &= times < _micros(where.until)
        if where.min_people:
            mask &= columns.people[:size] >= where.min_people
        if where.statuses:
            wanted = np.asarray([_STATUSES[CaptionStatus(status)] for status in where.statuses], np.int8)
            mask &= np.isin(columns.statuses[:size], wanted)
        if where.top is not None:
            at, top_id = _micros(where.top[0]), where.top[1]
            mask &= (times < at) | ((times == at) & (columns.ids[:size] <= top_id))
        return mask

    def matching(self, where: IndexFilter) -> np.ndarray:
        """The ids of every row the filters keep (id order)."""
        with self._lock:
            columns = self._state.columns
            ids: np.ndarray = columns.ids[: columns.size][self._mask(columns, where)].copy()
            return ids

    def count(self, where: IndexFilter) -> int:
        with self._lock:
            columns = self._state.columns
            if self._keeps_every_row(columns, where):
                return columns.size
            return int(np.count_nonzero(self._mask(columns, where)))

    def nearest(
        self, vector: np.ndarray, where: IndexFilter, k: int, per_code: int | None = None
    ) -> tuple[np.ndarray, bool]:
        """The ids of the `k` rows the filters keep whose bits are nearest `vector`'s (nearest first), and whether
        that is every row they keep.

        `per_code`: at most that many of the `k` share one code (identical bits). A camera that writes the same
        words again and again fills its archive with copies of one code; without the cap they filled every
        candidate slot, and a caption nearer by cosine but a bit farther by Hamming never reached the exact
        re-rank (recall@10 against exact 0.81 at 100,000 rows that repeat 320 captions)."""
        query = _words(bits_of(vector.reshape(1, -1)))[0]
        with self._lock:
            columns, lists = self._state.columns, self._state.lists
            size = columns.size
            # Every row kept: no mask at all (each pass over 10M rows' columns costs milliseconds).
            mask, kept = (None, None) if self._keeps_every_row(columns, where) else self._masked_rows(columns, where)
            # Views where no mask applies, not a copy of the whole index (48 MB at a million rows), joined outside
            # the lock. Rows past `size` may be appended meanwhile; these views never reach them, and a rebuild or
            # a reorder makes new arrays.
            if lists is not None:
                ids_parts, bits_parts, probed_all = _probe(columns, lists, mask, kept, vector, k, per_code)
            elif mask is None:
                ids_parts, bits_parts, probed_all = [columns.ids[:size]], [columns.bits[:size]], True
            else:
                ids_parts, bits_parts, probed_all = [columns.ids[:size][mask]], [columns.bits[:size][mask]], True
        ids, bits = _joined(ids_parts, bits_parts)
        chosen, every = self._nearest_of(ids, _words(bits), query, k, per_code)
        return chosen, every and probed_all

    @staticmethod
    def _nearest_of(
        ids: np.ndarray, bits: np.ndarray, query: np.ndarray, k: int, per_code: int | None
    ) -> tuple[np.ndarray, bool]:
        distances = _distances(bits, query)
        if len(ids) <= k and per_code is None:
            return ids[np.argsort(distances, kind="stable")], True
        if per_code is None or per_code >= k:
            nearest = np.argpartition(distances, k - 1)[:k]
            return ids[nearest[np.argsort(distances[nearest], kind="stable")]], False
        chosen, every = _nearest_per_code(distances, bits, k, per_code)
        return ids[chosen], every


def group(columns: _Columns, centroids: np.ndarray, labels: np.ndarray) -> tuple[_Columns, _Lists]:
    """The columns ordered by list, then by code (then by position: id order), and the lists over them."""
    size = columns.size
    keys = _code_keys(_words(columns.bits[:size]))
    order = np.lexsort((keys, labels[:size]))
    labels, keys = labels[:size][order], keys[order]
    starts = np.searchsorted(labels, np.arange(len(centroids) + 1)).astype(np.int64)
    new_run = np.ones(size, bool)
    new_run[1:] = (labels[1:] != labels[:-1]) | (keys[1:] != keys[:-1])
    runs = (np.cumsum(new_run, dtype=np.int64) - 1).astype(np.int32)
    columns.reorder(order)
    return columns, _Lists(centroids, starts, runs, size, set())


def _kept_per_list(lists: _Lists, mask: np.ndarray) -> np.ndarray:
    """How many of each list's rows `mask` keeps: a count over each list's slice (np.add.reduceat over the bool
    mask widened it to 10M int64s first: 30-50 ms, against a few here)."""
    covered = min(lists.covered, len(mask))
    starts = np.minimum(lists.starts, covered)
    return np.fromiter(
        (np.count_nonzero(mask[starts[c] : starts[c + 1]]) for c in range(len(starts) - 1)), np.int64, len(starts) - 1
    )


def _probe(
    columns: _Columns,
    lists: _Lists,
    mask: np.ndarray | None,
    kept_per_list: np.ndarray | None,
    vector: np.ndarray,
    k: int,
    per_code: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray], bool]:
    """The ids and bits (in parts, for `_joined`) of the rows `mask` keeps in the lists nearest `vector` (enough
    lists to hold PROBE_SHARE of the rows kept and PROBE_ROWS_PER_CANDIDATE per candidate), with every row appended
    or changed since the build; and whether that is every row kept. Lists are contiguous: slices, not a gather.
    `per_code`: of each run (one code in one list) only its first that many rows kept, which the nearest's own cap
    would choose among them anyway (copies are equally near; it takes them in position order)."""
    covered = lists.covered
    if mask is None or kept_per_list is None:
        kept_per_list = np.diff(lists.starts)
    order = np.argsort(-(lists.centroids @ vector), kind="stable")
    need = max(PROBE_SHARE * float(kept_per_list.sum()), float(PROBE_ROWS_PER_CANDIDATE * k))
    reach = int(np.searchsorted(np.cumsum(kept_per_list[order]), need)) + 1
    chosen = np.sort(order[:reach])
    spans = [(int(lists.starts[c]), int(lists.starts[c + 1])) for c in chosen if kept_per_list[c]]
    every = reach >= len(order)
    if per_code is not None and spans:
        ids, bits, capped = _first_of_runs(columns, lists, mask, spans, per_code)
        parts_ids, parts_bits, every = [ids], [bits], every and not capped
        spans = []
    else:
        parts_ids, parts_bits = [], []
    spans.append((covered, columns.size))
    moved = np.fromiter(lists.moved, np.int64, len(lists.moved))
    # A moved row in a probed list is read with it: once.
    moved = moved[~np.isin(np.searchsorted(lists.starts, moved, side="right") - 1, chosen)]
    if mask is None:
        parts_ids += [columns.ids[a:b] for a, b in spans]
        parts_bits += [columns.bits[a:b] for a, b in spans]
    else:
        parts_ids += [columns.ids[a:b][mask[a:b]] for a, b in spans]
        parts_bits += [columns.bits[a:b][mask[a:b]] for a, b in spans]
    if len(moved):
        moved = moved if mask is None else moved[mask[moved]]
        parts_ids.append(columns.ids[moved])
        parts_bits.append(columns.bits[moved])
    return parts_ids, parts_bits, every


def _first_of_runs(
    columns: _Columns, lists: _Lists, mask: np.ndarray | None, spans: list[tuple[int, int]], per_code: int
) -> tuple[np.ndarray, np.ndarray, bool]:
    """The ids and bits of the first `per_code` rows `mask` keeps of each run in `spans`, and whether any were left
    out. Linear: a camera writing the same words fills a list with one code, and the nearest's cap sorted them all
    (60 ms a search at 10M rows of 320 distinct captions)."""
    picks = [np.arange(a, b) if mask is None else a + np.flatnonzero(mask[a:b]) for a, b in spans]
    at = np.concatenate(picks)
    runs = lists.runs[at]
    first = np.ones(len(at), bool)
    first[1:] = runs[1:] != runs[:-1]
    place = np.arange(len(at))
    place -= np.maximum.accumulate(np.where(first, place, 0))
    keep = place < per_code
    at = at[keep]
    return columns.ids[at], columns.bits[at], not bool(keep.all())


def _joined(ids_parts: list[np.ndarray], bits_parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The parts as one array each."""
    if len(ids_parts) == 1:
        return ids_parts[0], np.ascontiguousarray(bits_parts[0])
    return np.concatenate(ids_parts), np.concatenate(bits_parts)


def _vectors_of(conn: Any, ids: list[int]) -> list[Any]:
    """(caption_id, embedding) of those of `ids` that have a vector."""
    if conn.dialect.name == "postgresql":
        return postgres_vectors(conn, ids)
    # Within SQLite's limit on a statement's variables.
    batches = (ids[start : start + 2000] for start in range(0, len(ids), 2000))
    return [row for batch in batches for row in conn.execute(_SAMPLE, {"ids": batch})]


def _words(bits: np.ndarray) -> np.ndarray:
    """Packed bits as 64-bit words where the row length allows: an eighth of the elements to XOR, count and add."""
    if bits.shape[1] % 8 == 0 and bits.flags.c_contiguous:
        return bits.view(np.uint64)
    return bits


# Rows whose bits one pass of `_distances` works on: 3 MB of six-word rows, which stay in the core's cache while
# each of their columns is read in turn.
_DISTANCE_CHUNK = 65_536


def _distances(bits: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Hamming distance of each row of `bits` to `query`, a column at a time within chunks of rows: numpy
    broadcasts a short last axis and sums along it slowly, and a column of the whole array is read from memory
    once per column (at a million rows of six words, measured: 54 ms whole, 35 ms by columns, 9 ms by columns
    within chunks of 65,536 rows)."""
    distances = np.empty(len(bits), np.uint16)
    for start in range(0, len(bits), _DISTANCE_CHUNK):
        chunk = bits[start : start + _DISTANCE_CHUNK]
        part = distances[start : start + len(chunk)]
        np.copyto(part, np.bitwise_count(chunk[:, 0] ^ query[0]), casting="unsafe")
        for column in range(1, chunk.shape[1]):
            part += np.bitwise_count(chunk[:, column] ^ query[column])
    return distances


def _code_keys(bits: np.ndarray) -> np.ndarray:
    """One 64-bit key per row, equal for equal bits (a multiplicative hash of the words): one-dimensional, so the
    rows of one code are found by a plain sort (np.unique over whole rows sorts them as records: 25x slower). Two
    codes sharing a key only share the cap."""
    keys = bits[:, 0].astype(np.uint64)
    for column in range(1, bits.shape[1]):
        keys = keys * np.uint64(0x9E3779B97F4A7C15) ^ bits[:, column].astype(np.uint64)
    return keys


def _nearest_per_code(distances: np.ndarray, bits: np.ndarray, k: int, per_code: int) -> tuple[np.ndarray, bool]:
    """Positions of the `k` nearest rows, nearest first, with at most `per_code` of any one code; and whether that
    is every row (then fewer than `k` may come back). The cap is applied to a pool of the nearest rows that grows
    (x4) until it yields `k` or holds every row; the pool is every row within a distance, found from a histogram
    of the distances (small integers), so that growing it costs one pass, not a partition of the whole array."""
    rows = len(distances)
    within = np.cumsum(np.bincount(distances, minlength=1))  # rows at or within each distance
    pool_size = min(rows, 4 * k)
    while True:
        reach = int(np.searchsorted(within, pool_size))  # the least distance with pool_size rows within it
        pool = np.flatnonzero(distances <= reach)
        pool = pool[np.argsort(distances[pool], kind="stable")]
        _, code = np.unique(_code_keys(bits[pool]), return_inverse=True)
        # Each row's place among the rows of its code, nearest first.
        by_code = np.argsort(code, kind="stable")
        starts = np.flatnonzero(np.r_[True, np.diff(code[by_code]) != 0])
        place = np.empty(len(pool), np.int64)
        place[by_code] = np.arange(len(pool)) - np.repeat(starts, np.diff(np.r_[starts, len(pool)]))
        kept = pool[place < per_code]
        whole = len(pool) == rows
        if len(kept) >= k or whole:
            return kept[:k], whole and len(kept) == rows and rows <= k
        pool_size = min(rows, pool_size * 4)


def _append_rows(columns: _Columns, codes: dict[str, int], rows: Sequence[tuple]) -> np.ndarray:  # type: ignore[type-arg]
    """The rows appended; their vectors returned."""
    vectors = np.frombuffer(b"".join(bytes(row[5]) for row in rows), np.float32).reshape(len(rows), DIMENSIONS)
    cameras = np.fromiter((codes.setdefault(row[1], len(codes)) for row in rows), np.int32, len(rows))
    columns.append(
        np.fromiter((row[0] for row in rows), np.int64, len(rows)),
        bits_of(vectors),
        cameras,
        np.fromiter((_micros(row[2]) for row in rows), np.int64, len(rows)),
        np.fromiter((row[3] or 0 for row in rows), np.int32, len(rows)),
        np.fromiter((_STATUSES[CaptionStatus(row[4])] for row in rows), np.int8, len(rows)),
    )
    return vectors


_INDEXES: weakref.WeakKeyDictionary[Engine, VectorIndex] = weakref.WeakKeyDictionary()
_INDEXES_LOCK = threading.Lock()


def index_for(engine: Engine, *, start: bool = True) -> VectorIndex:
    """The one index of this engine's database in this process (searches, Ask and the API share it); its build
    starts with the first call."""
    with _INDEXES_LOCK:
        index = _INDEXES.get(engine)
        if index is None:
            index = _INDEXES[engine] = VectorIndex(engine)
    if start:
        index.start()
    return index


def refreshed(engine: Engine) -> VectorIndex | None:
    """The engine's index brought up to date, or None while it is being built (callers rank a window then)."""
    index = index_for(engine)
    if not index.ready:
        return None
    index.refresh()
    return index
