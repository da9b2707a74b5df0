"""Smoke run of `visioncap bench events` (visioncap/bench/events/run.py) on the tiny model: the command a user runs,
end to end (vLLM, the gateway process, events alone and beside chat, results files), so the benchmark cannot rot
unnoticed. Latencies are not checked (seconds on a shared machine say nothing); what is deterministic is: each
event's image tokens as we estimate them, as vLLM's processor made them and as the gateway counted them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = pytest.mark.vllm


def test_events_benchmark_counts_every_frame_alike_and_serves_events_beside_chat(tmp_path: Path) -> None:
    results = tmp_path / "results"
    command = [sys.executable, "-m", "visioncap.bench.events.run", "--quick", "--duration", "8"]
    command += ["--out-dir", str(results), "--work-dir", str(tmp_path / "work")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    data = json.loads((results / "events_multiframe-quick.json").read_text())
    assert set(data["counts"]) == {"1", "3", "6"}
    for count, figures in data["counts"].items():
        # Our estimate, vLLM's count (its prompt less the text's tokens and each image's two markers) and the
        # gateway's metric agree, every event; the frames share the 768-token budget.
        assert figures["estimate_matches_vllm"], count
        assert figures["image_tokens_estimated"] == figures["image_tokens_vllm"] == figures["image_tokens_gateway"]
        assert 0 < figures["image_tokens_estimated"] <= 768
        assert figures["beside_chat"]["events_per_s"] > 0 and figures["beside_chat"]["chat_ok"] > 0
    # Several frames are several smaller pictures: a sixth of the budget each at six.
    assert (
        data["counts"]["6"]["frame_size"][0]
        < data["counts"]["3"]["frame_size"][0]
        < data["counts"]["1"]["frame_size"][0]
    )
    assert "| 6 |" in (results / "events_multiframe-quick.md").read_text()
