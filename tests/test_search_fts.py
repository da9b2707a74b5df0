"""Text search pages (store/search.py): on SQLite the newest full-text matches are read in batches by rowid, on
PostgreSQL the planner chooses between the capture-time index and the GIN index of the stored tsvector. The pages
must equal the plain newest-first answer however far row ids stray from capture-time order (late writers,
re-runs over old video), across pages, with other filters, and when the matches are many or few."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from helpers import database_at_version
from pg import fresh_database
from sqlalchemy import Engine, insert, select, text

from visioncap.store import create_db_engine
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import (
    PG_TSVECTOR,
    PG_TSVECTOR_COLUMN,
    SCHEMA_VERSION,
    ensure_schema,
    schema_version,
)
from visioncap.store.search import CaptionFilter, Position, search_captions

T0 = datetime(2026, 10, 1, tzinfo=UTC)
WORDS = ["walking", "standing", "courier", "forklift", "umbrella", "loading", "dock", "gate", "red", "jacket"]
ROWS = 2000


def seed(engine: Engine, disorder: str) -> list[dict[str, object]]:
    """Rows whose capture times are in id order ('none'), a little off ('jitter': writers that commit a few
    rows late), or not at all ('shuffled': e.g. a re-run over an old video)."""
    rng = random.Random(11)
    times = [T0 + timedelta(seconds=10 * n) for n in range(ROWS)]
    if disorder == "jitter":
        times = [t + timedelta(seconds=rng.uniform(-120, 120)) for t in times]
    elif disorder == "shuffled":
        rng.shuffle(times)
    rows = []
    for number, captured_at in enumerate(times):
        # "walking" in about half the rows, "umbrella" in 1 of 100, "forklift" in 1 of 1000.
        words = [rng.choice(WORDS[1:4]), rng.choice(WORDS[5:])]
        if rng.random() < 0.5:
            words.append("walking")
        if rng.random() < 0.01:
            words.append("umbrella")
        if rng.random() < 0.001:
            words.append("forklift")
        rows.append(
            {
                "pipeline": "p",
                "camera": f"cam-{number % 3}",
                "source": "s",
                "frame_index": number,
                "offset_s": 0.0,
                "captured_at": captured_at,
                "reason": "new-event",
                "event_key": "",
                "people": [],
                "people_count": number % 4,
                "image_width": 1,
                "image_height": 1,
                "status": "captioned",
                "caption": " ".join(words),
                "model": "m",
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), rows)
    return rows


def pages(engine: Engine, query: CaptionFilter, limit: int) -> list[list[int]]:
    out: list[list[int]] = []
    after: Position | None = None
    while True:
        rows, after = search_captions(engine, query, limit, after)
        out.append([row.id for row in rows])
        if after is None:
            return out


def expected_pages(engine: Engine, query: CaptionFilter, limit: int) -> list[list[int]]:
    """The same pages from a LIKE scan in Python: no full-text index involved."""
    columns = (CaptionRecord.id, CaptionRecord.captured_at, CaptionRecord.caption, CaptionRecord.camera)
    with engine.connect() as conn:
        rows = conn.execute(select(*columns, CaptionRecord.people_count)).all()
    words = (query.text or "").split()
    chosen = []
    for row_id, captured_at, caption, camera, people in rows:
        tokens = caption.split()
        if not all(word in tokens for word in words[:-1]) or not any(t.startswith(words[-1]) for t in tokens):
            continue
        if query.cameras and camera not in query.cameras:
            continue
        if query.min_people is not None and people < query.min_people:
            continue
        if query.since is not None and captured_at < query.since:
            continue
        if query.until is not None and captured_at >= query.until:
            continue
        chosen.append((captured_at, row_id))
    ordered = [row_id for _, row_id in sorted(chosen, reverse=True)]
    return [ordered[i : i + limit] for i in range(0, len(ordered), limit)] or [[]]


@pytest.mark.parametrize(
    ("backend", "disorder"),
    [("sqlite", "none"), ("sqlite", "jitter"), ("sqlite", "shuffled"), ("postgresql", "shuffled")],
)
def test_text_pages_match_plain_order(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str, disorder: str
) -> None:
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'c.db'}"
    else:
        url = fresh_database(request.getfixturevalue("postgres"))
    engine = create_db_engine(url)
    ensure_schema(engine)
    seed(engine, disorder)
    middle = T0 + timedelta(seconds=10 * ROWS // 2)
    queries = [
        CaptionFilter(text="walking"),  # half the rows: many batches of matches to rank
        CaptionFilter(text="walk"),  # a prefix
        CaptionFilter(text="umbrella"),  # 1 in 100
        CaptionFilter(text="forklift"),  # a handful: all read in the first batch
        CaptionFilter(text="red walking"),
        CaptionFilter(text="walking", cameras=["cam-1"], min_people=2),
        CaptionFilter(text="walking", until=middle),
        CaptionFilter(text="umbrella", since=middle),
        CaptionFilter(text="nothing-matches"),
    ]
    for query in queries:
        assert pages(engine, query, 25) == expected_pages(engine, query, 25), (disorder, query)


@pytest.mark.postgres
def test_postgresql_database_from_before_the_stored_tsvector_is_migrated(request: pytest.FixtureRequest) -> None:
    url = fresh_database(request.getfixturevalue("postgres"))
    engine = create_db_engine(url)
    # Version 6: full-text search through the expression index only, rows already written.
    database_at_version(engine, 6)
    seed(engine, "none")
    assert schema_version(engine) == 6

    # The pipeline and the API start together: both migrate, one waits for the other (adding a column twice
    # would fail).
    with ThreadPoolExecutor(2) as pool:
        versions = list(pool.map(lambda _: ensure_schema(create_db_engine(url)), range(2)))
    assert versions == [SCHEMA_VERSION, SCHEMA_VERSION] and schema_version(engine) == SCHEMA_VERSION
    with engine.connect() as conn:
        indexes = set(conn.scalars(text("SELECT indexname FROM pg_indexes WHERE tablename = 'captions'")))
        filled = conn.scalar(text(f"SELECT count(*) FROM captions WHERE {PG_TSVECTOR_COLUMN} = {PG_TSVECTOR}"))
    assert "ix_captions_caption_tsv" in indexes and "ix_captions_caption_fts" not in indexes
    assert filled == ROWS  # rows written before the column existed have their tsvector
    query = CaptionFilter(text="umbrella")
    assert pages(engine, query, 25) == expected_pages(engine, query, 25)
