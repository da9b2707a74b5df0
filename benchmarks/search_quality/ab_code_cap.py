"""What the vector index's per-code cap costs, side by side in one process: semantic search with the cap
(CODE_SHARE 16) and without it (CODE_SHARE 1: per_code = k), interleaved query by query, and the recall@10 of each
against the exact ranking. Results: benchmarks/results/search_quality-100k.md.

    .venv/bin/python benchmarks/search_quality/ab_code_cap.py 100000 /tmp/ab100k [--reuse]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from visioncap.bench.search.quality import load_set, recall_against_exact, seed_many
from visioncap.store import create_db_engine, semantic
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.schema import ensure_schema
from visioncap.store.search import CaptionFilter, SearchLimits
from visioncap.store.vector_index import index_for

ARMS = (("cap", 16), ("no cap", 1))


def main() -> None:
    rows, work = int(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    engine = create_db_engine(f"sqlite:///{work / 'ab.db'}")
    ensure_schema(engine)
    embedder, labelled = TextEmbedder(), load_set()
    vectors = embedder.encode(labelled.captions)
    if "--reuse" not in sys.argv:
        seed_many(engine, labelled, vectors, rows)
    index_for(engine, start=False).rebuild()
    queries = [query for query, _ in labelled.queries]
    limits = SearchLimits()
    recall: dict[str, float] = {}
    for arm, share in ARMS:
        semantic.CODE_SHARE = share
        recall[arm] = recall_against_exact(engine, embedder, vectors, queries, limits)
    times: dict[str, list[float]] = {arm: [] for arm, _ in ARMS}
    for round_ in range(3):
        for query in queries:
            for arm, share in ARMS if round_ % 2 == 0 else ARMS[::-1]:
                semantic.CODE_SHARE = share
                began = time.perf_counter()
                semantic.semantic_search(engine, embedder, CaptionFilter(), query, 10, limits=limits)
                times[arm].append((time.perf_counter() - began) * 1000)
    for arm, taken in times.items():
        taken.sort()
        p50, p99 = taken[len(taken) // 2], taken[int(len(taken) * 0.99) - 1]
        print(f"{arm}: n={len(taken)} p50 {p50:.1f} ms p99 {p99:.1f} ms recall@10 vs exact {recall[arm]}")


if __name__ == "__main__":
    main()
