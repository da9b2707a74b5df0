"""Faults produced for real: the vLLM server stopped or killed mid-run, broken video files beside good ones."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import pipeline_dict, run_cli, start_cli, wait_for, write_pipeline
from videos import make_event_video

from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, create_db_engine

TIMELINE = [(None, 1), ("zidane-right", 4), (None, 3), ("bus-right", 4), (None, 3), ("bus-mid", 4), (None, 1)]
FAST_RETRY = {"retry_initial_s": 0.5, "retry_max_s": 2.0}


@pytest.fixture
def events_video(tmp_path: Path) -> Path:
    path = tmp_path / "events.mp4"
    make_event_video(path, TIMELINE)
    return path


def setup_run(
    tmp_path: Path, server: VllmServer, video: Path, **outbox: float
) -> tuple[Path, dict[str, str], CaptionStore]:
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, outbox={**FAST_RETRY, **outbox}))
    env = {
        "VISIONCAP_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
        "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
        "VISIONCAP_VLM_BASE_URL": server.base_url,
    }
    store = CaptionStore(create_db_engine(env["VISIONCAP_DATABASE_URL"]))
    store.create_schema()
    return pipeline, env, store


def restart(server: VllmServer) -> None:
    server.stop()
    server.start()
    server.wait_ready()


def test_vlm_stopped_and_restarted_mid_run_loses_no_event(
    tmp_path: Path, vllm_server: VllmServer, events_video: Path
) -> None:
    pipeline, env, store = setup_run(tmp_path, vllm_server, events_video)
    run = start_cli("run", str(pipeline), "--progress", "none", env=env)
    try:
        wait_for(lambda: store.count() >= 1, 120, "the first selected frame")
        vllm_server.stop()
        wait_for(
            lambda: any(r.status == "pending" and r.attempts >= 1 for r in store.list(limit=50)),
            120,
            "a caption attempt failing while the VLM is down",
        )
        vllm_server.start()
        vllm_server.wait_ready()
        out, errors = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, errors[-3000:]
    rows = store.list(limit=50)
    assert len(rows) >= 3 and {r.status for r in rows} == {"captioned"}
    assert max(r.attempts for r in rows) >= 2, "some frame waited out the outage"
    assert len({r.event_key for r in rows}) == 3, "each of the three people was captioned"
    assert "0 pending, 0 errors" in out


def test_vlm_killed_then_pipeline_rerun_captions_every_pending_frame(
    tmp_path: Path, vllm_server: VllmServer, events_video: Path
) -> None:
    pipeline, env, store = setup_run(tmp_path, vllm_server, events_video, drain_timeout_s=0)
    run = start_cli("run", str(pipeline), "--progress", "none", env=env)
    try:
        wait_for(lambda: store.count() >= 1, 120, "the first selected frame")
        assert vllm_server.pid is not None
        os.killpg(vllm_server.pid, signal.SIGKILL)
        _out, errors = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 1
    assert "captions still pending; the next run captions them first" in errors
    first = {r.id: r for r in store.list(limit=50)}
    pending = [r for r in first.values() if r.status == "pending"]
    assert pending, "the kill left frames pending"
    for row in pending:
        assert (Path(env["VISIONCAP_DATA_DIR"]) / str(row.image_path)).is_file()

    restart(vllm_server)
    again = run_cli("run", str(pipeline), "--progress", "none", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = store.list(limit=50)
    assert {r.status for r in rows} == {"captioned"}
    assert {r.id for r in rows} >= set(first), "nothing recorded earlier was lost"
    assert len({r.event_key for r in rows}) == 3
    assert "pending frames from an earlier run are captioned first" in again.stderr


def test_two_good_cameras_beside_broken_files(
    tmp_path: Path, vllm_server: VllmServer, events_video: Path, demo_video: tuple[Path, object]
) -> None:
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).integers(0, 255, 200_000, dtype=np.uint8).tobytes())
    # An MJPEG AVI cut short: OpenCV opens it, reads what is there and stops early without a word.
    full, truncated = tmp_path / "full.avi", tmp_path / "truncated.avi"
    capture = cv2.VideoCapture(str(events_video))
    writer = cv2.VideoWriter(str(full), cv2.VideoWriter_fourcc(*"MJPG"), 10, (640, 480))
    while True:
        ok, image = capture.read()
        if not ok:
            break
        writer.write(image)
    writer.release()
    truncated.write_bytes(full.read_bytes()[: full.stat().st_size * 6 // 10])

    data = pipeline_dict(events_video)
    data["sources"] = [
        {"camera": "good", "path": str(events_video), "analyze_fps": 5},
        {"camera": "other", "path": str(demo_video[0]), "analyze_fps": 5},
        {"camera": "garbage", "path": str(garbage)},
        {"camera": "cut", "path": str(truncated), "analyze_fps": 5},
    ]
    pipeline, env, store = setup_run(tmp_path, vllm_server, events_video)
    write_pipeline(tmp_path, data)
    result = run_cli("run", str(pipeline), "--progress", "none", env=env)
    assert result.returncode == 1
    # Said before anything slow loads (the other sources run), and again in the run's summary.
    assert f"warning: pipeline test: camera garbage: {garbage} is not a video file" in result.stderr
    assert f"error: camera garbage: cannot open video file {garbage}" in result.stderr
    assert "error: camera cut: video file" in result.stderr and "(truncated or corrupt)" in result.stderr
    assert "Traceback" not in result.stderr
    by_camera: dict[str, int] = {}
    for row in store.list(limit=100):
        by_camera[row.camera] = by_camera.get(row.camera, 0) + 1
        assert row.status == "captioned"
    assert by_camera.get("good") == 3, "the good camera ran to its end beside the broken ones"
    assert by_camera.get("other", 0) >= 2, "a second good camera, detected in the same batches"
    assert "garbage" not in by_camera
    assert by_camera.get("cut", 0) >= 1, "frames before the cut were still used"
