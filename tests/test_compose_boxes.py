"""docker-compose.yml on two boxes: a GPU box (profile gpu-box: vLLM, gateway, worker) and the central box (profile
central: PostgreSQL, API), rendered by the real Compose v2 binary as docs/deploy.md's commands start them.

The one-box default is tests/test_deploy.py's; here the two profiles: which services each command starts, that the
worker reaches the central database through the environment and captions on its own box, that the central API
asks a GPU box's gateway, and that the commands the services run are accepted.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from helpers import REPO
from sqlalchemy.engine import make_url
from test_deploy import ENV_EXAMPLE, compose, help_run, resolved, settings_from

pytestmark = pytest.mark.deploy

README = REPO / "docs" / "deploy.md"
# Each box's command in docs/deploy.md, and the services it must start.
BOXES = {"gpu-box": {"vllm", "gateway", "worker"}, "central": {"central-postgres", "central-api"}}
CENTRAL_URL = "postgresql+psycopg://visioncap:0123abcd@central.example.lan:5432/visioncap"
TWO_BOXES = {
    "POSTGRES_PASSWORD": "0123abcd",
    "POSTGRES_BIND": "0.0.0.0",
    "VISIONCAP_DATABASE_URL": CENTRAL_URL,
    "GATEWAY_BIND": "0.0.0.0",
    "VISIONCAP_GPU_GATEWAY_URL": "http://gpu-1.example.lan:8080/v1",
    "VISIONCAP_ASK_KEY": "vc-test-ask-key",
    "VISIONCAP_ALERTS_KEY": "vc-test-alerts-key",
    "VISIONCAP_NFS_SERVER": "nas.example.lan",
    "VISIONCAP_NFS_EXPORT": "/srv/visioncap",
}


def readme_command(profile: str) -> list[str]:
    """docs/deploy.md's `docker compose --profile PROFILE up -d SERVICE...` for that box, as arguments."""
    (line,) = set(re.findall(rf"`docker compose (--profile {profile} up -d [\w -]+)`", README.read_text()))
    return line.split()


def rendered(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The compose model of what `docker compose PROFILE up -d SERVICES` starts: its services and volumes."""
    profile, up = command[:2], command[2:]
    assert up[:2] == ["up", "-d"], command
    result = compose(*profile, "config", "--format", "json", *up[2:], env=env)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def started(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The services (and their dependencies) that `docker compose PROFILE up -d SERVICES` starts."""
    return dict(rendered(command, env)["services"])


@pytest.mark.parametrize("profile", BOXES)
def test_each_box_starts_its_services_and_no_other(profile: str) -> None:
    command = readme_command(profile)
    assert set(started(command)) == BOXES[profile]
    assert set(started(command, env=TWO_BOXES)) == BOXES[profile]
    for name, service in started(command).items():
        assert service.get("profiles", [profile]) == [profile], name  # its box's, or the one-box vllm and gateway
    result = compose(*command[:2], "config", "-q", *command[4:], env_file=ENV_EXAMPLE)
    assert result.returncode == 0, result.stderr


def test_the_gpu_box_has_no_database_or_api_and_the_central_box_no_gpu() -> None:
    gpu_box = started(readme_command("gpu-box"))
    assert not {"postgres", "central-postgres", "api", "central-api", "pipeline"} & set(gpu_box)
    central = started(readme_command("central"))
    assert all("deploy" not in service for service in central.values())
    # Without naming a service, a profile adds to the one-box set: docs/deploy.md says why it names one.
    everything = compose("--profile", "gpu-box", "config", "--services").stdout.split()
    assert {"api", "pipeline"} <= set(everything)


def test_the_worker_reaches_the_central_database_from_the_environment_and_captions_on_its_own_box() -> None:
    services = started(readme_command("gpu-box"), env=TWO_BOXES)
    worker = services["worker"]
    env = worker["environment"]
    assert env["VISIONCAP_DATABASE_URL"] == CENTRAL_URL
    unset = started(readme_command("gpu-box"))["worker"]["environment"]["VISIONCAP_DATABASE_URL"]
    assert make_url(unset).get_backend_name() == "sqlite"  # which `visioncap worker` refuses, naming the setting
    # Frames stay on the box: this box's gateway, whose upstream is this box's vLLM, on the GPU vLLM has.
    assert env["VISIONCAP_VLM_BASE_URL"] == "http://gateway:8080/v1"
    assert worker["depends_on"] == {
        name: {"condition": "service_healthy", "required": True} for name in ("vllm", "gateway")
    }
    gpus = [services[name]["deploy"]["resources"]["reservations"]["devices"] for name in ("vllm", "worker")]
    assert gpus[0] == gpus[1]
    assert services["gateway"]["ports"][0]["host_ip"] == "0.0.0.0"  # GATEWAY_BIND: the central API's Ask


def test_the_workers_health_port_listens_beyond_loopback_and_is_what_its_healthcheck_asks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = started(readme_command("gpu-box"), env=TWO_BOXES | {"WORKER_HEALTH_BIND": "0.0.0.0"})["worker"]
    command = worker["command"]
    assert command[:2] == ["visioncap", "worker"]
    result = help_run(command)
    assert result.returncode == 0, result.stderr
    options = dict(itertools.pairwise(command))
    assert options["--metrics-host"] == "0.0.0.0"
    port = int(options["--metrics-port"])
    (published,) = worker["ports"]
    assert (published["host_ip"], published["target"]) == ("0.0.0.0", port)
    probe = worker["healthcheck"]["test"][-1]
    assert f"http://127.0.0.1:{port}/readyz" in probe and worker["environment"]["HEALTHCHECK_URL"] in probe
    settings = settings_from(worker["environment"], monkeypatch)
    assert settings.database_url == CENTRAL_URL


def test_the_central_api_uses_its_own_database_and_a_gpu_boxs_gateway(monkeypatch: pytest.MonkeyPatch) -> None:
    services = started(readme_command("central"), env=TWO_BOXES)
    api, postgres = services["central-api"], services["central-postgres"]
    assert help_run(api["command"]).returncode == 0
    env = api["environment"]
    url = make_url(env["VISIONCAP_DATABASE_URL"])
    assert (url.get_backend_name(), url.host, url.port, url.password) == (
        "postgresql",
        "central-postgres",
        5432,
        "0123abcd",
    )
    assert env["VISIONCAP_VLM_BASE_URL"] == TWO_BOXES["VISIONCAP_GPU_GATEWAY_URL"]
    assert env["VISIONCAP_ASK_VLM_API_KEY"] == TWO_BOXES["VISIONCAP_ASK_KEY"]
    assert api["depends_on"] == {"central-postgres": {"condition": "service_healthy", "required": True}}
    (published,) = postgres["ports"]
    assert (published["host_ip"], published["target"]) == ("0.0.0.0", 5432)
    assert postgres["environment"]["POSTGRES_PASSWORD"] == "0123abcd"
    # Published to other machines, it has no default password: unset, the image refuses to start.
    unset = started(readme_command("central"))["central-postgres"]
    assert unset["environment"]["POSTGRES_PASSWORD"] == ""
    assert unset["ports"][0]["host_ip"] == "127.0.0.1"
    settings_from(env, monkeypatch)


def test_every_box_mounts_one_nfs_export_at_data_so_the_central_api_serves_every_boxs_frames() -> None:
    # The worker saves frames under /data and the API serves /v1/captions/{id}/image from there: on two boxes a
    # volume of each box's own would answer 404 for every image, and a worker taking over a dead worker's cameras
    # would not find their pending frames.
    mounts = {}
    for profile, service in (("gpu-box", "worker"), ("central", "central-api")):
        model = rendered(readme_command(profile), env=TWO_BOXES)
        (data,) = [mount for mount in model["services"][service]["volumes"] if mount["target"] == "/data"]
        assert data["type"] == "volume", (service, data)
        mounts[service] = model["volumes"][data["source"]]
    assert mounts["worker"] == mounts["central-api"]
    options = mounts["worker"]["driver_opts"]
    assert mounts["worker"]["driver"] == "local" and options["type"] == "nfs"
    assert options["device"] == f":{TWO_BOXES['VISIONCAP_NFS_EXPORT']}"
    assert f"addr={TWO_BOXES['VISIONCAP_NFS_SERVER']}" in options["o"].split(",")
    assert "nfsvers=4.1" in options["o"].split(",")  # the outbox journals' locks hold across machines
    # The one-box services keep their local volume.
    one_box = resolved()
    (data,) = [mount for mount in one_box["services"]["api"]["volumes"] if mount["target"] == "/data"]
    assert "driver_opts" not in one_box["volumes"][data["source"]]
