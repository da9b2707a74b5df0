"""The search benchmark at scale, small: `visioncap bench search` runs it, and its latency pass reports the vector
index (its build time, memory and on-disk size, recall@10 against the exact ranking) and the one-day searches."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from pg import fresh_database
from sqlalchemy import text
from typer.testing import CliRunner

from visioncap.bench.common.machine import machine_facts
from visioncap.bench.search.quality import _PG_COPY_ROWS, T0, latency, load_set, render
from visioncap.cli import app
from visioncap.store import create_db_engine
from visioncap.store.schema import VECTORS_TABLE


def test_bench_search_hands_its_options_to_the_benchmark() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["bench", "search", "quality", "--help"])
    assert shown.exit_code == 0, shown.output
    assert "--quality-only" in shown.output and "--rows" in shown.output
    wrong = runner.invoke(app, ["bench", "search", "nothing"])
    assert wrong.exit_code == 2 and "quality or api" in wrong.output


def test_latency_pass_measures_the_index_against_the_exact_ranking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window smaller than the table, so the unfiltered searches go through the index as at a million rows.
    monkeypatch.setenv("VISIONCAP_API_SEARCH_SCAN_ROWS", "200")
    timing = latency(tmp_path, rows=1_500, samples=1, busy_cores=0)
    index = timing["index"]
    assert index["vectors"] == 1_500
    assert index["build_s"] > 0 and index["memory_mb"] > 0 and index["database_mb"] > 0
    assert index["recall_at_10"] >= 0.95
    assert {"semantic_one_day", "hybrid_one_day"} <= set(timing["cases"])
    shown = render({"machine": machine_facts(), "command": "bench", "quality": _empty_quality(), "latency": timing})
    assert "### The vector index at 1,500 rows" in shown


def test_the_latency_pass_on_postgresql_seeds_once_and_keeps_the_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, postgres: str
) -> None:
    """`--database-url`: the rows are made inside PostgreSQL with the counts' trigger off, so the counts are made
    again after (the API's camera list reads them); row n is what the SQLite loop writes; a database seeded before
    is searched as it is (a 10M-row table is seeded once)."""
    monkeypatch.setenv("VISIONCAP_API_SEARCH_SCAN_ROWS", "200")
    url = fresh_database(postgres)
    timing = latency(tmp_path / "first", rows=1_500, samples=1, busy_cores=0, database_url=url)
    assert timing["database"] == "postgresql" and not timing["seeded_before"]
    assert timing["index"]["vectors"] == 1_500 and timing["index"]["recall_at_10"] >= 0.95
    assert timing["index"]["database_mb"] > 0
    labelled = load_set()
    engine = create_db_engine(url)
    with engine.connect() as conn:
        rows = conn.scalar(text("SELECT count(*) FROM captions"))
        assert conn.scalar(text("SELECT sum(row_count) FROM caption_counts")) == rows > 1_500
        assert conn.scalar(text("SELECT count(*) FROM captions WHERE change_seq IS NULL")) == 0
        n = 1_233
        camera, frame, caption = conn.execute(
            text(f"SELECT camera, frame_index, caption FROM captions WHERE id = {n + 1}")
        ).one()
        assert (camera, frame, caption) == (f"cam-{n % 20:02d}", n, labelled.captions[n % len(labelled.captions)])
        copied, first = (
            np.frombuffer(
                conn.scalar(text(f"SELECT embedding FROM {VECTORS_TABLE} WHERE caption_id = {i}")), np.float32
            )
            for i in (n + 1, n % len(labelled.captions) + 1)
        )
        assert np.array_equal(copied, first)
        captured = conn.scalar(text(f"SELECT captured_at FROM captions WHERE id = {n + 1}"))
        assert abs(captured - (T0 + timedelta(days=60) * n / 1_500)) <= timedelta(microseconds=1)
    with engine.begin() as conn:
        # The 10,000,000th row of a 10M seed: 60 days in microseconds times its number is past a bigint.
        last = 9_999_999
        bounds = {"first": last, "last": last, "cycle": 320, "cameras": 20, "t0": T0, "rows": last + 1}
        conn.execute(_PG_COPY_ROWS, {**bounds, "span_us": int(timedelta(days=60) / timedelta(microseconds=1))})
        captured = conn.scalar(text(f"SELECT captured_at FROM captions WHERE id = {last + 1}"))
        assert abs(captured - (T0 + timedelta(days=60) * last / (last + 1))) <= timedelta(microseconds=1)
        conn.execute(text(f"DELETE FROM captions WHERE id = {last + 1}"))
    engine.dispose()
    again = latency(tmp_path / "again", rows=1_500, samples=1, busy_cores=0, database_url=url)
    assert again["seeded_before"] and again["rows"] > 1_500
    shown = render({"machine": machine_facts(), "command": "bench", "quality": _empty_quality(), "latency": again})
    assert "rows (PostgreSQL)" in shown and "seeded by an earlier run" in shown and "p99 < 150 ms" in shown


def _empty_quality() -> dict[str, object]:
    return {"queries": [], "recall_at_5": {"words": 0.0, "semantic": 0.0, "hybrid": 0.0}}
