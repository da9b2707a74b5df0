"""The pipeline's health port (`--metrics-port`) on the address `--metrics-host` names: loopback unless told, and
reachable from other machines (a probe from another container or pod) once bound to 0.0.0.0.

Real parts: the composition root with the real detector and SQLite, and a client on another host (a network
namespace joined to this machine by a veth link, `visioncap.bench.common.netns`), as a kubelet or a compose healthcheck
from outside the container is.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest
from helpers import http_get_from, pipeline_dict
from videos import make_event_video

from visioncap import __version__
from visioncap.bench.common.netns import Host
from visioncap.config.pipeline import PipelineConfig
from visioncap.config.settings import Settings
from visioncap.pipeline.compose import build_pipeline
from visioncap.serve import free_port

pytestmark = pytest.mark.detector


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
        status, body = http_get_from(other_host, port, "/healthz")
        assert (status, json.loads(body)) == (200, {"status": "ok", "version": __version__})
        assert healthz("127.0.0.1", port) == {
            "status": "ok",
            "version": __version__,
        }  # the in-container healthcheck still works


def test_the_health_port_stays_on_loopback_by_default(
    config: PipelineConfig, settings: Settings, other_host: Host
) -> None:
    port = free_port()
    with build_pipeline(config, settings, check_vlm=False, metrics_port=port):
        assert healthz("127.0.0.1", port) == {"status": "ok", "version": __version__}
        with pytest.raises(subprocess.CalledProcessError) as refused:
            http_get_from(other_host, port, "/healthz")
        assert "Connection refused" in refused.value.stderr
