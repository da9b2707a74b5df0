"""Semantic and hybrid search with the real model (all-MiniLM-L6-v2 from its wheel), on real SQLite (sqlean +
sqlite-vec) and real PostgreSQL: quality on the labelled set through the API, filters and cursors, the background
embedder, the backfill, and vectors leaving with their captions."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import ColumnElement, Connection, Engine, Select, func, literal_column, select, text

from visioncap.api import create_app
from visioncap.bench.common.machine import machine_facts
from visioncap.bench.search.quality import (
    GOAL_HYBRID,
    GOAL_MARGIN,
    LATENCY_CASES,
    MODES,
    api_settings,
    latency,
    load_set,
    quality,
    render,
    seed_labelled,
)
from visioncap.config.keys import hash_key
from visioncap.store import create_db_engine
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import PG_TS_CONFIG, PG_TSVECTOR_COLUMN, VECTORS_TABLE
from visioncap.store.search import (
    WORD,
    CaptionFilter,
    SearchLimits,
    camera_check,
    fts5_query,
    row_checks,
    walk_conditions,
)
from visioncap.store.semantic import (
    STOP_WORDS,
    _best_first,
    _similarities,
    _word_scores,
    semantic_search,
)
from visioncap.store.vector_index import IndexFilter, index_for
from visioncap.store.vectors import BackgroundEmbedder, Batch, backfill, embed_batch, embed_rows

# The sentence model costs seconds of PyTorch to load and to embed the labelled set: CI and `make test` run these,
# the fast tier leaves them out (as it does the YOLO runs).
pytestmark = pytest.mark.embedder

READ_KEY = "semantic-read-key"


@pytest.fixture(scope="module")
def embedder() -> TextEmbedder:
    return TextEmbedder()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = create_db_engine(database_url)
    seed_labelled(engine, load_set())
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def labelled_vectors(embedder: TextEmbedder) -> np.ndarray:
    """The labelled captions' vectors, encoded once: tests of the search need them, not the embedding again."""
    return embedder.encode(load_set().captions)


def insert_vectors(engine: Engine, vectors: np.ndarray) -> None:
    with engine.begin() as conn:
        statement = text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)")
        conn.execute(statement, [{"id": n + 1, "embedding": vector.tobytes()} for n, vector in enumerate(vectors)])


def vector_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text(f"SELECT count(*) FROM {VECTORS_TABLE}")) or 0)


def test_recall_at_5_meets_the_goals_through_the_api(tmp_path: Path, embedder: TextEmbedder) -> None:
    means = quality(tmp_path, embedder)["recall_at_5"]
    assert means["hybrid"] >= GOAL_HYBRID, means
    assert means["hybrid"] >= means["words"] + GOAL_MARGIN, means
    assert means["semantic"] > means["words"], means


def test_backfill_embeds_every_captioned_row_once(engine: Engine, embedder: TextEmbedder) -> None:
    assert vector_count(engine) == 0
    assert backfill(engine, embedder, batch_size=64) == 320
    assert vector_count(engine) == 320
    assert backfill(engine, embedder) == 0  # idempotent: nothing left to do
    # Nothing left: the next pass starts past the highest id, not again from the first row.
    assert embed_batch(engine, embedder) == Batch(0, 320, False)
    # A look spans a bounded range of ids, and says when ids remain above it.
    with engine.begin() as conn:
        conn.execute(text(f"DELETE FROM {VECTORS_TABLE} WHERE caption_id = 250"))
    walked = [embed_batch(engine, embedder, after, span=100) for after in (0, 100, 200)]
    assert walked == [Batch(0, 100, True), Batch(0, 200, True), Batch(1, 250, True)]
    assert embed_batch(engine, embedder, 250, span=100) == Batch(0, 320, False)


def all_pages(engine: Engine, embedder: TextEmbedder, query: CaptionFilter, hybrid: bool, limit: int) -> list[int]:
    ids: list[int] = []
    after = None
    while True:
        rows, scores, after = semantic_search(
            engine, embedder, query, "someone dropping off a package", limit, hybrid=hybrid, after=after
        )
        assert scores == sorted(scores, reverse=True)
        ids += [row.id for row in rows]
        if after is None:
            return ids


@pytest.mark.parametrize("hybrid", [False, True])
def test_pages_follow_the_ranking_within_the_filters(
    engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray, hybrid: bool
) -> None:
    insert_vectors(engine, labelled_vectors)
    with engine.connect() as conn:
        times = sorted(conn.scalars(select(CaptionRecord.captured_at)))
    query = CaptionFilter(cameras=["cam-01"], since=times[40], until=times[280])
    whole, _, after = semantic_search(engine, embedder, query, "someone dropping off a package", 500, hybrid=hybrid)
    assert after is None
    with engine.connect() as conn:
        expected = set(
            conn.scalars(
                select(CaptionRecord.id).where(
                    CaptionRecord.camera == "cam-01",
                    CaptionRecord.captured_at >= times[40],
                    CaptionRecord.captured_at < times[280],
                )
            )
        )
    assert {row.id for row in whole} == expected  # every row of the filters, none beside
    paged = all_pages(engine, embedder, query, hybrid, limit=7)
    assert paged == [row.id for row in whole]  # same order, nothing repeated or missed
    relevant = set(dict(load_set().queries)["someone dropping off a package"])
    assert paged[0] in relevant and paged != sorted(paged, reverse=True)  # by meaning, not by time


def full_text_ranking(conn: Connection, window: Select[Any], words: list[str]) -> list[int]:
    """The rows of `window` with every one of `words` (the last also as a prefix), best first: the database's own
    full-text rank (BM25 ascending on SQLite, ts_rank descending on PostgreSQL), then the newer first. A reference
    written apart from the module's (`_word_scores`), so that the oracle is not the code it checks."""
    if not words:
        return []
    ids = list(conn.scalars(window))
    if not ids:
        return []
    if conn.dialect.name == "sqlite":
        matches = text(
            "SELECT rowid FROM captions_fts WHERE captions_fts MATCH :match ORDER BY bm25(captions_fts), rowid DESC"
        ).bindparams(match=fts5_query(" ".join(words)))
        wanted = set(ids)
        return [row_id for row_id in conn.scalars(matches) if row_id in wanted]
    query = func.to_tsquery(literal_column(f"'{PG_TS_CONFIG}'::regconfig"), " & ".join([*words[:-1], f"{words[-1]}:*"]))
    tsvector: ColumnElement[Any] = literal_column(PG_TSVECTOR_COLUMN)
    rank = func.ts_rank(tsvector, query)
    statement = (
        select(CaptionRecord.id)
        .where(CaptionRecord.id.in_(ids), tsvector.op("@@")(query))
        .order_by(rank.desc(), CaptionRecord.id.desc())
    )
    return list(conn.scalars(statement))


def oracle(
    engine: Engine, query: CaptionFilter, search: str, vector: np.ndarray, hybrid: bool, scan_rows: int
) -> list[int]:
    """The ranking by its definition (module docstring of store/semantic.py), computed here in Python: every row
    that meets the filters with a vector (the vector index's, or the window's when it holds them all) by
    similarity, then id, both descending, fused by reciprocal rank with the full-text list of the search text's
    words but stop words among the window's rows (the newest `scan_rows` rows of the walk, those of them that meet
    the other filters). The similarities and the words list are the database's own (`_similarities`, the
    function the PostgreSQL path uses, and `full_text_ranking`): the same floats, so near-ties fall alike."""

    def window(rows: int | None) -> Select[Any]:
        walked = (
            select(CaptionRecord.id)
            .where(*walk_conditions(query))
            .order_by(CaptionRecord.captured_at.desc(), CaptionRecord.id.desc())
            .limit(rows)
        )
        checks = [*row_checks(engine, query), *camera_check(engine, query)]
        return select(CaptionRecord.id).where(CaptionRecord.id.in_(walked), *checks)

    with engine.connect() as conn:
        words = [word for word in WORD.findall(search) if word.lower() not in STOP_WORDS]
        listed = full_text_ranking(conn, window(scan_rows), words)
        every = list(conn.scalars(window(None)))
        similar = _similarities(conn, select(CaptionRecord.id).where(CaptionRecord.id.in_(every)), vector)
    semantic = sorted(similar, key=lambda row_id: (similar[row_id], row_id), reverse=True)
    if not hybrid:
        return semantic
    fused: dict[int, float] = {}
    for ranking in (semantic, listed):
        for rank, row_id in enumerate(ranking, start=1):
            fused[row_id] = fused.get(row_id, 0.0) + 1.0 / (60 + rank)
    return sorted(fused, key=lambda row_id: (fused[row_id], row_id), reverse=True)


@pytest.mark.parametrize("hybrid", [False, True])
def test_pages_are_the_ranking_by_its_definition(
    engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray, hybrid: bool
) -> None:
    # Every fifth row has no vector yet (the embedder is behind): semantic leaves it out, hybrid ranks it by words.
    # Every seventh has its neighbour's vector (a repeated caption, common on a quiet camera): ties, broken by id.
    written = {n + 1: labelled_vectors[n - 1 if n % 7 == 0 else n] for n in range(len(labelled_vectors)) if n % 5}
    with engine.begin() as conn:
        statement = text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)")
        conn.execute(statement, [{"id": row_id, "embedding": vector.tobytes()} for row_id, vector in written.items()])
    with engine.connect() as conn:
        times = sorted(conn.scalars(select(CaptionRecord.captured_at)))
    cases = [
        (CaptionFilter(), "man walking a dog", 320),
        # More rows meet the filters than the scan bound: ranked from the vector index, and still every row of them
        # (the candidates grow to all of them), not the newest 100 as before the index.
        (CaptionFilter(), "a cat on the wall", 100),
        (CaptionFilter(cameras=["cam-02"], since=times[30]), "person climbing over the fence", 320),
        (CaptionFilter(cameras=["cam-01", "cam-03"], min_people=1), "car pulling into the driveway", 150),
    ]
    assert index_for(engine).wait_ready(30)
    for query, search, rows in cases:
        vector = embedder.encode([search])[0]
        expected = oracle(engine, query, search, vector, hybrid, rows)
        assert len(expected) > 30, (search, len(expected))  # several pages
        paged: list[int] = []
        after = None
        while True:
            found, _, after = semantic_search(
                engine, embedder, query, search, 9, hybrid=hybrid, after=after, limits=SearchLimits(scan_rows=rows)
            )
            paged += [row.id for row in found]
            if after is None:
                break
        assert paged == expected, (search, rows)


def test_a_row_stored_after_the_first_page_does_not_shift_the_next(
    engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray
) -> None:
    insert_vectors(engine, labelled_vectors)
    query = CaptionFilter()
    whole, _, _ = semantic_search(engine, embedder, query, "a cat on the wall", 320)
    first, _, after = semantic_search(engine, embedder, query, "a cat on the wall", 5)
    assert [row.id for row in first] == [row.id for row in whole[:5]]
    with engine.begin() as conn:  # a newer row that ranks on the second page: the sixth row's caption again
        row = conn.execute(select(CaptionRecord).where(CaptionRecord.id == whole[5].id)).mappings().one()
        values = {k: v for k, v in row.items() if k not in {"id", "change_xid", "change_seq"}}
        values["captured_at"] = row["captured_at"].replace(year=2027)
        conn.execute(CaptionRecord.__table__.insert().values(values))
    assert backfill(engine, embedder) == 1
    second, _, _ = semantic_search(engine, embedder, query, "a cat on the wall", 5, after=after)
    assert [row.id for row in second] == [row.id for row in whole[5:10]]


def test_window_bounds_the_rows_ranked(engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray) -> None:
    """While the index is being built, a search ranks the newest `scan_rows` rows. The build is held back for the
    search (it waits for the index's loading lock), so it cannot finish first on a fast machine."""
    insert_vectors(engine, labelled_vectors)
    index = index_for(engine, start=False)
    with index._loading:
        rows, _, after = semantic_search(
            engine, embedder, CaptionFilter(), "a cat on the wall", 100, limits=SearchLimits(scan_rows=50)
        )
    assert after is None and len(rows) == 50
    assert min(row.id for row in rows) > 270  # the newest 50 rows (ids follow capture time here)


def test_vectors_go_with_deleted_rows_and_changed_captions(
    engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray
) -> None:
    insert_vectors(engine, labelled_vectors)
    with engine.begin() as conn:
        conn.execute(CaptionRecord.__table__.delete().where(CaptionRecord.id <= 20))
        conn.execute(
            CaptionRecord.__table__.update().where(CaptionRecord.id == 30).values(caption="A fox on the lawn.")
        )
    assert vector_count(engine) == 299
    assert backfill(engine, embedder) == 1  # the changed caption's vector is written again, from its new text
    with engine.connect() as conn:
        orphans = conn.scalar(
            text(f"SELECT count(*) FROM {VECTORS_TABLE} WHERE caption_id NOT IN (SELECT id FROM captions)")
        )
    assert orphans == 0


def test_background_embedder_writes_vectors_of_new_captions(engine: Engine, embedder: TextEmbedder) -> None:
    background = BackgroundEmbedder(engine, embedder, batch_size=64, poll_s=0.05)
    background.start()
    try:
        assert background.wait_embedded(320, timeout_s=120)
        with engine.begin() as conn:
            conn.execute(
                CaptionRecord.__table__.update().where(CaptionRecord.id == 5).values(caption="A heron by the pond.")
            )
        assert background.wait_embedded(321, timeout_s=60)  # the changed row, by the change walk
    finally:
        background.stop()
    assert vector_count(engine) == 320
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(CaptionRecord)) == 320


@pytest.fixture
def client(engine: Engine, database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    """The API over the seeded database, semantic search on: its background embedder fills the vectors."""
    settings = api_settings(tmp_path / "api", hash_key(READ_KEY)).model_copy(update={"database_url": database_url})
    app = create_app(settings)
    with TestClient(app, headers={"Authorization": f"Bearer {READ_KEY}"}) as client:
        assert app.state.api.background_embedder.wait_embedded(320, timeout_s=120)
        yield client


def test_api_serves_semantic_and_hybrid_pages(client: TestClient, database_url: str) -> None:
    relevant = set(dict(load_set().queries)["man walking a dog"])
    for hybrid in (False, True):
        params: dict[str, Any] = {"semantic": "man walking a dog", "hybrid": hybrid, "limit": 5}
        page = client.get("/v1/captions", params=params).json()
        assert len(set(item["id"] for item in page["items"]) & relevant) >= 4
        following = client.get("/v1/captions", params={**params, "cursor": page["next_cursor"]}).json()
        assert not {item["id"] for item in page["items"]} & {item["id"] for item in following["items"]}
    ready = client.get("/readyz").json()["checks"]["semantic"]
    assert ready["ok"] and (
        "sqlite-vec" in ready["detail"] if database_url.startswith("sqlite") else "numpy" in ready["detail"]
    )
    assert "caught up" in ready["detail"]


def test_api_refuses_what_semantic_search_cannot_mean(client: TestClient) -> None:
    both = client.get("/v1/captions", params={"semantic": "a dog", "q": "dog"})
    assert both.status_code == 422 and both.json()["error"]["param"] == "q"
    alone = client.get("/v1/captions", params={"hybrid": True})
    assert alone.status_code == 422 and alone.json()["error"]["param"] == "hybrid"
    newest_first = client.get("/v1/captions", params={"limit": 1}).json()["next_cursor"]
    mixed = client.get("/v1/captions", params={"semantic": "a dog", "cursor": newest_first})
    assert mixed.status_code == 422 and mixed.json()["error"]["param"] == "cursor"
    # A semantic cursor with a score no page ends at (JSON as Python reads it allows NaN and Infinity).
    params = {"semantic": "a dog", "hybrid": True, "limit": 2}
    real = json.loads(base64.urlsafe_b64decode(client.get("/v1/captions", params=params).json()["next_cursor"] + "=="))
    for score in ("NaN", "Infinity", "-Infinity"):
        forged = json.dumps(real).replace(json.dumps(real["s"]), score)
        cursor = base64.urlsafe_b64encode(forged.encode()).decode().rstrip("=")
        refused = client.get("/v1/captions", params={**params, "cursor": cursor})
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "cursor", (score, refused.text)


def test_semantic_search_is_refused_when_off(tmp_path: Path) -> None:
    settings = api_settings(tmp_path, hash_key(READ_KEY)).model_copy(update={"api_semantic_search": False})
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {READ_KEY}"}) as client:
        refused = client.get("/v1/captions", params={"semantic": "a dog"})
        assert refused.status_code == 422 and "VISIONCAP_API_SEMANTIC_SEARCH" in refused.json()["error"]["message"]


def test_loading_the_model_leaves_the_process_environment_alone() -> None:
    """Offline is said to the loader, not to the process: HF_HUB_OFFLINE set here would reach every child process
    (vLLM's own argument checks then fail on model names they would otherwise leave alone)."""
    before = {name: value for name, value in os.environ.items() if name.startswith(("HF_", "TRANSFORMERS_"))}
    vectors = TextEmbedder().encode(["a cyclist carries a bicycle"])
    after = {name: value for name, value in os.environ.items() if name.startswith(("HF_", "TRANSFORMERS_"))}
    assert vectors.shape == (1, 384)
    assert after == before


def test_latency_bench_times_every_case_idle_and_busy(tmp_path: Path) -> None:
    """`python -m visioncap.bench.search.quality`'s latency part on a small table: every search case and Ask's
    retrieval are timed in both passes (the bench runs on nobody's watch between sessions; its last breakage was
    found only when a run died), and the report judges the goal only at a million rows."""
    timing = latency(tmp_path, rows=2_000, samples=2, busy_cores=1)
    assert set(timing["cases"]) == set(LATENCY_CASES) == set(timing["busy_cases"])
    assert all(case["samples"] == 2 and case["p99_ms"] > 0 for case in timing["busy_cases"].values())
    recall = {"recall_at_5": dict.fromkeys(MODES, 1.0), "queries": []}
    report = render({"machine": machine_facts(), "command": "bench", "quality": recall, "latency": timing})
    assert "| ask_retrieval | 2 |" in report and "not judged" in report
    fill, fresh = timing["index"]["backfill"], timing["index"]["freshness"]
    assert fill["rows"] == 200 and fill["rows_per_s"] > 0
    assert len(fresh["new_row_s"]) == 4 and max(fresh["new_row_s"]) < 30 and fresh["late_row_s"] < 30
    assert "Searchable after: a new caption" in report


def test_a_words_list_over_the_index_ranks_the_matches_of_its_window(engine: Engine) -> None:
    """Over the index (a broad scope) a words list is the full-text matches of the window (the rows found first,
    then matched: its cost does not grow with the matches). Each row scores what the full ranking gives it, so the
    list is that ranking, restricted to the window."""
    word = "man"
    with engine.connect() as conn:
        every = full_text_ranking(conn, select(CaptionRecord.id), [word])
        assert len(every) > 30, "the labelled set has this word in many captions"
        window = [CaptionRecord.id > 200, CaptionRecord.id <= 300]
        scores = _word_scores(conn, window, [[word], ["nothing", "matches", "this"], []])
        assert _best_first(scores[0]) == [row_id for row_id in every if 200 < row_id <= 300]
        assert scores[1] == scores[2] == {}
        one_camera = _word_scores(conn, [*window, CaptionRecord.camera == "cam-01"], [[word]])[0]
        assert one_camera and set(one_camera) < set(scores[0])
        assert set(conn.scalars(select(CaptionRecord.camera).where(CaptionRecord.id.in_(list(one_camera))))) == {
            "cam-01"
        }


def test_the_index_reads_vectors_written_below_its_highest_id(
    engine: Engine, embedder: TextEmbedder, labelled_vectors: np.ndarray
) -> None:
    """Vectors written for rows under the index's highest id (a caption stored pending and captioned after newer
    rows; a caption regenerated) reach the index at its next refresh, by their write time on the database's
    clock: the late row added, the regenerated one's entry replaced in place."""
    insert_vectors(engine, labelled_vectors)  # the seed's, with no write time: read by the build
    index = index_for(engine, start=False)
    index.rebuild()
    template = load_set_row(engine, 1)
    with engine.begin() as conn:
        late_id, newer_id = conn.execute(
            CaptionRecord.__table__.insert().returning(CaptionRecord.id),
            [
                {**template, "camera": "late", "status": "pending", "caption": None},
                {**template, "camera": "newer", "caption": "A tractor towing hay."},
            ],
        ).scalars()
    assert embed_rows(engine, embedder, [(newer_id, "A tractor towing hay.")]) == 1
    index.refresh()
    assert index.size == 321
    late_caption, heron = "A hot air balloon landing in the car park.", "A heron by the pond."
    with engine.begin() as conn:
        conn.execute(
            CaptionRecord.__table__.update()
            .where(CaptionRecord.id == late_id)
            .values(status="captioned", caption=late_caption)
        )
        conn.execute(CaptionRecord.__table__.update().where(CaptionRecord.id == 5).values(caption=heron))
    assert embed_rows(engine, embedder, [(late_id, late_caption), (5, heron)]) == 2
    late_vector, heron_vector = embedder.encode([late_caption, heron])
    nearest = index.nearest(heron_vector, IndexFilter(), 1)[0].tolist()
    assert nearest != [5]  # the old bits until the refresh
    index.refresh()
    assert index.size == 322  # the late row added, the regenerated one replaced
    assert index.nearest(late_vector, IndexFilter(), 1)[0].tolist() == [late_id]
    assert index.nearest(heron_vector, IndexFilter(), 1)[0].tolist() == [5]
    index.refresh()  # nothing new: the overlap is not read again
    assert index.size == 322


def load_set_row(engine: Engine, row_id: int) -> dict[str, Any]:
    """A stored row's columns to copy (but its id, times and change positions, which the database stamps)."""
    with engine.connect() as conn:
        row = conn.execute(select(CaptionRecord.__table__).where(CaptionRecord.id == row_id)).mappings().one()
    stamped = {"id", "created_at", "updated_at"}
    return {key: value for key, value in row.items() if key not in stamped and not key.startswith("change_")}
