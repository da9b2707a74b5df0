"""`python -m visioncap.bench.overhead.gateway_hop`: the gateway's hop measured against an instant upstream, arms
side by side, with a second gateway from another checkout as the baseline (a real gateway process each)."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from helpers import REPO

from visioncap.bench.overhead.gateway_hop import measure, render


def test_the_hop_is_measured_for_each_gateway_beside_direct(tmp_path: Path) -> None:
    # The baseline is this same commit, checked out apart: its gateway must run from there, not from here.
    baseline = tmp_path / "baseline"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(baseline), "HEAD"], check=True)
    try:
        results = asyncio.run(measure(40, baseline, tmp_path / "work"))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(baseline)], check=True)
    arms = results["arms"]
    assert list(arms) == ["direct", "gateway", "baseline"] and results["chats_per_arm"] == 40
    assert arms["direct"]["added_first_content_ms"] is None and arms["direct"]["cpu_ms_per_chat"] is None
    for name in ("gateway", "baseline"):
        # Two hops take longer than one, and the gateway spends CPU on its chats (40 of them: over the process
        # clock's 10 ms tick).
        assert arms[name]["first_content_ms"] > arms["direct"]["first_content_ms"]
        assert arms[name]["added_first_content_ms"] > 0 and arms[name]["cpu_ms_per_chat"] > 0
        assert arms[name]["answer_end_ms"] >= arms[name]["first_content_ms"]
    assert arms["baseline"]["code"] == str(baseline) and arms["gateway"]["code"] == str(Path.cwd())
    page = render({**results, "command": "CMD", "machine": _machine()})
    assert "| gateway |" in page and "| baseline |" in page and "`CMD`" in page


def _machine() -> dict[str, object]:
    return {
        "date": "D", "cpu": "C", "cpu_count": 2, "load_average": [0], "load_average_end": [0],
        "git_commit": "G", "visioncap_uncommitted_changes": False,
    }  # fmt: skip
