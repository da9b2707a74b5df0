"""#46 item 4's goals: captions at the 1.25x objective over S1-idle's, captions/s not falling from one objective
level to the next looser one (on count intervals), and three consecutive runs judged together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from visioncap.bench.cli import bench_app
from visioncap.bench.mixed.consistency import captions_interval, judge_series, run_goals, series_report


def phase(completed: int, window_s: float = 100.0) -> dict[str, Any]:
    return {
        "duration_s": window_s + 6.0,
        "warmup_s": 6.0,
        "captions": {"completed_in_window": completed, "throughput_per_s": round(completed / window_s, 3)},
    }


def setups(s3: int, f15: int, f2: int, f3: int, idle: int = 1600) -> dict[str, Any]:
    return {
        "S3": phase(s3),
        "F-gateway-1.5x": phase(f15),
        "F-gateway-2x": phase(f2),
        "F-gateway-3x": phase(f3),
        "S1-idle": phase(idle),
    }


def levels(best_at_1_25: float | None) -> dict[str, Any]:
    best = None if best_at_1_25 is None else {"captions_per_s": best_at_1_25, "phase": "S3"}
    return {"1.25": {"best": {"gateway": best, "vllm-priority": None}}}


def test_a_phases_captions_interval_is_its_counts() -> None:
    assert captions_interval(phase(100, 10.0)) == (8.04, 11.96)
    assert captions_interval(phase(0, 10.0)) == (0.0, 0.0)
    assert captions_interval(None) is None
    assert captions_interval({"duration_s": 6.0, "warmup_s": 6.0, "captions": {"completed_in_window": 3}}) is None


def test_captions_at_the_objective_are_judged_against_chat_idle_capacity() -> None:
    goals = run_goals(setups(1000, 1000, 1000, 1000), levels(10.0))
    judged = goals["captions_at_1_25_over_s1_idle"]
    assert (judged["value"], judged["met"], judged["s1_idle_captions_per_s"]) == (0.625, True, 16.0)
    assert run_goals(setups(1000, 1000, 1000, 1000), levels(9.0))["captions_at_1_25_over_s1_idle"]["met"] is False
    # No gateway point meets 1.25x: nothing served at it.
    missed = run_goals(setups(1000, 1000, 1000, 1000), levels(None))["captions_at_1_25_over_s1_idle"]
    assert (missed["value"], missed["met"]) == (0.0, False)
    # No frontier at all (a run without it): not judged.
    assert run_goals(setups(1000, 1000, 1000, 1000), None)["captions_at_1_25_over_s1_idle"]["met"] is None


@pytest.mark.parametrize(
    ("counts", "met", "falls"),
    [
        ((200, 400, 800, 1300), True, []),
        ((683, 396, 1193, 1052), False, ["1.5 below 1.25", "3.0 below 2.0"]),  # the 23:33 run's shape
        ((400, 390, 800, 790), True, []),  # within the counts' noise: not a fall
        ((400, 390, 300, 790), False, ["2.0 below 1.5"]),
    ],
)
def test_captions_must_not_fall_from_one_objective_level_to_the_next(
    counts: tuple[int, int, int, int], met: bool, falls: list[str]
) -> None:
    judged = run_goals(setups(*counts), levels(None))["objective_levels_non_decreasing"]
    assert (judged["met"], judged["falls"]) == (met, falls)


def a_run(
    s3: float, missed: tuple[str, ...] = (), command: str = "visioncap bench mixed", unjudged: tuple[str, ...] = ()
) -> dict[str, Any]:
    goals = {name: {"met": True} for name in ("itl_p99_at_1_25", "ceiling_fraction_at_1_25")}
    goals.update({name: {"met": False} for name in missed})
    goals.update({name: {"met": None, "not_judged": "the stand-in was not faithful"} for name in unjudged})
    completed = int(s3 * 100)
    run_setups = setups(completed, completed + 100, completed + 200, completed + 300, idle=500)  # 5/s
    return {
        "command": command,
        "started_at": "2026-12-05T00:00:00+00:00",
        "setups": run_setups,
        "frontier": {"levels": levels(s3)},
        "goals": goals,
    }


def test_three_runs_each_meeting_every_goal_near_their_mean_meet_the_series() -> None:
    judged = judge_series([a_run(7.0), a_run(6.5), a_run(7.5)], ["a", "b", "c"])
    assert judged["met"] is True, judged
    assert judged["s3_spread_from_mean"] == [0.0, -0.071, 0.071]


@pytest.mark.parametrize(
    ("runs", "why"),
    [
        ([a_run(7.0), a_run(6.5)], "two runs"),
        ([a_run(7.0), a_run(4.0), a_run(7.5)], "S3 off its mean by more than 20 %"),
        ([a_run(7.0), a_run(6.5, missed=("itl_p99_at_1_25",)), a_run(7.5)], "a goal missed in one run"),
        ([a_run(7.0), a_run(6.5, unjudged=("itl_p99_at_1_25",)), a_run(7.5)], "a goal not judged in one run"),
        ([a_run(7.0), a_run(6.5), a_run(7.5, command="visioncap bench mixed --quick")], "another command"),
        ([a_run(2.8), a_run(2.9), a_run(2.85)], "the 1.25x captions under 0.6 of S1-idle's in each"),
    ],
)
def test_a_series_is_not_met(runs: list[dict[str, Any]], why: str) -> None:
    assert judge_series(runs, [f"run-{n}" for n in range(len(runs))])["met"] is False, why


def test_the_series_lists_goals_not_judged_apart_from_those_missed() -> None:
    runs = [a_run(7.0, missed=("ceiling_fraction_at_1_25",)), a_run(6.5, unjudged=("itl_p99_at_1_25",))]
    judged = judge_series(runs, ["a", "b"])
    assert judged["goals_missed"] == {"a": ["ceiling_fraction_at_1_25"], "b": []}
    assert judged["goals_not_judged"] == {"a": [], "b": ["itl_p99_at_1_25"]}
    assert "| b | 2026-12-05T00:00:00+00:00 | 6.5 | -4% | none | itl_p99_at_1_25 |" in series_report(judged)


def test_the_series_command_exits_by_the_judgement(tmp_path: Path) -> None:
    files = []
    for number, rate in enumerate((7.0, 6.5, 7.5)):
        path = tmp_path / f"mixed-{number}.json"
        path.write_text(json.dumps(a_run(rate)))
        files.append(str(path))
    out = tmp_path / "series" / "series.json"
    passed = CliRunner().invoke(bench_app, ["mixed-series", *files, "--out", str(out)])
    assert passed.exit_code == 0, passed.output
    assert json.loads(out.read_text())["met"] is True
    assert "**met**" in out.with_suffix(".md").read_text()
    Path(files[1]).write_text(json.dumps(a_run(3.0)))
    assert CliRunner().invoke(bench_app, ["mixed-series", *files]).exit_code == 1
    Path(files[1]).write_text("{not json")
    broken = CliRunner().invoke(bench_app, ["mixed-series", *files])
    assert broken.exit_code == 2 and "could not be read" in broken.output


def test_a_runs_command_names_every_flag_off_its_default() -> None:
    """Runs of different settings never pass for one command (the series compares them); the stand-in's refit
    sizes are the run's own and are not flags."""
    from dataclasses import replace

    from visioncap.bench.mixed.run import MixedOptions, command_line

    assert command_line(MixedOptions()) == "visioncap bench mixed"
    assert command_line(replace(MixedOptions(), image_width=168, frame_filler_words=259)) == "visioncap bench mixed"
    assert command_line(MixedOptions.quick()) == "visioncap bench mixed --quick"
    changed = replace(MixedOptions(), gw_idle_after_s=1.0, gw_pacing=False, verify_frames=(2,), seed=3)
    assert command_line(changed) == "visioncap bench mixed --gw-idle-after 1 --seed 3 --gw-no-pacing --verify-frames 2"


class _Stop(Exception):
    pass


def test_the_command_a_run_records_is_the_command_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every flag `bench mixed` takes reaches its options through the one table that writes the run's command line:
    a flag the table lacks (or maps to the wrong field) would be missing from, or wrong in, the recorded command."""
    import visioncap.bench.mixed.main as mixed_main
    from visioncap.bench.mixed.run import command_line

    received = []

    def capture(options: Any) -> dict[str, Any]:
        received.append(options)
        raise _Stop

    monkeypatch.setattr(mixed_main, "run_mixed", capture)
    typed = [
        ["--profile", "other", "--duration", "12.5", "--chat-rate", "2", "--flood-rate", "9",
         "--flood-max-outstanding", "3", "--gw-max-concurrency", "4", "--gw-min-concurrency", "1",
         "--gw-idle-after", "1", "--gw-start-per-s", "7", "--gw-active-max-image-tokens", "0",
         "--ttft-objective-ms", "900", "--itl-objective-ms", "80", "--seed", "5", "--frames-per-caption", "2",
         "--verify-rate", "0.25", "--gw-no-pacing", "--no-fcfs-restart", "--verify-frames", "2,3"],
        ["--quick", "--gw-idle-after", "0"],
        [],
    ]  # fmt: skip
    for words in typed:
        result = CliRunner().invoke(bench_app, ["mixed", *words])
        assert isinstance(result.exception, _Stop), result.output
        assert command_line(received[-1]) == " ".join(["visioncap", "bench", "mixed", *words])
