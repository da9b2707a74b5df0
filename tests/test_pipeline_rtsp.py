"""A live camera for real: GStreamer's RTSP server, killed and restarted under a running pipeline."""

from __future__ import annotations

import signal
from datetime import UTC, datetime
from pathlib import Path

from helpers import pipeline_dict, scrape_metric, start_cli, wait_for, write_pipeline
from streams import RtspServer, skip_unless_gstreamer
from videos import make_event_video

from visioncap.serve import VllmServer, check_own, free_port
from visioncap.store import CaptionStore, create_db_engine


def camera_state(metrics_url: str, state: str) -> float:
    try:
        return scrape_metric(metrics_url, "visioncap_camera_state", camera="door", state=state)
    except OSError:
        return 0.0


def test_pipeline_reconnects_to_a_restarted_camera_and_goes_on(tmp_path: Path, vllm_server: VllmServer) -> None:
    skip_unless_gstreamer()
    video = tmp_path / "loop.mp4"
    # Looped by the server: someone comes into view every 7 s and leaves again.
    make_event_video(video, [(None, 1), ("zidane-right", 3), (None, 3)])
    with RtspServer(video) as camera:
        data = pipeline_dict(video)
        data["sources"] = [
            {
                "camera": "door",
                "kind": "rtsp",
                "url": camera.url.replace("rtsp://", "rtsp://viewer:secret@"),
                "analyze_fps": 5,
                "read_timeout_s": 2,
                "reconnect_initial_s": 0.2,
                "reconnect_max_s": 1,
            }
        ]
        data["selection"] = {**data["selection"], "event_end_s": 1.0, "recaption_interval_s": None}
        pipeline = write_pipeline(tmp_path, data)
        env = {
            "VISIONCAP_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
            "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
            "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        }
        store = CaptionStore(create_db_engine(env["VISIONCAP_DATABASE_URL"]))
        store.create_schema()
        metrics_port = free_port()
        metrics_url = f"http://127.0.0.1:{metrics_port}"
        run = start_cli("run", str(pipeline), "--progress", "log", "--metrics-port", str(metrics_port), env=env)
        try:
            wait_for(lambda: store.count(status="captioned") >= 1, 120, "a caption from the live camera")
            assert camera_state(metrics_url, "online") == 1
            check_own(run.pid, metrics_port)  # the answer was this run's, not another process's on a port both picked

            camera.kill()
            wait_for(lambda: camera_state(metrics_url, "reconnecting") == 1, 30, "the camera to count as lost")
            restarted_at = datetime.now(UTC)
            camera.restart()
            wait_for(lambda: camera_state(metrics_url, "online") == 1, 60, "the camera to come back online")
            wait_for(
                lambda: any(r.captured_at > restarted_at for r in store.list(status="captioned", limit=20)),
                120,
                "a caption of a frame seen after the restart",
            )
            run.send_signal(signal.SIGTERM)
            out, errors = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, errors[-3000:]  # a requested stop is a clean end, pending frames are durable
    assert "test: " in out and " errors in " in out, out
    assert "secret" not in errors, "credentials never reach the logs"
    assert "viewer:***@" in errors
    assert "Traceback" not in errors
    rows = store.list(limit=50)
    assert {r.camera for r in rows} == {"door"}
    assert all(r.source.startswith("rtsp://viewer:***@") for r in rows)
