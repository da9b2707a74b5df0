"""`bench mixed`'s split of chat's slow gaps into those beside a frame at vLLM and those beside none (#46 item 4),
on records built here: which gap counts as beside a frame, and which part each verdict blames."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from visioncap.bench.cli import bench_app
from visioncap.bench.mixed.misses import miss_sources, misses_table, verdict

OBJECTIVE_S = 0.006
SUMMARIES = {
    "S1-idle": {"captions": {"latency_ms": {"p50": 80.0}}},
    "S3-idle": {"captions": {"latency_ms": {"p50": 100.0}}},
}


def chat(sent_at: float, gaps: list[float]) -> dict[str, Any]:
    return {"status": 200, "sent_at": sent_at, "ttft_s": 0.01, "gaps_s": gaps}


def test_a_gap_is_beside_a_frame_while_a_caption_is_at_vllm_or_just_was() -> None:
    # Gaps of 2 ms end at 1.012, 1.014, ... ; one slow gap of 9 ms at each of three places.
    fast = [0.002] * 100
    raw = {
        "S0": {"chats": [chat(0.0, fast)], "captions": []},
        "S3": {
            "chats": [
                chat(1.0, [0.009]),  # ends 1.019: a caption done at 1.1 was at vLLM from 1.0 (S3-idle's 100 ms)
                chat(2.0, [0.009]),  # ends 2.019: the caption done at 1.9 left 119 ms before, within 150 ms
                chat(3.0, [0.009]),  # ends 3.019: nothing at vLLM from 2.869 to 3.019
            ],
            "captions": [{"done_at": 1.1}, {"done_at": 1.9}, {"done_at": 3.2}],  # the last starts 3.1: after
        },
        "F-gateway-2x": {"chats": [chat(0.0, [0.009])], "captions": [{"done_at": 0.05}]},  # a looser level's
    }
    found = miss_sources(raw, SUMMARIES, OBJECTIVE_S)
    assert found["s0"] == {"gaps": 100, "above": 0, "share_above": 0.0}
    assert list(found["phases"]) == ["S3"]
    s3 = found["phases"]["S3"]
    assert s3["beside_frames"] == {"gaps": 2, "above": 2, "share_above": 1.0}
    assert s3["beside_none"] == {"gaps": 1, "above": 1, "share_above": 1.0}
    assert s3["service_s"] == 0.1


def test_direct_set_ups_take_a_captions_time_at_vllm_from_s1_idle() -> None:
    raw = {
        "S0": {"chats": [chat(0.0, [0.002] * 10)], "captions": []},
        # Ends 0.019; a caption done at 0.1 started at 0.02 with S1-idle's 80 ms: after the gap, beside none.
        "S2": {"chats": [chat(0.0, [0.009])], "captions": [{"done_at": 0.1}]},
    }
    assert miss_sources(raw, SUMMARIES, OBJECTIVE_S)["phases"]["S2"]["beside_none"]["gaps"] == 1


def _phase(none: tuple[int, int], frames: tuple[int, int]) -> dict[str, Any]:
    """A set-up whose gaps beside no frame and beside frames are (count, of them above) as given: one chat from 0 s
    with no caption near, one from 100 s with a caption done every 50 ms while it streams."""
    alone = [0.009] * none[1] + [0.002] * (none[0] - none[1])
    beside = [0.009] * frames[1] + [0.002] * (frames[0] - frames[1])
    streaming_s = 0.01 + sum(beside)
    captions = [{"done_at": 100.0 + 0.05 * n} for n in range(int(streaming_s / 0.05) + 3)]
    return {"chats": [chat(0.0, alone), chat(100.0, beside)], "captions": captions}


@pytest.mark.parametrize(
    ("none", "frames", "expected"),
    [
        ((5000, 10), (5000, 150), "frames: the host's stalls do not explain it"),  # 0.2 % beside none, 3 % beside
        ((5000, 80), (5000, 80), "host: its stalls alone miss"),  # as slow beside frames as beside none
        ((5000, 60), (5000, 200), "both: either alone misses"),
        ((5000, 30), (5000, 30), "met"),
    ],
)
def test_the_verdict_names_what_a_miss_comes_from(
    none: tuple[int, int], frames: tuple[int, int], expected: str
) -> None:
    raw = {"S0": {"chats": [chat(0.0, [0.009] * 2 + [0.002] * 998)], "captions": []}, "S3": _phase(none, frames)}
    row = miss_sources(raw, SUMMARIES, OBJECTIVE_S)["phases"]["S3"]
    assert (row["beside_none"]["gaps"], row["beside_none"]["above"]) == none
    assert (row["beside_frames"]["gaps"], row["beside_frames"]["above"]) == frames
    assert row["verdict"] == expected
    assert expected.split(":")[0] in misses_table(miss_sources(raw, SUMMARIES, OBJECTIVE_S))


def test_either_part_alone_would_meet_it() -> None:
    # 1.2 % in all; frames free: 0.8 %; host as chat alone (0.2 %): 0.1 % + 0.6 % = 0.7 %.
    assert verdict(0.012, 0.007, 0.008) == "either: each alone would meet it"


def test_the_misses_command_reads_a_run_and_its_raw_records(tmp_path: Path) -> None:
    raw = {"S0": {"chats": [chat(0.0, [0.002] * 100)], "captions": []}, "S3": _phase((500, 1), (500, 40))}
    run = tmp_path / "mixed.json"
    run.write_text(json.dumps({"setups": SUMMARIES, "gateway_objectives": {"itl_p99_ms": 6.0}}))
    (tmp_path / "mixed-raw.json").write_text(json.dumps(raw))
    out = tmp_path / "split" / "misses.json"
    done = CliRunner().invoke(bench_app, ["mixed-misses", str(run), "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "| S3 | 1000 | 4.10% | 500, 0.20% | 500, 8.00% |" in done.output
    assert json.loads(out.read_text())["phases"]["S3"]["verdict"].startswith("frames")
    assert out.with_suffix(".md").read_text() == done.output.rstrip("\n") + "\n"
    (tmp_path / "mixed-raw.json").unlink()
    missing = CliRunner().invoke(bench_app, ["mixed-misses", str(run)])
    assert missing.exit_code == 2 and "could not be read" in missing.output
