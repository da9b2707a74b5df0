"""`visioncap tune`: candidates, the choice rule, the profile edit, and one real run against vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import REPO, invoke_cli
from typer.testing import CliRunner

from visioncap.bench.standin.sizing import stand_in_tokens
from visioncap.bench.tune.candidates import Candidate, build_candidates, parse_int_list
from visioncap.bench.tune.run import (
    StandInTarget,
    TuneError,
    choose,
    margins,
    objectives,
    reference_objectives,
    tied_with,
)
from visioncap.bench.tune.write import BLOCK_END, BLOCK_START, insert_key, replace_scalar, set_serving_value
from visioncap.cli import app
from visioncap.config.profiles import load_profile
from visioncap.config.tuned import TunedMeasurement, TunedObjectives
from visioncap.errors import ConfigError


def measured(budget: int, tput: float, itl: float, ttft: float) -> TunedMeasurement:
    return TunedMeasurement(
        max_num_batched_tokens=budget,
        ttft_p50_ms=ttft / 2,
        ttft_p99_ms=ttft,
        itl_p50_ms=itl / 2,
        itl_p99_ms=itl,
        captions_per_s=tput,
        chat_requests=10,
        meets_objectives=False,
    )


def tmp_models(tmp_path: Path) -> Path:
    """A models folder with a copy of the tiny profile (the one the test may rewrite) and the shared build."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(REPO / "models" / "tiny.yaml", models / "tiny.yaml")
    (models / "build").symlink_to(REPO / "models" / "build", target_is_directory=True)
    (models / "build_tiny_qwen2vl.py").symlink_to(REPO / "models" / "build_tiny_qwen2vl.py")
    return models


# -- candidates ---------------------------------------------------------------------------------------------


def test_candidate_lists_are_parsed_and_checked() -> None:
    assert parse_int_list("128, 256,512", "--budgets") == [128, 256, 512]
    for bad in ("128,abc", "0,128", "-5,128", "128,,256", "128,128"):
        with pytest.raises(ConfigError, match="--budgets"):
            parse_int_list(bad, "--budgets")
    assert build_candidates([64, 512], None, 4096, None) == [Candidate(64), Candidate(512)]
    with pytest.raises(ConfigError, match="at least two"):
        build_candidates([512], None, 4096, None)
    with pytest.raises(ConfigError, match="max_num_seqs"):
        build_candidates([64, 512], None, 4096, 128)
    with pytest.raises(ConfigError, match="max_model_len"):
        build_candidates([512, 1024], [8192], 4096, None)
    crossed = build_candidates([256, 1024], [128, 512], 4096, None)
    # A threshold above the budget never binds, so that pair is not run.
    assert [c.label for c in crossed] == ["256/128", "1024/128", "1024/512"]


# -- the choice ---------------------------------------------------------------------------------------------


def test_highest_throughput_that_meets_the_objectives_is_chosen() -> None:
    runs = [measured(128, 2.0, 100, 300), measured(512, 2.6, 120, 400), measured(1024, 3.0, 200, 500)]
    target = objectives(runs, None, None)  # 1.25 x 100 ms inter-token, 1.5 x 300 ms TTFT
    assert (target.itl_p99_ms, target.ttft_p99_ms) == (125.0, 450.0)
    marked, chosen, met, _ = choose(runs, [True, True, True], target)
    assert met and chosen == 1
    assert [m.meets_objectives for m in marked] == [True, True, False]
    found = margins(marked, chosen)
    assert found["lowest_throughput"]["candidate"] == "128"
    assert found["lowest_throughput"]["throughput_gain_pct"] == 30.0
    assert found["highest_itl_p99"]["candidate"] == "1024"
    assert found["highest_itl_p99"]["itl_p99_reduction_pct"] == 40.0
    # A phase with failures cannot be chosen, whatever its numbers.
    _, chosen, met, _ = choose(runs, [True, False, True], target)
    assert met and chosen == 0


def test_when_none_meets_the_objectives_the_lowest_inter_token_p99_is_taken() -> None:
    runs = [measured(128, 2.0, 100, 300), measured(512, 2.6, 90, 400)]
    target = TunedObjectives(ttft_p99_ms=50, itl_p99_ms=50, ttft_source="given", itl_source="given")
    marked, chosen, met, _ = choose(runs, [True, True], target)
    assert not met and chosen == 1
    assert not any(m.meets_objectives for m in marked)


def with_interval(m: TunedMeasurement, low: float, high: float, worst_step_ms: float) -> TunedMeasurement:
    return m.model_copy(update={"itl_p99_interval_ms": [low, high], "estimate": {"worst_step_ms": worst_step_ms}})


def test_candidates_the_measurement_cannot_tell_apart_are_decided_by_the_cost_model() -> None:
    target = TunedObjectives(ttft_p99_ms=50, itl_p99_ms=20, ttft_source="given", itl_source="given")
    # None meets; the lowest p99 (4096) is not told apart from 512 and 2048, whose intervals overlap its own;
    # among those, 512 lets the fewest frames' encoders share a step on the target.
    runs = [
        with_interval(measured(512, 4.0, 31.8, 212), 25.0, 36.0, 16.5),
        with_interval(measured(1024, 4.0, 40.0, 291), 37.0, 45.0, 31.5),
        with_interval(measured(2048, 4.0, 28.5, 312), 24.0, 33.0, 72.1),
        with_interval(measured(4096, 4.0, 25.1, 266), 21.0, 29.0, 145.5),
    ]
    assert tied_with(runs, [0, 1, 2, 3], False) == [0, 2, 3]
    _, chosen, met, _ = choose(runs, [True] * 4, target)
    assert not met and chosen == 0
    # Apart (no overlap), the measurement decides, whatever the cost model prefers.
    apart = [runs[0].model_copy(update={"itl_p99_interval_ms": [30.0, 36.0]}), runs[3]]
    assert choose(apart, [True, True], target)[1] == 1
    # Without intervals (a run that kept no gaps) the lowest p99 alone is the best.
    bare = [measured(512, 4.0, 31.8, 212), measured(4096, 4.0, 25.1, 266)]
    assert choose(bare, [True, True], target)[1] == 1


def test_meeting_candidates_within_a_percent_of_the_best_throughput_are_tied() -> None:
    target = TunedObjectives(ttft_p99_ms=500, itl_p99_ms=50, ttft_source="given", itl_source="given")
    runs = [
        with_interval(measured(512, 3.97, 31.0, 212), 25.0, 36.0, 16.5),
        with_interval(measured(2048, 4.0, 28.0, 312), 24.0, 33.0, 72.1),
        with_interval(measured(4096, 3.5, 20.0, 266), 18.0, 22.0, 145.5),
    ]
    assert tied_with(runs, [0, 1, 2], True) == [0, 1]  # 4096 keeps up with fewer captions: not tied
    _, chosen, met, _ = choose(runs, [True] * 3, target)
    assert met and chosen == 0


def test_objectives_relative_to_chat_alone_are_the_frontier_objective() -> None:
    reference = {"chat": {"itl_ms": {"p99": 20.0}, "ttft_ms": {"p99": 80.0}}}
    target = reference_objectives(reference, 1.25)
    assert (target.itl_p99_ms, target.ttft_p99_ms) == (25.0, 120.0)
    assert "chat alone" in target.itl_source and "chat alone" in target.ttft_source
    with pytest.raises(TuneError, match="reference measured no chat latency"):
        reference_objectives({"chat": {"itl_ms": {"p99": None}}}, 1.25)
    # Never measured (the first server failed before its reference phase): the error names that cause.
    with pytest.raises(TuneError, match=r"no chat-alone reference was measured \(1024's server failed before it: "):
        reference_objectives(None, 1.25, "1024's server failed before it: ReadTimeout: timed out")


# -- a GPU profile tuned on its CPU stand-in ----------------------------------------------------------------


def test_a_stand_in_serves_the_targets_budgets_in_its_own_tokens_beside_the_cost_model() -> None:
    target = StandInTarget(load_profile("qwen2.5-vl-7b", REPO / "models"), "h200", 1.2417)
    # The stand-in's tokens: scaled and rounded up to 16 (2048 -> 2544 at a scale of 1.2417).
    # The target's own threshold for the class (1024 on h200) goes with a candidate that leaves it open.
    assert target.served(Candidate(2048)) == Candidate(2544, 1280)
    assert target.served(Candidate(1024, 128)) == Candidate(1280, 160)
    small, large = target.estimate(Candidate(512)), target.estimate(Candidate(4096))
    # A budget beyond one frame's prompt changes nothing for one frame, but lets more frames' encoders (never
    # split) into one step: the worst step grows with the budget.
    assert small["step_with_frame_ms"] == large["step_with_frame_ms"]
    assert small["frames_encoded_per_step"] == 1 and large["frames_encoded_per_step"] == 10
    assert small["worst_step_ms"] is not None and large["worst_step_ms"] is not None
    assert large["worst_step_ms"] > 5 * small["worst_step_ms"]
    # A long-prefill threshold spreads the frame's prompt over steps: a smaller stall, more steps.
    capped = target.estimate(Candidate(2048, 128))
    assert capped["stall_steps"] is not None and small["stall_steps"] is not None
    assert capped["stall_steps"] < small["stall_steps"] and capped["frame_prefill_steps"] == 4


def test_the_choice_is_written_into_the_target_profile_in_its_tokens(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from visioncap.bench.tune.run import TuneOptions
    from visioncap.bench.tune.write import write_tuned

    path = tmp_path / "qwen2.5-vl-7b.yaml"
    original = (REPO / "models" / "qwen2.5-vl-7b.yaml").read_text(encoding="utf-8")
    path.write_text(original, encoding="utf-8")
    target = StandInTarget(load_profile(str(path), tmp_path), "h200", 1.2417)
    runs = [
        measured(1024, 4.0, 20, 80).model_copy(update={"estimate": target.estimate(Candidate(1024))}),
        measured(2048, 4.0, 30, 80).model_copy(update={"estimate": target.estimate(Candidate(2048))}),
    ]
    goal = reference_objectives({"chat": {"itl_ms": {"p99": 20.0}, "ttft_ms": {"p99": 80.0}}}, 1.25)
    marked, chosen, met, _ = choose(runs, [True, True], goal)
    assert met and chosen == 0
    options = TuneOptions(profile="standin", gpu_class="cpu", candidates=[Candidate(1024), Candidate(2048)])
    results = {"chosen": marked[chosen].model_dump(), "hardware": "CPU test"}
    workload = options.workload_line()
    write_tuned(path, "h200", results, marked, goal, met, datetime.now(UTC), workload, "stand-in standin on cpu")
    profile = load_profile(str(path), tmp_path)
    assert profile.serving_for("h200").max_num_batched_tokens == 1024
    assert profile.serving_for("h100").max_num_batched_tokens == 2048  # other classes as they were
    assert profile.tuned is not None and profile.tuned["h200"].measured_on == "stand-in standin on cpu"
    assert profile.tuned["h200"].candidates[0].estimate == target.estimate(Candidate(1024))
    # The rest of the file as it was (the committed one may carry a tuned block already: it is replaced, not added).
    text = path.read_text(encoding="utf-8")
    assert text.count(BLOCK_START) == 1
    was = target.profile.serving_for("h200").max_num_batched_tokens
    assert text.split(BLOCK_START)[0].rstrip("\n") == original.split(BLOCK_START)[0].rstrip("\n").replace(
        f"max_num_seqs: 128, max_num_batched_tokens: {was},", "max_num_seqs: 128, max_num_batched_tokens: 1024,"
    )


def test_stand_in_options_are_checked_before_any_server_starts(tmp_path: Path) -> None:
    env = {"VISIONCAP_DATA_DIR": str(tmp_path / "data")}
    for args, message in (
        (["--profile", "qwen2.5-vl-7b", "--gpu", "h200", "--stand-in", "tiny"], "tiny does not stand in for"),
        (["--profile", "qwen2.5-vl-7b", "--gpu", "a100", "--stand-in", "standin"], "has no workload for a100"),
        (
            [
                "--profile",
                "qwen2.5-vl-7b",
                "--gpu",
                "h200",
                "--stand-in",
                "standin",
                "--level",
                "1.25",
                "--itl-p99-ms",
                "20",
            ],
            "--level",
        ),
    ):
        result = invoke_cli("tune", *args, "--out", str(tmp_path / "out"), env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in " ".join(result.stderr.split()), (args, result.stderr)
    assert not (tmp_path / "out").exists()


# -- the profile edit ---------------------------------------------------------------------------------------


def test_scalar_edits_keep_every_comment() -> None:
    text = "a: 1  # one\nb:\n  c: 2   # two\n  d: [1, 2]\n# the end\ne: x\n"
    assert replace_scalar(text, ["b", "c"], "5") == "a: 1  # one\nb:\n  c: 5   # two\n  d: [1, 2]\n# the end\ne: x\n"
    assert replace_scalar(text, ["b", "missing"], "5") is None
    inserted = insert_key(text, ["b"], "f", "7")
    assert inserted == "a: 1  # one\nb:\n  c: 2   # two\n  d: [1, 2]\n  f: 7\n# the end\ne: x\n"
    nested = "g:\n  cpu:\n    x: [1]\n    l:\n      - a\n  h200:\n    x: 2\n"
    assert (
        insert_key(nested, ["g", "cpu"], "y", "3")
        == "g:\n  cpu:\n    x: [1]\n    l:\n      - a\n    y: 3\n  h200:\n    x: 2\n"
    )
    flow = "gpus:\n  h200: {max_num_batched_tokens: 2048, max_num_seqs: 128}\n"
    data = yaml.safe_load(flow)
    assert set_serving_value(flow, data, "h200", "max_num_batched_tokens", 4096) == flow.replace("2048", "4096")
    with pytest.raises(ConfigError, match=r"gpus\.cpu"):
        set_serving_value(flow, data, "cpu", "max_num_batched_tokens", 4096)


# -- the command --------------------------------------------------------------------------------------------


def test_bad_candidate_lists_are_refused_before_any_server_starts(tmp_path: Path) -> None:
    env = {"VISIONCAP_MODELS_DIR": str(tmp_models(tmp_path)), "VISIONCAP_DATA_DIR": str(tmp_path / "data")}
    for args, message in (
        (["--budgets", "64,abc"], "--budgets: 'abc' is not a positive whole number"),
        (["--budgets", "512"], "at least two candidates"),
        (["--budgets", "64,512", "--thresholds", "8192"], "max_model_len"),
        (["--budgets", "64,512", "--gpu", "h200"], "no serving arguments for GPU class 'h200'"),
        (["--budgets", "64,512", "--duration-s", "3"], "--duration-s: must be above the 5 s warm-up"),
    ):
        result = invoke_cli("tune", "--profile", "tiny", "--out", str(tmp_path / "out"), *args, env=env)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in " ".join(result.stderr.split()), (args, result.stderr)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "data" / "tune" / "logs").exists()


@pytest.mark.vllm
def test_tune_measures_each_budget_against_real_vllm_and_writes_the_profile(tmp_path: Path) -> None:
    models = tmp_models(tmp_path)
    original = (models / "tiny.yaml").read_text()
    out = tmp_path / "out"
    env = {"VISIONCAP_MODELS_DIR": str(models), "VISIONCAP_DATA_DIR": str(tmp_path / "data")}
    # In this process (not a child killed on a timeout), so each candidate's vLLM is always stopped. Two
    # candidates (the fewest a choice needs) and a short measured phase: 4 s after the 2 s warm-up instead of
    # --quick's 12 s, with chat at 2/s so that the seeded schedule still sends 9 chats in it.
    args = ["tune", "--profile", "tiny", "--budgets", "64,512", "--quick", "--duration-s", "6", "--chat-rate", "2"]
    result = CliRunner().invoke(app, [*args, "--out", str(out)], env=env)
    output = result.output

    results_file, png = out / "tiny-cpu.json", out / "tiny-cpu.png"
    assert results_file.is_file(), (output[-3000:], result.exception)
    results = json.loads(results_file.read_text())
    assert results["complete"], [c["error"] for c in results["candidates"]]
    assert result.exit_code == (0 if results["objectives_met"] else 1), (output[-3000:], result.exception)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # Each candidate ran on its own server with its own budget, and measured chat and captions.
    candidates = results["candidates"]
    assert [c["max_num_batched_tokens"] for c in candidates] == [64, 512]
    for candidate in candidates:
        args = candidate["vllm_args"]
        assert args[args.index("--max-num-batched-tokens") + 1] == str(candidate["max_num_batched_tokens"])
        m = candidate["measurement"]
        assert candidate["error"] is None and m is not None
        assert m["chat_requests"] > 0 and m["captions_per_s"] > 0
        assert 0 < m["itl_p50_ms"] <= m["itl_p99_ms"] and 0 < m["ttft_p50_ms"] <= m["ttft_p99_ms"]
    assert results["reference_chat_alone"]["chat"]["ok"] > 0

    # The choice rule, recomputed from the measured numbers.
    target = results["objectives"]
    ms = [c["measurement"] for c in candidates]
    meeting = [m for m in ms if m["itl_p99_ms"] <= target["itl_p99_ms"] and m["ttft_p99_ms"] <= target["ttft_p99_ms"]]
    assert [m["meets_objectives"] for m in ms] == [m in meeting for m in ms]
    if results["objectives_met"]:
        best = max(m["captions_per_s"] for m in meeting)
        assert results["chosen"]["captions_per_s"] == best
    else:
        assert results["chosen"]["itl_p99_ms"] == min(m["itl_p99_ms"] for m in ms)
    chosen = results["chosen"]["max_num_batched_tokens"]

    # The profile now serves the chosen budget on the cpu class and says how it was chosen; the rest is as it was.
    text = (models / "tiny.yaml").read_text()
    assert results["profile_written"] == str((models / "tiny.yaml").resolve())
    profile = load_profile("tiny", models)
    assert profile.serving_for("cpu").max_num_batched_tokens == chosen
    assert profile.tuned is not None and set(profile.tuned) == {"cpu"}
    record = profile.tuned["cpu"]
    assert record.max_num_batched_tokens == chosen and record.objectives_met == results["objectives_met"]
    assert [c.max_num_batched_tokens for c in record.candidates] == [64, 512]
    assert [c.itl_p99_ms for c in record.candidates] == [m["itl_p99_ms"] for m in ms]
    assert record.hardware == results["hardware"] and record.hardware
    assert text.count(BLOCK_START) == 1 and text.rstrip().endswith(BLOCK_END)
    head = text[: text.index(BLOCK_START)]
    assert head.rstrip("\n") == original.rstrip("\n").replace(
        "max_num_batched_tokens: 512", f"max_num_batched_tokens: {chosen}"
    )


@pytest.mark.vllm
def test_tune_on_the_stand_in_serves_scaled_budgets_and_writes_the_target_only_when_faithful(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("qwen2.5-vl-7b.yaml", "standin.yaml"):
        shutil.copy(REPO / "models" / name, models / name)
    (models / "build").symlink_to(REPO / "models" / "build", target_is_directory=True)
    (models / "build_tiny_qwen2vl.py").symlink_to(REPO / "models" / "build_tiny_qwen2vl.py")
    original = (models / "qwen2.5-vl-7b.yaml").read_text()
    original_standin = (models / "standin.yaml").read_text()
    out = tmp_path / "out"
    env = {"VISIONCAP_MODELS_DIR": str(models), "VISIONCAP_DATA_DIR": str(tmp_path / "data")}
    args = ["tune", "--profile", "qwen2.5-vl-7b", "--gpu", "h200", "--stand-in", "standin", "--budgets", "1024,2048"]
    args += ["--quick", "--duration-s", "6", "--chat-rate", "2", "--out", str(out)]
    result = CliRunner().invoke(app, args, env=env)
    results_file = out / "qwen2.5-vl-7b-h200-on-standin.json"
    assert results_file.is_file(), (result.output[-3000:], result.exception)
    results = json.loads(results_file.read_text())
    assert results["complete"], [c["error"] for c in results["candidates"]]
    assert results["stand_in_for"]["profile"] == "qwen2.5-vl-7b" and results["stand_in_for"]["gpu_class"] == "h200"

    # Fidelity was measured first, and the workload resized and measured again (at most once in a quick run)
    # while it was off target; the budgets follow the frame prompt, from the scale the stand-in was sized with.
    attempts = results["fidelity_attempts"]
    sized_scale = yaml.safe_load(original_standin)["stand_in"]["workloads"]["h200"]["token_scale"]
    assert 1 <= len(attempts) <= 2 and attempts[-1]["ratio"] == results["fidelity"]["ratio"]
    scale = results["stand_in_for"]["token_scale"]
    if len(attempts) == 2:
        assert not attempts[0]["faithful"] and attempts[0]["steady"]
        assert attempts[1]["probe"] != attempts[0]["probe"]
        moved = attempts[1]["frame_prompt_tokens"] / attempts[0]["frame_prompt_tokens"]
        assert scale == pytest.approx(sized_scale * moved, rel=1e-3)
        assert results["workload"]["image_width"] == attempts[1]["probe"]["frame_width"]
    else:
        assert scale == pytest.approx(sized_scale, rel=1e-3)
    # The stand-in served each budget in its own tokens; the results speak the target's, beside the cost model.
    for candidate, budget in zip(results["candidates"], (1024, 2048), strict=True):
        args, served = candidate["vllm_args"], stand_in_tokens(budget, scale)
        assert args[args.index("--max-num-batched-tokens") + 1] == str(served)
        threshold = stand_in_tokens(1024, scale)  # the target's 1024 on h200
        assert args[args.index("--long-prefill-token-threshold") + 1] == str(threshold)
        m = candidate["measurement"]
        assert m["served_max_num_batched_tokens"] == served
        assert m["estimate"]["decode_step_ms"] > 0 and m["estimate"]["frames_encoded_per_step"] >= 1
    assert [c["max_num_batched_tokens"] for c in results["candidates"]] == [1024, 2048]
    # Each p99 has its bootstrap interval over chats; the chosen one is among the candidates tied with the best.
    for candidate in results["candidates"]:
        low, high = candidate["measurement"]["itl_p99_interval_ms"]
        assert low <= high and low > 0
    assert results["chosen"]["label"] in results["tied"]
    # The frontier objective: relative to chat alone, measured on the same server.
    reference = results["reference_chat_alone"]["chat"]
    assert results["objectives"]["itl_p99_ms"] == round(1.25 * reference["itl_ms"]["p99"], 1)
    assert results["objectives"]["ttft_p99_ms"] == round(1.5 * reference["ttft_ms"]["p99"], 1)

    # Only a faithful stand-in's choice reaches the target profile.
    fidelity = results["fidelity"]
    assert fidelity is not None and set(fidelity["ratio"]) >= {"frame_encoder_steps", "frame_prefill_steps"}
    profile = load_profile("qwen2.5-vl-7b", models)
    if fidelity["faithful"]:
        assert results["not_judged"] is None and results["profile_written"] == str(
            (models / "qwen2.5-vl-7b.yaml").resolve()
        )
        assert profile.serving_for("h200").max_num_batched_tokens == results["chosen"]["max_num_batched_tokens"]
        assert profile.tuned is not None and "standin" in (profile.tuned["h200"].measured_on or "")
    else:
        assert results["not_judged"] and results["objectives_met"] is None and results["profile_written"] is None
        assert (models / "qwen2.5-vl-7b.yaml").read_text() == original
        assert result.exit_code == 1 and "not judged" in result.output
    assert (models / "standin.yaml").read_text() == (REPO / "models" / "standin.yaml").read_text()
