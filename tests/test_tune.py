"""`visioncap tune`: candidates, the choice rule, the profile edit, and one real run against vLLM."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from helpers import REPO, run_cli
from typer.testing import CliRunner

from visioncap.cli import app
from visioncap.errors import ConfigError
from visioncap.serve import load_profile
from visioncap.tune.candidates import Candidate, build_candidates, parse_int_list
from visioncap.tune.record import TunedMeasurement, TunedObjectives
from visioncap.tune.run import choose, margins, objectives
from visioncap.tune.write import BLOCK_END, BLOCK_START, insert_key, replace_scalar, set_serving_value


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
    marked, chosen, met = choose(runs, [True, True, True], target)
    assert met and chosen == 1
    assert [m.meets_objectives for m in marked] == [True, True, False]
    found = margins(marked, chosen)
    assert found["lowest_throughput"]["candidate"] == "128"
    assert found["lowest_throughput"]["throughput_gain_pct"] == 30.0
    assert found["highest_itl_p99"]["candidate"] == "1024"
    assert found["highest_itl_p99"]["itl_p99_reduction_pct"] == 40.0
    # A phase with failures cannot be chosen, whatever its numbers.
    _, chosen, met = choose(runs, [True, False, True], target)
    assert met and chosen == 0


def test_when_none_meets_the_objectives_the_lowest_inter_token_p99_is_taken() -> None:
    runs = [measured(128, 2.0, 100, 300), measured(512, 2.6, 90, 400)]
    target = TunedObjectives(ttft_p99_ms=50, itl_p99_ms=50, ttft_source="given", itl_source="given")
    marked, chosen, met = choose(runs, [True, True], target)
    assert not met and chosen == 1
    assert not any(m.meets_objectives for m in marked)


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
        result = run_cli("tune", "--profile", "tiny", "--out", str(tmp_path / "out"), *args, env=env, timeout=60)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in " ".join(result.stderr.split()), (args, result.stderr)
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "data" / "tune" / "logs").exists()


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
