"""Smoke run of `visioncap/bench/search/api.py` on a small SQLite seed: the command a user runs, end to end (seed,
`visioncap api`, the load process, measurement, results files), so the benchmark cannot rot unnoticed. The
figures themselves are not checked: 2,000 rows on a shared machine say nothing about the goal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO

SEARCHES = {"newest", "camera_range", "text_rare", "text_medium", "text_common", "text_two_words", "text_prefix"}
SEARCHES |= {"people_none", "text_people_none", "status_pending", "status_rare"}  # filters no index serves
QUERIES = {*SEARCHES, "cameras"}


def test_api_search_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    results = tmp_path / "results"
    command = [sys.executable, "-m", "visioncap.bench.search.api", "--rows", "2000", "--samples", "3"]
    command += ["--databases", "sqlite", "--data-dir", str(tmp_path / "work"), "--results-dir", str(results)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr

    data = json.loads((results / "api_search.json").read_text())
    assert data["rows"] == 2000
    sqlite = data["databases"]["sqlite"]
    assert sqlite["seed"]["total_s"] > 0
    for phase in ("idle", "load"):
        assert set(sqlite[phase]) == QUERIES
        assert all(q["samples"] == 3 and 0 < q["p50_ms"] <= q["p99_ms"] for q in sqlite[phase].values())
        # 2,000 rows are fewer than a search's scan bound: every answer is whole.
        assert all(q["partial_share"] == 0 and q["search_timeouts"] == 0 for q in sqlite[phase].values())
    # The API found what the corpus holds: a full page, or every match when there are fewer.
    for name in QUERIES:
        if name in data["text_query_matches"]:
            expected = min(50, data["text_query_matches"][name]["rows"])
            assert sqlite["idle"][name]["items_median"] == expected, name
    for name in data["filter_query_matches"]:
        expected = min(50, data["filter_query_matches"][name]["rows"])
        assert sqlite["idle"][name]["items_median"] == expected, name
    assert data["filter_query_matches"]["people_none"]["rows"] == 0
    assert data["filter_query_matches"]["status_pending"]["rows"] > 0
    assert data["text_query_matches"]["text_common"]["rows"] > 50
    assert sqlite["idle"]["cameras"]["items_median"] == 20  # every camera of the corpus is listed
    # The load really ran beside the measurement, without errors.
    counts = sqlite["load_process"]["counts"]
    assert counts.get("writes", 0) >= 1
    assert not [name for name in counts if "error" in name], counts
    assert set(sqlite["plans"]) == SEARCHES
    markdown = (results / "api_search.md").read_text()
    assert "-m visioncap.bench.search.api --rows 2000" in markdown
    assert "| sqlite | newest |" in markdown
    assert "| sqlite | text_people_none |" in markdown and "`q=walking&min_people=9999`" in markdown
    assert not (tmp_path / "work" / "sqlite").exists()  # the seeded file is removed unless --keep
