"""The launcher: the command it builds, its errors, and the server it started for the session."""

from __future__ import annotations

import base64
import io
import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from helpers import REPO, TINY_MODEL, children_of, run_cli, wait_for
from PIL import Image

from visioncap.config.profiles import ImageSpec, load_profile
from visioncap.config.settings import Settings
from visioncap.errors import ConfigError
from visioncap.serve import VllmServer, free_port
from visioncap.serve.command import flag_naming
from visioncap.serve.command import main as serve_main
from visioncap.serve.launcher import group_members
from visioncap.serve.plan import PlanError, classify, plan_serving

ServeCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def serve_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> ServeCli:
    """`visioncap serve ARGS` for the dry runs and plan errors: the command's own entry function (what the
    Typer command calls with the settings) in this process, its exit code and output as a child's would be. A
    child process per case cost a second of imports; the entries themselves run as children in
    test_both_entries_are_one_command_line_with_one_set_of_defaults, and what starts a server in others."""

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        with monkeypatch.context() as patched:
            patched.chdir(REPO)
            for name, value in (env or {}).items():
                patched.setenv(name, value)
            settings = Settings()
            try:
                code = serve_main(
                    list(args), prog="visioncap serve", models_dir=settings.models_dir, python=settings.server_python
                )
            except SystemExit as exc:  # argparse's own errors
                code = exc.code if isinstance(exc.code, int) else 2
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["visioncap", "serve", *args], code, out.out, out.err)

    return run


def test_dry_run_prints_the_full_vllm_command(serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "tiny", "--port", "8123", "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    assert argv[1].endswith("visioncap/serve/vllm_entry.py") and argv[2] == "serve"
    assert Path(argv[3]) == REPO / "models" / "build" / "tiny-qwen2vl"
    joined = " ".join(argv)
    for expected in (f"--served-model-name {TINY_MODEL}", "--port 8123", "--scheduling-policy priority"):
        assert expected in joined


def test_unknown_profile_is_a_clear_error(serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "no-such-model", "--dry-run")
    assert result.returncode == 2
    assert "profile 'no-such-model' not found" in result.stderr and "tiny" in result.stderr


def test_missing_server_environment_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("serve", "--profile", "tiny", env={"VISIONCAP_SERVER_PYTHON": str(tmp_path / "nope")})
    assert result.returncode == 1
    assert "vLLM server environment not found" in result.stderr and "make server-env" in result.stderr


def test_session_server_serves_the_tiny_model(vllm_server: VllmServer) -> None:
    models = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TINY_MODEL]
    # The chat template of the built model turns one image part into vision tokens.
    response = httpx.post(
        f"{vllm_server.base_url}/chat/completions",
        json={
            "model": TINY_MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4


# -- GPU classes, memory split and the real profiles ---------------------------------------------------------

REAL_PROFILES = ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "smolvlm")
MODELS = REPO / "models"


def flag_values(argv: list[str]) -> dict[str, str]:
    """`--flag value` pairs of a command (flags without a value map to "")."""
    values: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else ""
            values[arg] = "" if following.startswith("--") else following
    return values


def fake_nvidia_smi(directory: Path, line: str) -> dict[str, str]:
    """A PATH with an `nvidia-smi` that answers the launcher's query like the real one (no GPU here)."""
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' '{line}'\n")
    script.chmod(0o755)
    return {"PATH": f"{directory}:{os.environ['PATH']}"}


def test_tiny_dry_run_reports_the_cpu_class(serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "tiny", "--dry-run")
    assert result.returncode == 0, result.stderr
    flags = flag_values(shlex.split(result.stdout.strip()))
    assert flags["--max-num-batched-tokens"] == "512" and flags["--dtype"] == "float32"
    assert "--gpu-memory-utilization" not in flags
    assert "GPU class: cpu" in result.stderr


@pytest.mark.parametrize("name", REAL_PROFILES)
def test_real_profile_dry_run_on_a_simulated_h200(name: str, serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", name, "--gpu", "h200", "--gpu-memory-gib", "141", "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    profile = load_profile(name, MODELS)
    h200 = profile.serving_for("h200")
    assert argv[2:4] == ["serve", profile.model]
    flags = flag_values(argv)
    assert flags["--served-model-name"] == profile.served_model_name
    # (141 - 1.5 detector - 1.0 headroom) / 141 = 0.982, rounded down.
    assert flags["--gpu-memory-utilization"] == "0.98"
    assert flags["--max-num-batched-tokens"] == str(h200.max_num_batched_tokens)
    assert flags["--long-prefill-token-threshold"] == str(h200.long_prefill_token_threshold)
    assert flags["--max-num-seqs"] == str(h200.max_num_seqs)
    assert flags["--max-model-len"] == str(h200.max_model_len)
    assert json.loads(flags["--limit-mm-per-prompt"]) == {"image": 4, "video": 0}  # an event's frames
    assert flags["--mm-processor-cache-gb"] == "0"
    assert flags["--scheduling-policy"] == "priority"
    assert "max_pixels" in flags["--mm-processor-kwargs"] or "longest_edge" in flags["--mm-processor-kwargs"]
    assert "--max-num-partial-prefills" not in flags  # vLLM V1 refuses values above 1
    assert "0.98 = (141.0 GiB total - 1.5 GiB detector - 1.0 GiB headroom) / 141.0 GiB" in result.stderr
    assert "KV cache holds" in result.stderr


def test_detector_and_headroom_set_the_utilization(serve_cli: ServeCli) -> None:
    result = serve_cli(
        "--profile", "qwen2.5-vl-7b", "--gpu", "h100", "--gpu-memory-gib", "80",
        "--detector-gib", "10", "--headroom-gib", "2", "--dry-run", "--format", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["gpu_class"] == "h100" and plan["gpu_memory_utilization"] == 0.85  # (80 - 12) / 80
    assert flag_values(plan["command"])["--gpu-memory-utilization"] == "0.85"
    assert any("10.0 GiB detector - 2.0 GiB headroom" in line for line in plan["report"])


def test_too_little_gpu_memory_is_a_clear_error(serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "qwen3-vl-8b", "--gpu", "l4", "--gpu-memory-gib", "16", "--dry-run")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "not enough GPU memory for profile 'qwen3-vl-8b' on l4 (16.0 GiB total)" in result.stderr
    assert "weights 16.3 GiB" in result.stderr


def test_unknown_gpu_class_is_a_clear_error(serve_cli: ServeCli) -> None:
    result = serve_cli("--profile", "qwen2.5-vl-7b", "--gpu", "tpu", "--dry-run")
    assert result.returncode == 2
    assert "--gpu must be auto or one of cpu, l4, a10, a100, h100, h200, not 'tpu'" in result.stderr


@pytest.mark.parametrize(
    ("choices", "field_says", "flag_says"),
    [
        ({"gpu": "tpu"}, "gpu must be auto or one of", "--gpu must be auto or one of"),
        ({"detector_gib": -1}, "detector_gib and headroom_gib must not", "--detector-gib and --headroom-gib must not"),
        ({"gpu_memory_gib": 0}, "gpu_memory_gib must be positive", "--gpu-memory-gib must be positive"),
        ({}, "pass gpu=CLASS dry_run=True to see", "pass --gpu CLASS --dry-run to see"),
    ],
)
def test_plan_errors_name_the_options_field_and_the_command_line_its_flag(
    choices: dict[str, object], field_says: str, flag_says: str
) -> None:
    """The library speaks of ServeOptions fields (callers other than the command line have no flags); the
    command line says the same error with its flags."""
    profile = load_profile("qwen2.5-vl-7b", MODELS)
    with pytest.raises(PlanError) as caught:
        plan_serving(profile, gpus=[], **choices)  # type: ignore[arg-type]
    assert field_says in str(caught.value) and "--" not in str(caught.value)
    assert flag_says in caught.value.naming(flag_naming)


def test_both_entries_are_one_command_line_with_one_set_of_defaults() -> None:
    """`visioncap serve` and `python -m visioncap.serve` (compose's vllm service) parse the same options with the
    same defaults: the same profile and the same command without any option."""
    env = {"VISIONCAP_MODELS_DIR": str(MODELS)}
    typer_entry = run_cli("serve", "--dry-run", env=env)
    module_entry = subprocess.run(
        [sys.executable, "-m", "visioncap.serve", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=REPO,
        check=False,
    )
    assert typer_entry.returncode == 0, typer_entry.stderr
    assert module_entry.returncode == 0, module_entry.stderr
    assert module_entry.stdout == typer_entry.stdout
    assert f"--served-model-name {TINY_MODEL}" in typer_entry.stdout and "--port 8000" in typer_entry.stdout
    usage = run_cli("serve", "--help").stdout
    assert usage.startswith("usage: visioncap serve") and "--served-model-alias NAME" in usage


def test_gpu_class_and_memory_come_from_nvidia_smi(tmp_path: Path, serve_cli: ServeCli) -> None:
    env = fake_nvidia_smi(tmp_path, "NVIDIA H200, 143771")
    result = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["gpu_class"] == "h200" and plan["total_gib"] == pytest.approx(140.4, abs=0.05)
    assert plan["gpu_memory_utilization"] == 0.98
    assert "GPU: NVIDIA H200, 140.4 GiB (nvidia-smi)" in plan["report"]


def test_cpu_only_profile_stays_on_the_cpu_beside_a_gpu(tmp_path: Path, serve_cli: ServeCli) -> None:
    env = fake_nvidia_smi(tmp_path, "NVIDIA L4, 23034")
    result = serve_cli("--profile", "tiny", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "GPU class: cpu (the profile has no l4 arguments, only cpu ones)" in result.stderr
    assert "--gpu-memory-utilization" not in result.stdout


def test_unknown_gpu_name_asks_for_a_class(tmp_path: Path, serve_cli: ServeCli) -> None:
    """A card neither in the classes nor in the card table, from a driver that gives no compute capability: no
    figures to derive a plan from (cards that have them: tests/test_serve_any_gpu.py)."""
    env = fake_nvidia_smi(tmp_path, "NVIDIA Mystery 9000, 24564")
    result = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run", env=env)
    assert result.returncode == 2
    assert "no figures for 'NVIDIA Mystery 9000'" in result.stderr
    assert "pass --gpu with the closest of l4, a10, a100, h100, h200" in result.stderr
    ok = serve_cli("--profile", "qwen2.5-vl-7b", "--gpu", "l4", "--dry-run", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "total memory: 24.0 GiB (nvidia-smi memory.total)" in ok.stderr


def test_real_profile_without_a_gpu_dry_runs_its_first_class_but_does_not_start(serve_cli: ServeCli) -> None:
    dry = serve_cli("--profile", "qwen2.5-vl-7b", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "GPU class: l4 (no GPU here" in dry.stderr and "nominal for l4" in dry.stderr
    real = run_cli("serve", "--profile", "qwen2.5-vl-7b")  # not a dry run: a child process, bounded in time
    assert real.returncode == 2
    assert "no NVIDIA GPU found and profile 'qwen2.5-vl-7b' has no cpu class" in real.stderr


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A10G", "a10"),
        ("NVIDIA A10", "a10"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", None),
        ("Tesla T4", None),
    ],
)
def test_gpu_names_map_to_classes(name: str, expected: str | None) -> None:
    assert classify(name, 81559) == expected


@pytest.mark.vllm
def test_every_profile_command_parses_with_the_real_vllm_parser() -> None:
    """vLLM's own argument parser and scheduler checks, in the server environment, for every profile and class."""
    commands: dict[str, list[str]] = {}
    for path in sorted(MODELS.glob("*.yaml")):
        profile = load_profile(path.stem, MODELS)
        for gpu_class in profile.gpu_classes() or ["cpu"]:
            plan = plan_serving(profile, gpu=gpu_class, gpus=[], dry_run=True)
            server = VllmServer(profile, python=Path("python"), plan=plan)
            commands[f"{profile.name}/{gpu_class}"] = server.command()[3:]  # what follows `vllm serve`
    assert len(commands) >= 2 + 5 * 5
    # A control the parser must refuse, so a silently passing checker cannot hide behind it.
    commands["control/partial-prefills"] = ["m", "--max-num-partial-prefills", "2"]
    commands["control/budget-below-seqs"] = ["m", "--max-num-batched-tokens", "8", "--max-num-seqs", "16"]
    result = subprocess.run(
        [os.environ["VISIONCAP_SERVER_PYTHON"], str(REPO / "tests" / "vllm_args_check.py")],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    problems = json.loads(result.stdout.strip().splitlines()[-1])
    assert "unrecognized arguments: --max-num-partial-prefills" in problems.pop("control/partial-prefills")
    assert "must be greater than or equal to max_num_seqs" in problems.pop("control/budget-below-seqs")
    assert problems == dict.fromkeys(problems)


def test_profile_rejects_a_flag_set_twice(tmp_path: Path) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(
        "name: twice\nserved_model_name: twice\nmodel: some/model\n"
        "serving: {max_num_batched_tokens: 1024}\nvllm_args: [--max-num-batched-tokens, '2048']\n"
    )
    with pytest.raises(ConfigError, match="--max-num-batched-tokens set both as a field and in the argument lists"):
        load_profile(str(path), tmp_path)


def test_profile_rejects_what_vllm_would_refuse(tmp_path: Path) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(
        "name: small\nserved_model_name: small\nmodel: some/model\n"
        "gpus: {l4: {max_num_batched_tokens: 8, max_num_seqs: 16}}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_profile(str(path), tmp_path)
    assert "gpus.l4: max_num_batched_tokens (8) < max_num_seqs (16)" in str(caught.value)


def test_a_tuned_budget_overrides_one_class_only() -> None:
    profile = load_profile("qwen2.5-vl-7b", MODELS)
    tuned = profile.with_serving("h100", max_num_batched_tokens=3072, long_prefill_token_threshold=768)
    assert tuned.serving_for("h100").max_num_batched_tokens == 3072
    assert tuned.serving_for("h100").max_num_seqs == profile.serving_for("h100").max_num_seqs
    assert tuned.serving_for("h200") == profile.serving_for("h200")
    flags = flag_values(tuned.command_args("h100", 0.9))
    assert flags["--max-num-batched-tokens"] == "3072" and flags["--long-prefill-token-threshold"] == "768"
    # A profile that lists its budget in vllm_args (tiny-bench) gets the tuned one instead, not both.
    bench = load_profile("tiny-bench", MODELS).with_serving("cpu", max_num_batched_tokens=128)
    args = bench.command_args("cpu")
    assert args.count("--max-num-batched-tokens") == 1 and args[args.index("--max-num-batched-tokens") + 1] == "128"


def _healthy(root: str) -> bool:
    try:
        return httpx.get(f"{root}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


SMALL_MAX_PIXELS = 256 * 28 * 28


class ServeCommand:
    """`visioncap serve --profile tiny` as a user runs it, over a models folder whose tiny profile sets a smaller
    image.max_pixels. A vLLM start costs ~30-60 s here, so the command's own test and the max_pixels test share
    this one server instead of starting one each."""

    def __init__(self, models: Path, log: Path) -> None:
        self.models = models
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.root = ""

    def start(self) -> None:
        """Start the command unless it runs; running() waits for it."""
        if self.process is not None and self.process.poll() is None:
            return
        port = free_port()
        self.root = f"http://127.0.0.1:{port}"
        with self.log.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "visioncap", "serve", "--profile", "tiny", "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=REPO,
                env={**os.environ, "VISIONCAP_MODELS_DIR": str(self.models)},
            )

    def running(self) -> subprocess.Popen[bytes]:
        """The command, started (again, if a test stopped it) and reported ready by its own log line."""
        self.start()
        process = self.process
        assert process is not None
        wait_for(
            lambda: process.poll() is not None or "vLLM ready at" in self.log.read_text(),
            300,
            "serve to report ready",
        )
        assert process.poll() is None, self.log.read_text()[-3000:]
        return process

    def stop(self) -> int | None:
        """SIGTERM, as a service manager stops it; the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


@pytest.fixture(scope="module")
def serve_command(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeCommand]:
    models = tmp_path_factory.mktemp("serve-models")
    text = (MODELS / "tiny.yaml").read_text()
    smaller = text.replace("  token_size: 28", f"  max_pixels: {SMALL_MAX_PIXELS}\n  token_size: 28", 1)
    assert smaller != text, "tiny.yaml has no image.token_size line to put max_pixels beside"
    (models / "tiny.yaml").write_text(smaller)
    # The built model and its builder are shared, not copied (the profile's paths are relative to its file).
    (models / "build").symlink_to(MODELS / "build", target_is_directory=True)
    (models / "build_tiny_qwen2vl.py").symlink_to(MODELS / "build_tiny_qwen2vl.py")
    command = ServeCommand(models, models / "serve.log")
    try:
        yield command
    finally:
        command.stop()


@pytest.fixture(scope="module", autouse=True)
def _serve_command_starts_early(request: pytest.FixtureRequest) -> None:
    """When a selected test needs the command's server, start it with the module's first test: its vLLM start
    (mostly single-threaded imports) then overlaps the dry runs and the parser check on the other core."""
    selected = (item for item in request.session.items if getattr(item, "module", None) is request.module)
    if any("serve_command" in getattr(item, "fixturenames", ()) for item in selected):
        request.getfixturevalue("serve_command").start()


def _image_prompt_tokens(base_url: str, width: int, height: int) -> int:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(buffer, format="JPEG")
    url = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    body = {
        "model": TINY_MODEL,
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        "max_tokens": 1,
        "temperature": 0,
    }
    response = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return int(response.json()["usage"]["prompt_tokens"])


# Before the SIGTERM test, which stops the command: in file order one vLLM start serves both (in another order
# running() starts it again).
def test_profile_max_pixels_reaches_the_image_processor(vllm_server: VllmServer, serve_command: ServeCommand) -> None:
    """image.max_pixels becomes --mm-processor-kwargs, and vLLM's processor really shrinks images to it."""
    smaller = load_profile("tiny", serve_command.models)
    assert smaller.image == ImageSpec(token_size=28, max_pixels=SMALL_MAX_PIXELS)
    assert flag_values(smaller.command_args("cpu"))["--mm-processor-kwargs"] == '{"max_pixels": 200704}'
    assert "--mm-processor-kwargs" not in load_profile("tiny", MODELS).command_args("cpu")
    full = _image_prompt_tokens(vllm_server.base_url, 640, 480)
    serve_command.running()
    shrunk = _image_prompt_tokens(f"{serve_command.root}/v1", 640, 480)
    # 640x480 is 23 x 17 = 391 tokens at the model's default; at 256 x 28^2 pixels, 18 x 13 = 234.
    assert full - shrunk == 391 - 234


@pytest.mark.vllm
def test_serve_command_starts_tiny_and_stops_it_on_sigterm(serve_command: ServeCommand) -> None:
    """`visioncap serve --profile tiny` as a user runs it: healthy, answering, gone with its workers on SIGTERM."""
    try:
        # The command's own report that vLLM is healthy (awaited by running()), then the server itself.
        process = serve_command.running()
        root = serve_command.root
        assert [m["id"] for m in httpx.get(f"{root}/v1/models", timeout=10).json()["data"]] == [TINY_MODEL]
        (vllm_pid,) = children_of(process.pid)  # vLLM leads its own process group
    finally:
        returncode = serve_command.stop()
    log = serve_command.log.read_text()
    assert "serve: GPU class: cpu" in log
    assert returncode in (0, -signal.SIGTERM), log[-3000:]
    assert group_members(vllm_pid) == []
    assert not _healthy(root)
