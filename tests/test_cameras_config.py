"""Cameras as data: POST/PATCH/DELETE /v1/cameras and `visioncap cameras` over a real database (SQLite and
PostgreSQL), the pipeline-file seed and its rule, and secrets that never reach the database, an answer or output."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import invoke_cli, pipeline_dict, write_pipeline
from sqlalchemy import JSON, bindparam, text

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.config.pipeline import load_pipeline
from visioncap.config.sources import StreamSourceConfig
from visioncap.pipeline.watcher import CameraWatcher
from visioncap.store import CaptionStore
from visioncap.store.camera_configs import SeedOutcome, get_camera, list_cameras, seed_cameras

READ_KEY = "cameras-read-key"
WRITE_KEY = "cameras-write-key"
SECRET = "hunter2-s3cret"
WRITER = {"Authorization": f"Bearer {WRITE_KEY}"}
TIMEOUT_S = 30
YARD_REFERENCE = "${VISIONCAP_CAMERA_SECRET_YARD}"


def camera_body(camera: str = "yard", **source: Any) -> dict[str, Any]:
    return {
        "pipeline": "p",
        "source": {"camera": camera, "kind": "rtsp", "url": f"rtsp://viewer:{YARD_REFERENCE}@cam.local/yard", **source},
    }


@pytest.fixture
def client(store: CaptionStore, database_url: str, tmp_path: Path) -> Iterator[TestClient]:
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=database_url,
        data_dir=tmp_path / "data",
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[
            ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"}),
            ApiKey(name="admin", sha256=hash_key(WRITE_KEY), scopes={"read", "write"}),
        ],
    )
    with TestClient(create_app(settings), headers={"X-Api-Key": READ_KEY}, raise_server_exceptions=False) as client:
        yield client


def raw_rows(store: CaptionStore) -> str:
    """Everything the camera tables hold, as text: where a stored secret would show."""
    with store.engine.connect() as conn:
        rows = [*conn.execute(text("SELECT * FROM camera_configs")), *conn.execute(text("SELECT * FROM cameras"))]
    return repr(rows)


def test_cameras_are_added_changed_paused_and_removed_with_the_write_scope(
    client: TestClient, store: CaptionStore
) -> None:
    refused = client.post("/v1/cameras", json=camera_body())
    assert refused.status_code == 403 and "write" in refused.json()["error"]["message"]
    assert client.patch("/v1/cameras/yard", json={"paused": True}).status_code == 403
    assert client.delete("/v1/cameras/yard").status_code == 403

    added = client.post("/v1/cameras", json=camera_body(analyze_fps=2), headers=WRITER)
    assert added.status_code == 201, added.text
    assert added.json()["version"] == 1 and added.json()["origin"] == "api"
    assert client.post("/v1/cameras", json=camera_body(), headers=WRITER).status_code == 409

    changed = client.patch(
        "/v1/cameras/yard", json={"source": {"analyze_fps": 4}, "selection": {"event_end_s": 3}}, headers=WRITER
    )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["version"], body["source"]["analyze_fps"], body["selection"]) == (2, 4, {"event_end_s": 3})
    assert body["source"]["read_timeout_s"] == 5.0  # the other source fields kept
    paused = client.patch("/v1/cameras/yard", json={"paused": True}, headers=WRITER).json()
    assert (paused["paused"], paused["version"]) == (True, 3)

    listed = {item["camera"]: item for item in client.get("/v1/cameras").json()["items"]}
    assert listed["yard"]["config"]["paused"] is True and listed["yard"]["state"] is None  # no worker reported it
    stored = get_camera(store.engine, "yard")
    assert stored is not None and stored.config.paused and stored.version == 3
    # The reference is stored as written, for the worker to resolve; answers mask it like any password.
    assert f"viewer:{YARD_REFERENCE}@" in raw_rows(store) and YARD_REFERENCE not in repr(listed)

    assert client.delete("/v1/cameras/yard", headers=WRITER).status_code == 204
    assert client.delete("/v1/cameras/yard", headers=WRITER).status_code == 404
    assert client.patch("/v1/cameras/yard", json={"paused": False}, headers=WRITER).status_code == 404
    assert list_cameras(store.engine) == []


@pytest.mark.parametrize(
    ("body", "param", "says"),
    [
        (camera_body(url="ftp://cam.local/yard"), "source.url", "scheme ftp:// is not accepted"),
        (camera_body(url="rtsp://"), "source.url", "no host name"),
        ({"pipeline": "p", "source": {"camera": "yard", "kind": "smoke-signal", "url": "x"}}, "source", "kind must"),
        (camera_body(analyze_fps=0), "source.analyze_fps", "greater than 0"),
        (camera_body(camera="no spaces"), "source.camera", "pattern"),
        ({**camera_body(), "selection": {"event_end_s": -1}}, "selection.event_end_s", "greater than"),
        ({**camera_body(), "caption": {"prompt": "x"}}, "caption", "not per camera"),
        (
            {"pipeline": "p", "source": {"camera": "yard", "kind": "file", "path": "relative.mp4"}},
            "source.kind",
            "network cameras",
        ),
    ],
)
def test_invalid_cameras_are_422_naming_the_field(
    client: TestClient, store: CaptionStore, body: dict[str, Any], param: str, says: str
) -> None:
    refused = client.post("/v1/cameras", json=body, headers=WRITER)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: ") and says in error["message"]
    assert list_cameras(store.engine) == []


def test_a_stored_camera_this_version_refuses_is_left_out_and_can_be_removed(
    client: TestClient, store: CaptionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A camera an older version stored with a pipeline name this one refuses (a NUL, which SQLite took) must not
    hide the other cameras from the API and the workers."""
    assert client.post("/v1/cameras", json=camera_body("yard"), headers=WRITER).status_code == 201
    assert client.post("/v1/cameras", json=camera_body("gate"), headers=WRITER).status_code == 201
    # PostgreSQL never stored the NUL; there a setting an older version had and this one dropped.
    sqlite = store.engine.dialect.name == "sqlite"
    bad = {"pipeline": "a\x00b"} if sqlite else {"selection": {"no_such_setting": 1}}
    with store.engine.begin() as conn:
        config = conn.execute(text("SELECT config FROM camera_configs WHERE camera = 'gate'")).scalar_one()
        config = json.loads(config) if isinstance(config, str) else config
        statement = text("UPDATE camera_configs SET config = :config WHERE camera = 'gate'")
        conn.execute(statement.bindparams(bindparam("config", type_=JSON)), {"config": {**config, **bad}})
    assert [stored.camera for stored in list_cameras(store.engine)] == ["yard"]
    assert "stored camera 'gate' is not valid any more" in caplog.text
    assert [item["camera"] for item in client.get("/v1/cameras").json()["items"]] == ["yard"]
    # A worker of the pipeline runs the valid one and does not reload (nor log) the refused one at each poll.
    watcher = CameraWatcher(store.engine, "p")
    assert list(watcher.load()) == ["yard"]
    assert not watcher.changed()
    assert client.patch("/v1/cameras/yard", json={"paused": True}, headers=WRITER).status_code == 200
    assert watcher.changed()
    assert client.delete("/v1/cameras/gate", headers=WRITER).status_code == 204


@pytest.mark.parametrize(
    "url",
    [
        f"rtsp://viewer:{SECRET}@cam.local/yard",
        f"rtsp://cam.local/yard?user=viewer&password={SECRET}",
        f"rtsp://cam.local/yard;token={SECRET}/main",
    ],
)
def test_inline_secrets_are_refused_without_being_repeated(client: TestClient, store: CaptionStore, url: str) -> None:
    refused = client.post("/v1/cameras", json=camera_body(url=url), headers=WRITER)
    assert refused.status_code == 422
    assert "${NAME}" in refused.json()["error"]["message"] and SECRET not in refused.text
    client.post("/v1/cameras", json=camera_body(), headers=WRITER)
    changed = client.patch("/v1/cameras/yard", json={"source": {"url": url}}, headers=WRITER)
    assert changed.status_code == 422 and SECRET not in changed.text
    assert SECRET not in raw_rows(store)


def test_a_pipeline_files_cameras_are_seeded_by_the_rule_and_its_secrets_stay_out(
    client: TestClient, store: CaptionStore
) -> None:
    def source(camera: str, fps: float) -> StreamSourceConfig:
        url = f"rtsp://viewer:{SECRET}@cam.local/{camera}"
        return StreamSourceConfig(camera=camera, kind="rtsp", url=url, analyze_fps=fps)

    seed_cameras(store.engine, "p", [source("door", 2), source("gate", 2)])
    client.post("/v1/cameras", json=camera_body(), headers=WRITER)  # an API camera of the same pipeline
    assert SECRET not in raw_rows(store)
    listed = client.get("/v1/cameras").json()["items"]
    assert SECRET not in repr(listed)
    door = next(item for item in listed if item["camera"] == "door")["config"]
    assert (door["origin"], door["source"]["url"]) == ("file", "rtsp://viewer:***@cam.local/door")

    # An API change to a file camera: its masked URL is kept (the secret stays in the file), and a restart
    # with the same file leaves the change alone.
    changed = client.patch("/v1/cameras/door", json={"source": {"analyze_fps": 7}}, headers=WRITER)
    assert changed.status_code == 200, changed.text
    seed_cameras(store.engine, "p", [source("door", 2), source("gate", 2)])
    door_now = get_camera(store.engine, "door")
    assert door_now is not None and door_now.config.source.analyze_fps == 7 and door_now.version == 2

    # The file changes door and drops gate: the file wins for door, gate goes, the API camera stays.
    seed_cameras(store.engine, "p", [source("door", 3)])
    cameras = {stored.camera: stored for stored in list_cameras(store.engine)}
    assert set(cameras) == {"door", "yard"}
    assert cameras["door"].config.source.analyze_fps == 3 and cameras["door"].version == 3
    # The same file camera run by another pipeline: that pipeline's worker runs it now.
    seed_cameras(store.engine, "q", [source("door", 3)])
    moved = get_camera(store.engine, "door")
    assert moved is not None and moved.config.pipeline == "q" and moved.version == 4
    assert SECRET not in raw_rows(store)


def fps_of(store: CaptionStore) -> dict[str, float | None]:
    return {stored.camera: stored.config.source.analyze_fps for stored in list_cameras(store.engine)}


def test_an_older_version_of_the_file_never_reverts_a_newer_one(store: CaptionStore) -> None:
    """Workers of one pipeline starting with different versions of its file (a rollout; a pod crash-looping on the
    old one): the newer version's cameras stay, whatever order the workers restart in, until one is applied on
    purpose."""

    def source(camera: str, fps: float) -> StreamSourceConfig:
        return StreamSourceConfig(camera=camera, kind="rtsp", url=f"rtsp://cam.local/{camera}", analyze_fps=fps)

    old = [source("door", 2), source("gate", 2)]
    new = [source("door", 5)]  # door changed, gate dropped
    assert seed_cameras(store.engine, "p", old) is SeedOutcome.APPLIED
    assert seed_cameras(store.engine, "p", new) is SeedOutcome.APPLIED
    assert fps_of(store) == {"door": 5}
    # The pod still on the old file restarts: it neither brings gate back nor sets door to 2.
    assert seed_cameras(store.engine, "p", old) is SeedOutcome.STALE
    assert fps_of(store) == {"door": 5}
    assert seed_cameras(store.engine, "p", new) is SeedOutcome.CURRENT
    assert get_camera(store.engine, "door").version == 2  # type: ignore[union-attr]
    # Another pipeline's versions are its own.
    assert seed_cameras(store.engine, "q", [source("yard", 1)]) is SeedOutcome.APPLIED
    # Back to the old version on purpose (`visioncap cameras apply`, or `visioncap run` of the one box).
    assert seed_cameras(store.engine, "p", old, force=True) is SeedOutcome.APPLIED
    assert fps_of(store) == {"door": 2, "gate": 2, "yard": 1}
    assert seed_cameras(store.engine, "p", new) is SeedOutcome.STALE
    # A third version, new to the table, applies whatever came before.
    assert seed_cameras(store.engine, "p", [source("door", 9)]) is SeedOutcome.APPLIED
    assert fps_of(store) == {"door": 9, "yard": 1}


def test_workers_that_start_together_seed_one_new_version_once(store: CaptionStore) -> None:
    """Pods of a StatefulSet start in parallel with the same new file: each seed sees the rows the other wrote (no
    duplicate-key failure at start-up), and exactly one of them applied it."""
    sources = [StreamSourceConfig(camera=f"cam-{n}", kind="rtsp", url=f"rtsp://cam.local/{n}") for n in range(20)]
    start = threading.Barrier(4)

    def seed() -> SeedOutcome:
        start.wait(TIMEOUT_S)
        return seed_cameras(store.engine, "p", sources)

    with ThreadPoolExecutor(4) as pool:
        outcomes = sorted(pool.map(lambda _: seed(), range(4)))
    assert outcomes == [SeedOutcome.APPLIED, SeedOutcome.CURRENT, SeedOutcome.CURRENT, SeedOutcome.CURRENT]
    assert {stored.version for stored in list_cameras(store.engine)} == {1}
    assert len(list_cameras(store.engine)) == 20


def test_the_cli_adds_lists_changes_pauses_and_removes(database_url: str, store: CaptionStore, tmp_path: Path) -> None:
    env = {"VISIONCAP_DATABASE_URL": database_url}
    added = invoke_cli(
        "cameras", "add", "yard", "--pipeline", "p", "--kind", "rtsp", "--url", "rtsp://viewer:${VISIONCAP_CAMERA_SECRET_PW}@cam/yard",
        "--analyze-fps", "2", "--set", "read_timeout_s=2", "--selection", "event_end_s=3", "--new-pipeline", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    refused = invoke_cli(
        "cameras", "add", "door", "--pipeline", "p", "--kind", "rtsp", "--url", f"rtsp://u:{SECRET}@cam/door", env=env
    )  # fmt: skip
    assert refused.returncode == 2 and "${NAME}" in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    assert invoke_cli("cameras", "update", "yard", "--analyze-fps", "4", env=env).returncode == 0
    assert invoke_cli("cameras", "pause", "yard", env=env).returncode == 0
    listed = invoke_cli("cameras", "list", env=env)
    assert "rtsp://viewer:***@cam/yard" in listed.stdout and "yes" in listed.stdout, listed.stdout
    stored = get_camera(store.engine, "yard")
    assert stored is not None and stored.config.paused and stored.config.source.analyze_fps == 4
    assert stored.config.source.read_timeout_s == 2 and stored.config.selection == {"event_end_s": 3}
    assert invoke_cli("cameras", "remove", "yard", env=env).returncode == 0
    missing = invoke_cli("cameras", "remove", "yard", env=env)
    assert missing.returncode == 2 and "no camera yard" in missing.stderr
    assert list_cameras(store.engine) == []
    # Back to an older version of a pipeline file on purpose: workers starting with it would skip it as stale.
    gate = {"camera": "gate", "kind": "rtsp", "url": "rtsp://cam.local/gate"}
    older = write_pipeline(tmp_path, pipeline_dict(tmp_path, sources=[{**gate, "analyze_fps": 1}]), "older.yaml")
    seed_cameras(store.engine, "test", list(load_pipeline(older).sources))
    seed_cameras(store.engine, "test", [StreamSourceConfig.model_validate({**gate, "analyze_fps": 4})])
    assert seed_cameras(store.engine, "test", list(load_pipeline(older).sources)) is SeedOutcome.STALE
    applied = invoke_cli("cameras", "apply", str(older), env=env)
    assert applied.returncode == 0 and "applied" in applied.stdout, applied.stderr
    assert fps_of(store) == {"gate": 1}
