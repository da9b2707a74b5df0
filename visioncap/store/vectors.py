"""Caption vectors: written after the caption, off the frame path, by a background embedder or `visioncap embed`.

The caption writer (the pipeline) never waits for a vector: it stores rows as before, and the embedder finds
captioned rows without a vector (`caption_vectors`, schema step 11) in id order, in batches of `batch_size`,
encodes them and inserts their vectors in one short transaction per batch. It runs in the API process: that
process loads the model anyway to embed search text, and the pipeline's CPU belongs to decoding and detection.
Several API processes on one database each embed the same rows (an insert that finds the vector already there
does nothing): wasted work, never a wrong vector.

How far it lags: a batch of 64 short captions takes ~0.1-0.3 s on one CPU core, so it keeps up with hundreds of
captions a second; after a pause it picks up at most `poll_s` later. A backlog (a database from before the step,
a restart after a long outage) drains at that rate; `visioncap embed` drains it in the foreground.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, TextClause, bindparam, text
from sqlalchemy.exc import SQLAlchemyError

from visioncap.store.changes import StreamStart, changes_after, past_seen, stream_start
from visioncap.store.embeddings import DIMENSIONS, TextEmbedder
from visioncap.store.records import CaptionStatus
from visioncap.store.schema import VECTORS_TABLE, vector_clock
from visioncap.store.vector_index import index_for

log = logging.getLogger(__name__)

DEFAULT_BATCH = 64
# How often an embedder with nothing to do asks the index whether it should be rebuilt (rows deleted).
MAINTAIN_S = 60.0

# Ids one look spans at most: the look is an anti-join of the captions against the vectors, and over a whole
# table of 10M rows it took 6-7 s on PostgreSQL, during which the change walk (new captions) waited; a span of
# 100,000 ids takes tens of milliseconds, and the walk of a large table goes on span after span.
WALK_SPAN = 100_000

_MISSING = text(
    f"SELECT c.id, c.caption FROM captions c WHERE c.id > :after AND c.id <= :upto AND c.status = :captioned "
    f"AND c.caption IS NOT NULL AND NOT EXISTS (SELECT 1 FROM {VECTORS_TABLE} v WHERE v.caption_id = c.id) "
    "ORDER BY c.id LIMIT :batch"
)

_HIGHEST = text("SELECT max(id) FROM captions")


def _insert(dialect: str) -> TextClause:
    """Only while the caption is still the one encoded: a caption changed meanwhile gets its vector on a later
    pass. Stamped with the database's clock, by which the index finds vectors written below its highest id."""
    return text(
        f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding, written_at) SELECT id, :embedding, "
        f"{vector_clock(dialect)} FROM captions WHERE id = :id AND caption = :caption "
        "ON CONFLICT (caption_id) DO NOTHING"
    )


@dataclass(frozen=True, slots=True)
class Batch:
    """What one pass of the embedder did."""

    embedded: int  # vectors written
    last_id: int  # the highest caption id looked at (the next pass starts above it)
    full: bool  # the batch was full, or ids above the span looked at remain: more rows may be waiting


def embed_batch(
    engine: Engine, embedder: TextEmbedder, after: int = 0, batch_size: int = DEFAULT_BATCH, span: int = WALK_SPAN
) -> Batch:
    """Vectors for up to `batch_size` captioned rows that have none, among ids above `after` and at most `span`
    past it."""
    with engine.connect() as conn:
        highest = int(conn.scalar(_HIGHEST) or 0)
        upto = min(highest, after + span)
        bounds = {"after": after, "upto": upto, "captioned": CaptionStatus.CAPTIONED.value, "batch": batch_size}
        rows = conn.execute(_MISSING, bounds).all()
    if not rows:
        # Every row of the span has its vector: the next pass starts past it, and past the highest id once there.
        # Staying put re-read the table each poll to find nothing (6.4 s of the server's CPU at 10M rows on
        # PostgreSQL, every 2 s). A row below that id captioned after this look is the change walk's
        # (BackgroundEmbedder).
        return Batch(0, max(after, upto), upto < highest)
    written = _write_vectors(engine, embedder, [(row_id, caption) for row_id, caption in rows])
    return Batch(written, rows[-1][0], len(rows) == batch_size or upto < highest)


def _write_vectors(engine: Engine, embedder: TextEmbedder, rows: Sequence[tuple[int, str]]) -> int:
    """Embed `rows` (id, caption) and insert their vectors in one transaction; how many were written (a row another
    embedder wrote meanwhile is left as it is)."""
    vectors = embedder.encode([caption for _, caption in rows])
    insert = _insert(engine.dialect.name)
    written = 0
    with engine.begin() as conn:
        for (row_id, caption), vector in zip(rows, vectors, strict=True):
            written += conn.execute(insert, {"id": row_id, "caption": caption, "embedding": vector.tobytes()}).rowcount
    return written


def embed_rows(engine: Engine, embedder: TextEmbedder, rows: Sequence[tuple[int, str]]) -> int:
    """Vectors for those of `rows` (id, caption) that have none; how many were written."""
    if not rows:
        return 0
    with engine.connect() as conn:
        have = set(
            conn.scalars(
                text(f"SELECT caption_id FROM {VECTORS_TABLE} WHERE caption_id IN :ids").bindparams(
                    bindparam("ids", expanding=True)
                ),
                {"ids": [row_id for row_id, _ in rows]},
            )
        )
    missing = [(row_id, caption) for row_id, caption in rows if row_id not in have]
    return _write_vectors(engine, embedder, missing) if missing else 0


def backfill(engine: Engine, embedder: TextEmbedder, batch_size: int = DEFAULT_BATCH) -> int:
    """Vectors for every captioned row that has none; returns how many were written. Safe to run again."""
    after, total = 0, 0
    while True:
        batch = embed_batch(engine, embedder, after, batch_size)
        total += batch.embedded
        if not batch.full:
            return total
        after = batch.last_id


def vector_method(engine: Engine) -> str:
    """How semantic search ranks exactly on this database (for /readyz; the index's candidates and filters that
    keep few rows)."""
    if engine.dialect.name == "sqlite":
        return f"exact: sqlite-vec vec_distance_cosine ({DIMENSIONS} dims)"
    with engine.connect() as conn:
        pgvector = conn.scalar(text("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"))
    found = "pgvector is installed but not used yet" if pgvector else "pgvector is not installed"
    return f"exact: cosine in numpy ({found})"


class BackgroundEmbedder:
    """A daemon thread that keeps `caption_vectors` up to date; `stop` at shutdown.

    Two walks: by id from the lowest (every captioned row without a vector when it starts, then the new ones), and
    the captions' change positions from its start (visioncap/store/changes.py: commit order, nothing missed), which
    find a row captioned after newer ones (an outbox retry once the VLM is back) or captioned again (regenerate)
    within a poll, whatever its id."""

    def __init__(
        self,
        engine: Engine,
        embedder: TextEmbedder,
        batch_size: int = DEFAULT_BATCH,
        poll_s: float = 2.0,
        maintain_s: float = MAINTAIN_S,
    ) -> None:
        self.engine = engine
        self.embedder = embedder
        self.batch_size = batch_size
        self.poll_s = poll_s
        self.maintain_s = maintain_s
        self.embedded = 0
        self.behind = True  # until a pass finds no full batch
        self._passes = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="caption-embedder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def wait_embedded(self, count: int, timeout_s: float) -> bool:
        """Whether `count` vectors in all were written within `timeout_s` (for tests and shutdown checks)."""
        with self._passes:
            return self._passes.wait_for(lambda: self.embedded >= count, timeout_s)

    def _run(self) -> None:
        after, idle_s = 0, 0.0
        changes: StreamStart | None = None
        while not self._stop.is_set():
            try:
                if changes is None:  # before the first id walk: what changes from here on is the change walk's
                    changes = stream_start(self.engine)
                batch = embed_batch(self.engine, self.embedder, after, self.batch_size)
                page = changes_after(self.engine, changes.position, limit=self.batch_size, seen=changes.seen)
                changed = embed_rows(self.engine, self.embedder, [(r.id, r.caption) for r in page.rows if r.caption])
                changes = StreamStart(page.position, past_seen(page.position, changes.seen))
            except SQLAlchemyError as exc:  # the database away: try again at the next poll
                log.warning("embedder: %s", exc)
                self._stop.wait(self.poll_s)
                continue
            except Exception:  # a model that cannot load: log once per poll, never take the API down
                log.exception("embedder: batch failed")
                self._stop.wait(self.poll_s)
                continue
            with self._passes:
                self.embedded += batch.embedded + changed
                self.behind = batch.full or page.more
                self._passes.notify_all()
            after = batch.last_id
            if batch.full or page.more:
                continue
            self._stop.wait(self.poll_s)
            idle_s += self.poll_s
            if idle_s >= self.maintain_s:
                idle_s = 0.0
                try:  # rows deleted since the index was built: rebuilt when many
                    index_for(self.engine, start=False).maintain()
                except SQLAlchemyError as exc:
                    log.warning("vector index: %s", exc)
