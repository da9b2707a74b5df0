"""The pipeline's health port (`--metrics-port`) on the address `--metrics-host` names: loopback unless told, and
reachable from other machines (a probe from another container or pod) once bound to 0.0.0.0.

Real parts: the composition root with the real detector and SQLite, and a client on another host (a network
namespace joined to this machine by a veth link, `visioncap.bench.netns`), as a kubelet or a compose healthcheck
from outside the container is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import pipeline_dict
from videos import make_event_video

from visioncap.bench.netns import Host, netns_problem
from visioncap.config.pipeline import PipelineConfig
from visioncap.config.settings import Settings
from visioncap.pipeline.compose import build_pipeline
from visioncap.serve import free_port

pytestmark = pytest.mark.detector


@pytest.fixture
def other_host() -> Iterator[Host]:
    problem = netns_problem()
    if problem is not None:
        pytest.fail(f"this test calls from another host, a network namespace: {problem}")
    with Host() as host:
        yield host


def healthz_from(host: Host, port: int) -> dict[str, object]:
    """/healthz as a client on `host` gets it, at this machine's address on their link; a refused or failed
    connection raises CalledProcessError, with the client's error in its output."""
    url = f"http://{host.gateway_ip}:{port}/healthz"
    probe = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    done = subprocess.run(host.command([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    return dict(json.loads(done.stdout))


@pytest.fixture
def config(tmp_path: Path) -> PipelineConfig:
    video = tmp_path / "empty.mp4"
    make_event_video(video, [(None, 1)])
    dead_vlm = f"http://127.0.0.1:{free_port()}/v1"  # never called: no frame is read before run()
    return PipelineConfig.model_validate(pipeline_dict(video, vlm={"base_url": dead_vlm, "timeout_s": 2}))


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'h.db'}", data_dir=tmp_path / "data")


def healthz(host: str, port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=10) as response:
        assert response.status == 200
        return dict(json.loads(response.read()))


def test_the_health_port_answers_from_another_host_when_bound_to_every_address(
    config: PipelineConfig, settings: Settings, other_host: Host
) -> None:
    port = free_port()
    with build_pipeline(config, settings, check_vlm=False, metrics_port=port, metrics_host="0.0.0.0"):
        assert healthz_from(other_host, port) == {"status": "ok"}
        assert healthz("127.0.0.1", port) == {"status": "ok"}  # the in-container healthcheck still works


def test_the_health_port_stays_on_loopback_by_default(
    config: PipelineConfig, settings: Settings, other_host: Host
) -> None:
    port = free_port()
    with build_pipeline(config, settings, check_vlm=False, metrics_port=port):
        assert healthz("127.0.0.1", port) == {"status": "ok"}
        with pytest.raises(subprocess.CalledProcessError) as refused:
            healthz_from(other_host, port)
        assert "Connection refused" in refused.value.stderr
