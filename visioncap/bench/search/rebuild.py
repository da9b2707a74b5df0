"""Searches while the vector index rebuilds: how long a search's first step (`refreshed`, the index brought up to
date) waits while a rebuild reads every row, and how much longer the rebuild takes beside them.

`maintain` rebuilds the index once the table and the index differ by a few percent (retention, growth); until
2026-12-05 the rebuild held the lock every search's refresh takes for its whole read, so every search by meaning
waited for it (5.1 s at a million rows here; the 10M-row PostgreSQL build took 212 s). Seeds a SQLite file with
`--rows` random unit vectors (reused when it exists), builds the index, then rebuilds it in a thread while this
thread asks for a search's refresh every `--every-ms`.

    python -m visioncap.bench.search.rebuild --rows 1000000 --database data/bench-rebuild.db
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, insert, text

from visioncap.bench.common.machine import machine_facts
from visioncap.bench.common.outputs import command_line, machine_line, write_results
from visioncap.bench.common.stats import percentile
from visioncap.bench.search.quality import _row
from visioncap.store import create_db_engine
from visioncap.store.embeddings import DIMENSIONS
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import VECTORS_TABLE, ensure_schema
from visioncap.store.vector_index import index_for, refreshed

_CHUNK = 50_000


def seed(engine: Engine, rows: int) -> None:
    """`rows` captions over 20 cameras and 60 days, each with a random unit vector (what is timed is the reading,
    not what a search finds)."""
    ensure_schema(engine)
    rng = np.random.default_rng(0)
    for start in range(0, rows, _CHUNK):
        count = min(_CHUNK, rows - start)
        vectors = rng.standard_normal((count, DIMENSIONS)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        batch = [_row(start + n, f"caption {start + n}", 20, timedelta(days=60), rows) for n in range(count)]
        with engine.begin() as conn:
            conn.execute(insert(CaptionRecord), batch)
            conn.execute(
                text(f"INSERT INTO {VECTORS_TABLE} (caption_id, embedding) VALUES (:id, :embedding)"),
                [{"id": start + n + 1, "embedding": vectors[n].tobytes()} for n in range(count)],
            )


def measure(engine: Engine, every_s: float) -> dict[str, Any]:
    index = index_for(engine)
    if not index.wait_ready(3600):
        raise SystemExit("the index's first build did not finish within an hour")
    first_build_s = float(index.built_s or 0.0)
    build = threading.Thread(target=index.rebuild, name="rebuild")
    waits: list[float] = []
    began = time.monotonic()
    build.start()
    while build.is_alive():
        asked = time.monotonic()
        refreshed(engine)
        waits.append(time.monotonic() - asked)
        time.sleep(every_s)  # the pace of searches, not a synchronisation: the loop ends with the build
    rebuild_s = time.monotonic() - began
    waits_ms = [1000 * wait for wait in waits]
    return {
        "rows": index.size,
        "first_build_s": round(first_build_s, 2),
        "rebuild_s": round(rebuild_s, 2),
        "rebuild_over_first_build": round(rebuild_s / max(first_build_s, 1e-9), 2),
        "searches_during_rebuild": len(waits),
        "wait_ms": {
            "p50": round(percentile(waits_ms, 50) or 0.0, 2),
            "p99": round(percentile(waits_ms, 99) or 0.0, 2),
            "max": round(max(waits_ms), 1),
        },
    }


def render(data: dict[str, Any]) -> str:
    result = data["result"]
    wait = result["wait_ms"]
    return "\n".join(
        [
            "# Searches while the vector index rebuilds",
            "",
            machine_line(data["machine"], "SQLite"),
            "",
            f"Command: `{data['command']}`",
            "",
            "| rows | first build s | rebuild s (searches beside it) | searches during it | their wait p50 / p99 / "
            "max ms |",
            "|---:|---:|---:|---:|---|",
            f"| {result['rows']:,} | {result['first_build_s']} | {result['rebuild_s']} | "
            f"{result['searches_during_rebuild']} | {wait['p50']} / {wait['p99']} / {wait['max']} |",
            "",
            data["note"],
            "",
        ]
    )


NOTE = (
    "Before (42691ee, the same measurement on the same million rows, 2026-12-05 16:39 UTC): 2 searches during a "
    "5.09 s rebuild, each waiting for it (p50 2,537 ms, max 5,073 ms): the rebuild held the lock every search's "
    "refresh takes. At 10M rows on PostgreSQL the build took 212 s (search_quality-10m-postgres.md)."
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rebuild", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="Rows seeded (when the file is new).")
    parser.add_argument("--database", type=Path, required=True, help="SQLite file (seeded when it does not exist).")
    parser.add_argument("--every-ms", type=float, default=10.0, help="A search's refresh every this many ms.")
    parser.add_argument("--results-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    fresh = not args.database.exists()
    engine = create_db_engine(f"sqlite:///{args.database}")
    if fresh:
        seed(engine, args.rows)
    data: dict[str, Any] = {
        "machine": machine_facts(),
        "command": command_line("visioncap.bench.search.rebuild", list(sys.argv[1:] if argv is None else argv)),
        "result": measure(engine, args.every_ms / 1000),
        "note": NOTE,
    }
    extra = {"directory": args.results_dir} if args.results_dir else {}
    paths = write_results("index_rebuild_searches", data, render, **extra)
    print(render(data))
    print(*paths)
    engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
