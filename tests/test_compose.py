"""The composition root: `build_pipeline` wires a runnable pipeline from a config and the settings, checks what
it can before the slow parts load, closes what it opened, and `stop_on_signals` lets SIGTERM/Ctrl-C stop it.

Real parts throughout: the detector, SQLite, an MJPEG camera; the VLM is a closed port, so selected frames stay
pending, which is all these tests need of it.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from helpers import pipeline_dict, wait_for
from servers.mjpeg_server import MjpegServer
from videos import FPS, make_event_video

from visioncap.config.pipeline import PipelineConfig
from visioncap.config.settings import Settings
from visioncap.errors import ConfigError, VlmUnavailableError
from visioncap.pipeline.compose import build_pipeline, stop_on_signals
from visioncap.serve import free_port
from visioncap.store import CaptionStore, create_db_engine

# How long a test waits for its condition: a bound on a broken test, never a measurement.
WAIT_S = 120.0


@pytest.fixture
def dead_vlm() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}", data_dir=tmp_path / "data")


@pytest.fixture(scope="module")
def person_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose-video") / "person.mp4"
    make_event_video(path, [(None, 1), ("zidane-right", 3)])
    return path


def config_for(video: Path, dead_vlm: str, **sections: dict[str, object]) -> PipelineConfig:
    data = pipeline_dict(video, vlm={"base_url": dead_vlm, "timeout_s": 2}, **sections)
    return PipelineConfig.model_validate(data)


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_dead_vlm_fails_the_build_naming_the_fields_to_fix(
    person_video: Path, dead_vlm: str, settings: Settings
) -> None:
    with pytest.raises(VlmUnavailableError, match=r"unreachable.*vlm\.base_url / VISIONCAP_VLM_BASE_URL"):
        build_pipeline(config_for(person_video, dead_vlm), settings)


def test_a_served_profile_must_serve_the_configured_model(
    person_video: Path, dead_vlm: str, settings: Settings
) -> None:
    config = config_for(person_video, dead_vlm)
    config = config.model_copy(update={"vlm": config.vlm.model_copy(update={"model": "some/other-model"})})
    with pytest.raises(ConfigError) as raised:
        build_pipeline(config, settings, serve="tiny")
    message = str(raised.value)
    assert "vlm.model is 'some/other-model' but model profile 'tiny' serves" in message
    assert "--" not in message  # a library error names configuration, not the CLI's flags


@pytest.mark.detector
def test_a_built_pipeline_runs_a_file_to_its_end_and_closes_what_it_opened(
    person_video: Path, dead_vlm: str, settings: Settings
) -> None:
    config = config_for(person_video, dead_vlm, outbox={"drain_timeout_s": 1})
    port = free_port()
    with build_pipeline(config, settings, check_vlm=False, metrics_port=port) as pipeline:
        summary = pipeline.run()
        status, ready = get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200, ready
        assert pipeline.summary is summary
        assert pipeline.outbox_depth == summary.pending
    assert summary.frames == 4 * FPS  # every frame of the 4 s video was read
    assert summary.cameras["cam-1"].state == "finished" and not summary.source_errors
    assert summary.pending >= 1 and not summary.ok  # the VLM never answered
    rows = CaptionStore(create_db_engine(settings.resolved_database_url())).list(limit=10)
    assert rows and {row.source for row in rows} == {str(person_video)}
    # Closing the pipeline closed its health endpoint.
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


@pytest.mark.detector
def test_sigterm_stops_a_live_pipeline(person_video: Path, dead_vlm: str, settings: Settings) -> None:
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    with MjpegServer(person_video) as camera:
        sources = [{"camera": "door", "kind": "http", "url": camera.url, "analyze_fps": 5}]
        config = config_for(person_video, dead_vlm, sources=sources)
        try:
            with build_pipeline(config, settings, check_vlm=False) as pipeline:
                stop_on_signals(pipeline)
                thread = threading.Thread(target=pipeline.run, name="compose-live", daemon=True)
                thread.start()
                wait_for(lambda: pipeline.summary.cameras["door"].analysed >= 3, WAIT_S, "frames from the camera")
                os.kill(os.getpid(), signal.SIGTERM)
                thread.join(WAIT_S)
                assert not thread.is_alive()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
    assert pipeline.summary.stopped
    assert pipeline.summary.cameras["door"].state == "finished"
