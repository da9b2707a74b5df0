"""Camera state in the database (the `cameras` table) and in GET /v1/cameras: written by a real pipeline run
(demo video, real YOLO, real vLLM) and by the recorder on real SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import pipeline_dict, run_cli, wait_for, write_pipeline
from sqlalchemy import event, text

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.demo_video import Segment
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.cameras import CameraReport, CameraStateRecorder, camera_states, write_camera
from visioncap.store.schema import SCHEMA_VERSION, ensure_schema, schema_version

READ_KEY = "cameras-read-key"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIMEOUT = 30  # seconds; a bound on a broken test, never a measurement


def report(camera: str, state: str, **changes: Any) -> CameraReport:
    values: dict[str, Any] = {"pipeline": "p", "source": f"rtsp://***@host/{camera}", "state_since": T0}
    values.update(changes)
    return CameraReport(camera=camera, state=state, **values)


def test_camera_rows_are_upserted_and_keep_the_last_frame_time(store: CaptionStore) -> None:
    engine = store.engine
    write_camera(engine, report("gate", "starting"))
    assert camera_states(engine)["gate"].state == "starting"
    assert camera_states(engine)["gate"].last_frame_at is None
    write_camera(engine, report("gate", "online", last_frame_at=T0 + timedelta(seconds=5), frames_analysed=10))
    write_camera(engine, report("dock", "reconnecting", state_since=T0 + timedelta(minutes=1)))
    # A new run reports `starting` before it has a frame: the stored frame time stays.
    write_camera(engine, report("gate", "starting", pipeline="p2", state_since=T0 + timedelta(hours=1)))
    states = camera_states(engine)
    assert sorted(states) == ["dock", "gate"]
    gate = states["gate"]
    assert (gate.state, gate.pipeline, gate.state_since) == ("starting", "p2", T0 + timedelta(hours=1))
    assert gate.last_frame_at == T0 + timedelta(seconds=5) and gate.reported_at is not None
    write_camera(engine, report("gate", "failed", error="cannot open", last_frame_at=T0 + timedelta(seconds=9)))
    gate = camera_states(engine)["gate"]
    assert (gate.state, gate.error, gate.last_frame_at) == ("failed", "cannot open", T0 + timedelta(seconds=9))


def test_a_database_from_before_the_cameras_table_gets_it(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.db'}")
    ensure_schema(engine)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE cameras"))
        conn.execute(text("UPDATE visioncap_schema SET version = 4"))
    assert schema_version(engine) == 4
    assert ensure_schema(engine) == SCHEMA_VERSION
    write_camera(engine, report("gate", "online"))
    assert list(camera_states(engine)) == ["gate"]


def test_recorder_writes_state_changes_at_once_and_frame_times_at_most_every_interval(store: CaptionStore) -> None:
    engine = store.engine
    writes: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "cameras" in statement and statement.lstrip().upper().startswith(("INSERT", "UPDATE")):
            writes.append(statement)

    recorder = CameraStateRecorder(engine, "p", {"gate": "/videos/gate.mp4", "dock": "rtsp://***@h/dock"}, 60)
    recorder.start()
    # Both rows, not just a set of states: the writer puts them in one after the other.
    both_starting = {("dock", "starting"), ("gate", "starting")}
    wait_for(lambda: {(c.camera, c.state) for c in camera_states(engine).values()} == both_starting, TIMEOUT, "rows")
    recorder.state("gate", "online")
    wait_for(lambda: camera_states(engine)["gate"].state == "online", TIMEOUT, "the online state")
    before = len(writes)
    for index in range(1000):  # far more frames than writes: frame times wait for the interval
        recorder.frame("gate", T0 + timedelta(seconds=index / 10))
    recorder.state("dock", "reconnecting")
    wait_for(lambda: camera_states(engine)["dock"].state == "reconnecting", TIMEOUT, "the reconnecting state")
    recorder.state("gate", "finished")
    recorder.close()
    assert len(writes) - before <= 4, writes[before:]
    gate = camera_states(engine)["gate"]
    assert (gate.state, gate.frames_analysed, gate.last_frame_at) == ("finished", 1000, T0 + timedelta(seconds=99.9))
    assert gate.source == "/videos/gate.mp4" and camera_states(engine)["dock"].last_frame_at is None


def api_settings(data_dir: Path) -> ApiSettings:
    return ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"})],
    )


def test_cameras_route_merges_reported_state_with_stored_rows(
    store: CaptionStore, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox = Outbox(store, tmp_path / "data", OutboxConfig(capacity=10), PipelineMetrics())
    for index in range(3):
        new = NewCaption(
            pipeline="p",
            camera="gate",
            source="/videos/gate.mp4",
            frame_index=index,
            offset_s=float(index),
            captured_at=T0 + timedelta(seconds=index),
            reason="new-event",
            people=[],
            image_width=16,
            image_height=16,
            model="tiny",
            event_key=f"gate:{index % 2}",
        )
        _, row_id = outbox.put(new, b"\xff\xd8\xff\xd9")
        assert row_id is not None
        store.mark_captioned(row_id, Caption("x", "tiny", 1, 1, 0.1), attempts=1)
    write_camera(store.engine, report("gate", "online", last_frame_at=T0 + timedelta(minutes=5), frames_analysed=7))
    write_camera(store.engine, report("dock", "offline"))  # no rows yet: listed all the same
    write_camera(store.engine, report("lab", "online"))
    with store.engine.begin() as conn:  # a state only a newer version writes (this one refuses to write it)
        conn.execute(text("UPDATE cameras SET state = 'hibernating' WHERE camera = 'lab'"))
    monkeypatch.setenv("VISIONCAP_DATABASE_URL", database_url)
    with TestClient(create_app(api_settings(tmp_path / "data")), headers={"X-Api-Key": READ_KEY}) as client:
        response = client.get("/v1/cameras")
    assert response.status_code == 200, response.text
    cameras = {item["camera"]: item for item in response.json()["items"]}
    assert list(cameras) == ["dock", "gate", "lab"]
    gate, dock = cameras["gate"], cameras["dock"]
    assert (gate["state"], gate["pipeline"], gate["frames_analysed"], gate["captions"], gate["events"]) == (
        "online",
        "p",
        7,
        3,
        2,
    )
    assert datetime.fromisoformat(gate["last_frame_at"]) == T0 + timedelta(minutes=5)  # newer than any row
    assert datetime.fromisoformat(gate["last_caption_at"]) == T0 + timedelta(seconds=2)
    assert datetime.fromisoformat(gate["state_since"]) == T0
    assert (dock["state"], dock["captions"], dock["last_frame_at"], dock["by_status"]["captioned"]) == (
        "offline",
        0,
        None,
        0,
    )
    assert cameras["lab"]["state"] is None  # not a 500


def test_a_pipeline_run_leaves_finished_cameras_and_runs_retention(
    tmp_path: Path,
    vllm_server: VllmServer,
    demo_video: tuple[Path, tuple[Segment, ...]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    video, segments = demo_video
    data_dir = tmp_path / "data"
    database = f"sqlite:///{tmp_path / 'c.db'}"
    # A row from a month ago, with its image: the run's retention job (VISIONCAP_RETENTION_DAYS) removes it.
    store = CaptionStore(create_db_engine(database))
    store.create_schema()
    old_frame = NewCaption(
        pipeline="older",
        camera="cam-1",
        source=str(video),
        frame_index=0,
        offset_s=0.0,
        captured_at=datetime.now(UTC) - timedelta(days=30),
        reason="new-event",
        people=[],
        image_width=16,
        image_height=16,
        model="tiny",
    )
    _, old_id = Outbox(store, data_dir, OutboxConfig(), PipelineMetrics()).put(old_frame, b"\xff\xd8\xff\xd9")
    assert old_id is not None
    store.mark_failed(old_id, "refused", attempts=1)
    old_image = data_dir / store.get(old_id).image_path  # type: ignore[union-attr,operator]

    sources = [
        {"camera": "cam-1", "path": str(video), "analyze_fps": 5},
        {"camera": "cam-2", "path": str(tmp_path / "missing.mp4"), "analyze_fps": 5},
    ]
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, sources=sources))
    (tmp_path / "missing.mp4").write_bytes(b"not a video")  # exists (config check) but cannot be read
    env = {
        "VISIONCAP_DATABASE_URL": database,
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        "VISIONCAP_RETENTION_DAYS": "7",
    }
    started = datetime.now(UTC)
    result = run_cli("run", str(pipeline), "--progress", "none", env=env)
    assert result.returncode == 1, result.stderr[-3000:]  # cam-2 failed; cam-1 ran to its end
    assert "error: camera cam-2: " in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "retention: deleted 1 rows (cam-1 1), 1 files" in result.stderr
    # (SQLite may hand the deleted row's id to a new row: look for the old row itself.)
    assert [row.pipeline for row in store.list(limit=1000) if row.pipeline == "older"] == []
    assert not old_image.exists()

    monkeypatch.setenv("VISIONCAP_DATABASE_URL", database)
    with TestClient(create_app(api_settings(data_dir)), headers={"X-Api-Key": READ_KEY}) as client:
        cameras = {item["camera"]: item for item in client.get("/v1/cameras").json()["items"]}
    cam1, cam2 = cameras["cam-1"], cameras["cam-2"]
    assert (cam1["state"], cam1["pipeline"], cam1["error"]) == ("finished", "test", None)
    assert cam1["frames_analysed"] == segments[-1].end // 2  # every other frame at 5 of 10 fps
    rows = store.list(camera="cam-1", limit=100)
    assert rows and cam1["captions"] == len(rows)
    # The newest analysed frame is the video's last analysed frame, at or after the newest captioned one.
    last_frame = datetime.fromisoformat(cam1["last_frame_at"])
    assert max(row.captured_at for row in rows) <= last_frame
    assert datetime.fromisoformat(cam1["reported_at"]) >= started
    assert cam2["state"] == "failed" and cam2["error"] and cam2["captions"] == 0 and cam2["last_frame_at"] is None
