"""The search benchmark at scale, small: `visioncap bench search` runs it, and its latency pass reports the vector
index (its build time, memory and on-disk size, recall@10 against the exact ranking) and the one-day searches."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from visioncap.bench.common.machine import machine_facts
from visioncap.bench.search.quality import latency, render
from visioncap.cli import app


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


def _empty_quality() -> dict[str, object]:
    return {"queries": [], "recall_at_5": {"words": 0.0, "semantic": 0.0, "hybrid": 0.0}}
