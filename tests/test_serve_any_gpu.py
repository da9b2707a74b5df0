"""Serving on a GPU outside the classes (l4, a10, a100, h100, h200): nvidia-smi's name, memory and compute
capability, figures from the card table or its architecture, budgets derived from the nearest classes, and a
plan that says what it assumed; the known classes plan exactly as before.

The GPUs here are recorded nvidia-smi answers printed by an `nvidia-smi` script put first on PATH: the machine
that runs the tests has none of these cards (a fake for hardware that cannot be produced here). The plan runs
for real on them: the launcher's own entry, its JSON and its report.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import REPO

from visioncap.config.settings import Settings
from visioncap.serve.command import main as serve_main

ServeCli = Callable[..., "subprocess.CompletedProcess[str]"]
MODELS = REPO / "models"
REAL_PROFILES = ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "smolvlm")
# What nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits prints for each card.
RTX_4090 = "NVIDIA GeForce RTX 4090, 24564, 8.9"
L40S = "NVIDIA L40S, 46068, 8.9"
T4 = "Tesla T4, 15360, 7.5"
V100 = "Tesla V100-SXM2-32GB, 32768, 7.0"
# The known classes' cards as the same query prints them (the memory is each class's nominal).
KNOWN = {
    "l4": ("NVIDIA L4, 23034", "8.9"),
    "a10": ("NVIDIA A10, 23028", "8.6"),
    "a100": ("NVIDIA A100-SXM4-80GB, 81920", "8.0"),
    "h100": ("NVIDIA H100 80GB HBM3, 81559", "9.0"),
    "h200": ("NVIDIA H200, 143771", "9.0"),
}


def fake_nvidia_smi(directory: Path, *lines: str) -> dict[str, str]:
    """A PATH whose `nvidia-smi` prints these recorded lines to any query."""
    script = directory / "nvidia-smi"
    body = "".join(f"printf '%s\\n' '{line}'\n" for line in lines)
    script.write_text(f"#!/bin/sh\n{body}")
    script.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}


@pytest.fixture
def serve_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> ServeCli:
    """`visioncap serve ARGS`: the command's entry function in this process, its exit code and output."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        with monkeypatch.context() as patched:
            patched.chdir(REPO)
            for name, value in (env or {}).items():
                patched.setenv(name, value)
            settings = Settings()
            code = serve_main(
                list(args), prog="visioncap serve", models_dir=settings.models_dir, python=settings.server_python
            )
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["visioncap", "serve", *args], code, out.out, out.err)

    return run


def flags(argv: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else ""
            values[arg] = "" if following.startswith("--") else following
    return values


def json_plan(serve_cli: ServeCli, tmp_path: Path, profile: str, *lines: str) -> dict:
    result = serve_cli("--profile", profile, "--dry-run", "--format", "json", env=fake_nvidia_smi(tmp_path, *lines))
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- reading nvidia-smi --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        (RTX_4090 + "\n", [("NVIDIA GeForce RTX 4090", 24564, "8.9")]),
        (L40S + "\n", [("NVIDIA L40S", 46068, "8.9")]),
        (T4 + "\n", [("Tesla T4", 15360, "7.5")]),
        (
            "NVIDIA GeForce RTX 4090, 24564, 8.9\nNVIDIA GeForce RTX 3090, 24576, 8.6\n",
            [("NVIDIA GeForce RTX 4090", 24564, "8.9"), ("NVIDIA GeForce RTX 3090", 24576, "8.6")],
        ),
        # A driver before compute_cap (the fallback query), and one that cannot say it.
        ("NVIDIA H200, 143771\n", [("NVIDIA H200", 143771, None)]),
        ("NVIDIA A10, 23028, [N/A]\n", [("NVIDIA A10", 23028, None)]),
        # Units left on, spaces, a comma inside a name.
        ("  NVIDIA L4 ,  23034 MiB ,  8.9  \n", [("NVIDIA L4", 23034, "8.9")]),
        ("Vendor, Model X, 16384, 8.6\n", [("Vendor, Model X", 16384, "8.6")]),
        # Garbage: nothing to guess from, so no GPU (the plan then falls back to the CPU).
        ("No devices were found\n", []),
        ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", []),
        ("name, memory.total [MiB], compute_cap\n\n", []),
        ("Tesla T4, [N/A], 7.5\nNVIDIA L4, 0, 8.9\n, 1024, 8.0\n", []),
    ],
)
def test_nvidia_smi_output_is_read_robustly(output: str, expected: list[tuple[str, int, str | None]]) -> None:
    from visioncap.serve.gpu_probe import parse_query

    assert [(g.name, g.total_mib, g.compute_cap) for g in parse_query(output)] == expected


def test_an_old_driver_without_compute_cap_is_asked_the_two_fields(tmp_path: Path) -> None:
    """A driver that refuses the compute_cap field (as drivers before R510 do, recorded) still gives the GPU."""
    from visioncap.serve.gpu_probe import NvidiaSmi

    script = tmp_path / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        'case "$1" in *compute_cap*) echo \'Field "compute_cap" is not a valid field to query.\'; exit 2;; esac\n'
        "printf '%s\\n' 'NVIDIA A10, 23028'\n"
    )
    script.chmod(0o755)
    [gpu] = NvidiaSmi(str(script))()
    assert (gpu.name, gpu.total_mib, gpu.compute_cap) == ("NVIDIA A10", 23028, None)


# -- a card outside the classes ------------------------------------------------------------------------------


def test_rtx_4090_is_served_with_derived_budgets(tmp_path: Path, serve_cli: ServeCli) -> None:
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", RTX_4090)
    args = flags(plan["command"])
    # Memory (24.0 GiB) -> l4's KV values; compute (165 TFLOP/s) -> a10's chunk budget (the fastest class below).
    assert args["--max-model-len"] == "8192" and args["--max-num-seqs"] == "16"
    assert args["--max-num-batched-tokens"] == "512" and args["--long-prefill-token-threshold"] == "256"
    assert plan["gpu_memory_utilization"] == 0.89 and args["--gpu-memory-utilization"] == "0.89"
    assert plan["total_gib"] == pytest.approx(23.99, abs=0.01) and "--dtype" not in args
    assert plan["gpu"] == {
        "name": "NVIDIA GeForce RTX 4090",
        "total_gib": 23.99,
        "compute_cap": "8.9",
        "architecture": "Ada Lovelace",
        "bf16_tflops": 165.2,
        "bandwidth_tb_s": 1.008,
        "dtype": "bfloat16",
        "figures_from": "the table's GeForce RTX 4090 row (NVIDIA Ada GPU architecture whitepaper)",
    }
    # The cost model runs on the card's own figures, not the class it starts from.
    assert plan["cost_model"]["gpu"]["name"] == "GeForce RTX 4090"
    assert plan["cost_model"]["budget"]["max_num_batched_tokens"] == 512


def test_the_dry_run_names_what_it_assumed(tmp_path: Path, serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run", env=fake_nvidia_smi(tmp_path, RTX_4090))
    assert result.returncode == 0, result.stderr
    assert "--max-num-batched-tokens 512" in result.stdout
    lines = result.stderr.splitlines()
    assumed = [line for line in lines if line.startswith("serve: assumed: ")]
    assert assumed == [
        "serve: assumed: NVIDIA GeForce RTX 4090 (compute capability 8.9, Ada Lovelace): 165.2 TFLOP/s bf16 dense, "
        "1.008 TB/s, from the table's GeForce RTX 4090 row (NVIDIA Ada GPU architecture whitepaper); efficiencies "
        "as measured on an H200",
        "serve: assumed: max_model_len 8192, max_num_seqs 16 from l4 (22.5 GiB, the most memory not above this "
        "card's 24.0 GiB)",
        "serve: assumed: max_num_batched_tokens 512, long_prefill_token_threshold 256 from a10 (125 TFLOP/s, the "
        "fastest class not above this card's 165.2)",
    ]
    assert "serve: GPU class: l4 (none for 'NVIDIA GeForce RTX 4090'" in result.stderr
    assert "serve: cost model: Qwen2.5-VL-7B on GeForce RTX 4090 (165.2 TFLOP/s bf16, 1.008 TB/s" in result.stderr
    # The JSON says the same assumptions, as a field.
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", RTX_4090)
    assert [f"serve: assumed: {line}" for line in plan["assumed"]] == assumed


def test_l40s_takes_kv_values_from_memory_and_its_chunk_budget_from_compute(
    tmp_path: Path, serve_cli: ServeCli
) -> None:
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", L40S)
    args = flags(plan["command"])
    assert plan["gpu"]["bf16_tflops"] == 362 and plan["gpu"]["architecture"] == "Ada Lovelace"
    # 45 GiB: still only l4's KV values (no class between 22.5 and 79.6 GiB); 362 TFLOP/s: a100's budget.
    assert args["--max-model-len"] == "8192" and args["--max-num-seqs"] == "16"
    assert args["--max-num-batched-tokens"] == "1024" and args["--long-prefill-token-threshold"] == "512"
    assert plan["gpu_memory_utilization"] == 0.94  # (45.0 - 2.5) / 45.0: the card's memory, not the class's
    assert any("from a100 (312 TFLOP/s" in line for line in plan["assumed"])


def test_t4_runs_float16_and_says_so(tmp_path: Path, serve_cli: ServeCli) -> None:
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-3b", T4)
    args = flags(plan["command"])
    assert args["--dtype"] == "float16" and plan["gpu"]["dtype"] == "float16"
    assert plan["gpu"]["bf16_tflops"] == 65  # the fp16 rate: Turing has no bf16
    assert any("has no bf16 (compute capability 7.5): --dtype float16" in line for line in plan["assumed"])
    # Slower than every class: l4's 1024-token budget scaled by 65/121 (550) and rounded down to 512; memory below
    # every class: the smallest class's 32 sequences scaled by 15.0/22.5 GiB.
    assert args["--max-num-batched-tokens"] == "512" and args["--max-num-seqs"] == "21"
    too_big = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run", env=fake_nvidia_smi(tmp_path, T4))
    assert too_big.returncode == 2
    assert "not enough GPU memory for profile 'qwen2.5-vl-7b' on Tesla T4 (15.0 GiB total)" in too_big.stderr


def test_v100_is_refused_with_the_reason(tmp_path: Path, serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run", env=fake_nvidia_smi(tmp_path, V100))
    assert result.returncode == 2 and result.stdout == ""
    assert (
        "error: 'Tesla V100-SXM2-32GB' has compute capability 7.0: vLLM's CUDA builds (PyTorch with CUDA 12.8 or "
        "13) start at Turing, 7.5, so vLLM cannot run this model there" in result.stderr
    )
    assert "--gpu" not in result.stderr  # no class would make it run


def test_an_unnamed_card_is_estimated_from_its_architecture_conservatively(tmp_path: Path, serve_cli: ServeCli) -> None:
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", "NVIDIA RTX 6000 Ada Generation, 49140, 8.9")
    card = plan["gpu"]
    assert card["figures_from"].startswith("estimated for Ada Lovelace: the lowest TFLOP/s and TB/s per GB")
    # Never above what the architecture's 48 GB datasheet rows (L40 181 TFLOP/s, L40S 0.864 TB/s) promise.
    assert 100 < card["bf16_tflops"] <= 181.05 and 0.3 < card["bandwidth_tb_s"] <= 0.864
    assert plan["cost_model"]["gpu"]["name"] == "NVIDIA RTX 6000 Ada Generation"


def test_a_card_of_no_known_architecture_asks_for_a_class(tmp_path: Path, serve_cli: ServeCli) -> None:
    result = serve_cli(
        "--profile", "qwen2.5-vl-7b", "--dry-run", env=fake_nvidia_smi(tmp_path, "NVIDIA Next, 98304, 13.0")
    )
    assert result.returncode == 2
    assert "no figures for 'NVIDIA Next', compute capability 13.0: no architecture in the table" in result.stderr
    assert "pass --gpu with the closest of l4, a10, a100, h100, h200" in result.stderr


def test_two_cards_plan_for_the_first(tmp_path: Path, serve_cli: ServeCli) -> None:
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", RTX_4090, "NVIDIA GeForce RTX 3090, 24576, 8.6")
    assert plan["report"][0] == (
        "GPU: NVIDIA GeForce RTX 4090, 24.0 GiB (nvidia-smi) (first of 2; vLLM uses CUDA_VISIBLE_DEVICES)"
    )
    assert plan["gpu"]["name"] == "NVIDIA GeForce RTX 4090"


# -- the known classes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpu_class", list(KNOWN))
def test_a_known_class_still_gives_exactly_todays_plan(gpu_class: str, tmp_path: Path, serve_cli: ServeCli) -> None:
    """The plan 8f66f28 made for the compose profile on each class's card (tests/serve_plans_8f66f28.json: the
    command after the entry script, the report with its cost model, the split), now read with compute_cap; the one
    change since is deliberate: four images a prompt (`--limit-mm-per-prompt`), for events described from several
    frames (issue 45)."""
    recorded = json.loads((REPO / "tests" / "serve_plans_8f66f28.json").read_text())[gpu_class]
    line, capability = KNOWN[gpu_class]
    plan = json_plan(serve_cli, tmp_path, "qwen2.5-vl-7b", f"{line}, {capability}")
    assert {key: plan[key] for key in ("gpu_class", "gpu_memory_utilization", "total_gib", "report")} | {
        "args": plan["command"][2:]
    } == recorded
    assert plan["gpu"] is None and plan["assumed"] == []


@pytest.mark.parametrize("profile", REAL_PROFILES)
def test_every_profile_plans_the_same_on_a_known_class_with_compute_cap(
    profile: str, tmp_path: Path, serve_cli: ServeCli
) -> None:
    for gpu_class, (line, capability) in KNOWN.items():
        before = json_plan(serve_cli, tmp_path, profile, line)  # the two fields 8f66f28 asked for
        after = json_plan(serve_cli, tmp_path, profile, f"{line}, {capability}")
        assert after == before, gpu_class
        assert after["gpu_class"] == gpu_class


def test_the_command_line_still_prints_a_known_class_plan_as_a_shell_command(
    tmp_path: Path, serve_cli: ServeCli
) -> None:
    line, capability = KNOWN["h200"]
    result = serve_cli(
        "--profile", "qwen2.5-vl-7b", "--dry-run", env=fake_nvidia_smi(tmp_path, f"{line}, {capability}")
    )
    assert result.returncode == 0, result.stderr
    assert flags(shlex.split(result.stdout))["--gpu-memory-utilization"] == "0.98"
    assert "serve: GPU class: h200 (from the name)" in result.stderr and "assumed:" not in result.stderr
