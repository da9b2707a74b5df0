"""Credentials in camera URLs (user:password@, ?pwd=, ?token=, ...) never reach a log line, an error message, a
stored row or an API answer.

The masking itself on its own, then the real parts around it: stream sources reading a real MJPEG camera and
failing on a dead port, config files that quote a URL back, the CLI's log setup, and a real pipeline (detector,
outbox, SQLite) whose rows and camera states the API serves.
"""

from __future__ import annotations

import logging
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from helpers import REPO, pipeline_dict, wait_for, write_pipeline
from servers.mjpeg_server import MjpegServer
from streams import FrameCollector, StateRecorder
from videos import make_event_video, make_gradient_clip

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.config.pipeline import PipelineConfig, load_pipeline
from visioncap.config.settings import Settings
from visioncap.config.sources import StreamSourceConfig
from visioncap.errors import ConfigError, SourceError, VisioncapError
from visioncap.frames import Frame
from visioncap.pipeline.compose import build_pipeline
from visioncap.pipeline.hub import FrameHub
from visioncap.redact import (
    CREDENTIAL_WORDS,
    MASK,
    SECRET_PARAMETERS,
    MaskingFormatter,
    is_credential_name,
    secret_values,
)
from visioncap.sources.base import FrameSource
from visioncap.sources.stream import StreamSource
from visioncap.sources.urls import mask_credentials, mask_urls
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.cameras import CameraReport, camera_states, write_camera
from visioncap.store.records import CameraState

SECRET = "s3cret-Xq7"
READ_KEY = "credentials-test-key"
# How long a test waits for its condition: a bound on a broken test, never a measurement.
WAIT_S = 120.0

# --- mask_credentials ------------------------------------------------------------------------------------------

MASKED = [
    # The user info password, as before.
    ("rtsp://user:secret@host/x", "rtsp://user:***@host/x"),
    ("rtsp://admin:p@ss@10.0.0.2:554/live?a=1", "rtsp://admin:***@10.0.0.2:554/live?a=1"),
    ("rtsp://admin:@cam/x", "rtsp://admin:***@cam/x"),
    ("rtsp://admin:pw@[2001:db8::1]:554/x", "rtsp://admin:***@[2001:db8::1]:554/x"),
    # Query parameters IP cameras take credentials in.
    ("http://cam/video.cgi?user=admin&pwd=secret", "http://cam/video.cgi?user=admin&pwd=***"),
    ("rtsp://cam/stream?token=abc", "rtsp://cam/stream?token=***"),
    ("http://cam/snap?PWD=1&Password=2&PASSWD=3&pass=4", "http://cam/snap?PWD=***&Password=***&PASSWD=***&pass=***"),
    ("https://cam/x?Auth=a&KEY=b&apiKey=c&Secret=d", "https://cam/x?Auth=***&KEY=***&apiKey=***&Secret=***"),
    ("https://cdn/x.m3u8?Signature=a&sig=b&expires=9", "https://cdn/x.m3u8?Signature=***&sig=***&expires=9"),
    # Both at once, other parameters and their order untouched.
    (
        "rtsp://admin:hunter2@cam:554/live?channel=1&token=abc&subtype=0",
        "rtsp://admin:***@cam:554/live?channel=1&token=***&subtype=0",
    ),
    # Repeated, empty (an empty password is worth hiding too), and values holding "=", "/" or "?".
    ("http://cam/x?pwd=a&pwd=b", "http://cam/x?pwd=***&pwd=***"),
    ("http://cam/x?pwd=&user=admin", "http://cam/x?pwd=***&user=admin"),
    ("http://cam/x?sig=YWJj==&a=1", "http://cam/x?sig=***&a=1"),
    ("http://cam/x?token=a/b?c&next=/live", "http://cam/x?token=***&next=/live"),
    # Spellings of the same name: %-escapes (servers decode them), `_` and `-`.
    ("http://cam/x?p%77d=1&%50ASSWORD=2", "http://cam/x?p%77d=***&%50ASSWORD=***"),
    ("http://cam/x?api_key=1&API-KEY=2&access=3", "http://cam/x?api_key=***&API-KEY=***&access=3"),
    # ";" as the separator, and a raw ";" inside a password.
    ("http://cam/cgi?user=admin;pwd=secret;channel=1", "http://cam/cgi?user=admin;pwd=***;channel=1"),
    ("http://cam/cgi?pwd=se;cret&channel=1", "http://cam/cgi?pwd=***&channel=1"),
    ("http://cam/cgi?pwd=se;cret", "http://cam/cgi?pwd=***"),
    # Path parameters, and a fragment that holds a query.
    ("rtsp://cam/live;token=abc/main?x=1", "rtsp://cam/live;token=***/main?x=1"),
    ("http://cam/view#token=abc&layout=2", "http://cam/view#token=***&layout=2"),
    ("http://cam/#/live?auth=abc&grid=4", "http://cam/#/live?auth=***&grid=4"),
    ("rtsp://a:b@cam/x?key=k#sig=s", "rtsp://a:***@cam/x?key=***#sig=***"),
    ("RTSP://a:b@cam/x?TOKEN=t", "RTSP://a:***@cam/x?TOKEN=***"),
    # A URL inside a URL (a relay in front of the camera) has credentials of its own.
    (
        "http://relay/play?src=rtsp://admin:pw@cam/x?token=abc&fmt=mjpeg",
        "http://relay/play?src=rtsp://admin:***@cam/x?token=***&fmt=mjpeg",
    ),
    ("http://relay/rtsp://admin:pw@cam/x", "http://relay/rtsp://admin:***@cam/x"),
    ("http://relay/play?token=rtsp://admin:pw@cam/x&fmt=mjpeg", "http://relay/play?token=***&fmt=mjpeg"),
    # Any name holding a credential word, however the service spells the rest (issue 40).
    ("http://cam/x?access_token=abc&channel=1", "http://cam/x?access_token=***&channel=1"),
    ("http://cam/x?session_id=s1&sessionid=s2&PHPSESSID=s3", "http://cam/x?session_id=***&sessionid=***&PHPSESSID=***"),
    (
        "https://cam/x?accessToken=a&X-Auth-Token=b&client_secret=c&credentials=d",
        "https://cam/x?accessToken=***&X-Auth-Token=***&client_secret=***&credentials=***",
    ),
    (
        "https://cdn/x?X-Amz-Signature=a&authorization=b&tokens=c",
        "https://cdn/x?X-Amz-Signature=***&authorization=***&tokens=***",
    ),
    ("http://cam/x?passphrase=a&userpass=b&pw=c", "http://cam/x?passphrase=***&userpass=***&pw=***"),
    # A harmless word is taken out before the words are looked for, so one next to a credential word still masks.
    (
        "http://cam/x?keyframe_token=a&monkey_key=b&keyframe=1",
        "http://cam/x?keyframe_token=***&monkey_key=***&keyframe=1",
    ),
    # Names %-encoded (once or twice) are read decoded, as a server (or a relay and then a server) reads them.
    ("http://cam/x?access%5Ftoken=a&%2573ession=b", "http://cam/x?access%5Ftoken=***&%2573ession=***"),
    # Percent-encoded user info: decoded, the part after ":" is the password; the separator is kept as written.
    ("rtsp://user%3Asecret@host/x", "rtsp://user%3A***@host/x"),
    ("rtsp://user%3asecret@host/x?a=1", "rtsp://user%3a***@host/x?a=1"),
    ("rtsp://user%253Asecret@host/x", "rtsp://user%253A***@host/x"),
    ("rtsp://us%40er%3Ap%3Aw@host/x", "rtsp://us%40er%3A***@host/x"),
]

UNCHANGED = [
    "rtsp://127.0.0.1:8554/stream",
    "http://user@host/x",
    "http://host/path@x",
    # Harmless words that hold a credential word (see redact._HARMLESS_WORDS).
    "http://cam/x?monkey=1&keyframe=2&passive=4&author=6&user=admin",
    "http://cam/x?keyint=50&keyframes=1&passthrough=1&signal=2&Author=x&keyFrame=3",
    "http://cam/x?channel=1&subtype=0&resolution=640x480&user=admin&expires=9",
    # A user name alone, also %-encoded, is no password.
    "http://us%40er@host/x",
    # A name without a value has nothing to hide.
    "http://cam/x?token&a=1",
    "http://cam/x?a=1&b=2;c=3#top",
    # Not URLs at all: webcam indexes, device paths, file paths.
    "0",
    "/dev/video0",
    "",
    "/videos/gate.mp4",
    "videos/pwd=1.mp4",
]


@pytest.mark.parametrize(("url", "expected"), MASKED)
def test_mask_credentials(url: str, expected: str) -> None:
    assert mask_credentials(url) == expected
    assert mask_credentials(expected) == expected  # masking twice changes nothing


@pytest.mark.parametrize("url", UNCHANGED)
def test_mask_credentials_leaves_urls_without_credentials_alone(url: str) -> None:
    assert mask_credentials(url) == url


@pytest.mark.parametrize("name", sorted({*SECRET_PARAMETERS, *CREDENTIAL_WORDS}))
def test_every_credential_name_in_any_case(name: str) -> None:
    for spelled in (name, name.upper(), name.title(), name[0].upper() + name[1:]):
        url = f"http://cam/x?user=admin&{spelled}={SECRET}&channel=2"
        assert mask_credentials(url) == f"http://cam/x?user=admin&{spelled}=***&channel=2"


def test_the_credential_words_are_the_ones_asked_for() -> None:
    asked = {"token", "secret", "pass", "key", "auth", "sig", "session", "credential"}
    assert set(CREDENTIAL_WORDS) == asked | {"sessid"}
    assert {"pwd", "pw"} == SECRET_PARAMETERS  # credential names without one of the words


@pytest.mark.parametrize(("url", "expected"), MASKED)
def test_secret_values_are_what_mask_credentials_masks(url: str, expected: str) -> None:
    # secret_values decides whether a submitted URL holds a secret inline: it must find one wherever masking does.
    values = secret_values(url)
    assert values and len(values) >= expected.count(MASK)
    assert set(secret_values(expected)) == {MASK}


@pytest.mark.parametrize("url", UNCHANGED)
def test_secret_values_find_nothing_where_nothing_is_masked(url: str) -> None:
    assert secret_values(url) == []


def test_the_seen_leaks_are_masked_and_found() -> None:
    """Issue 40: stored and shown in clear before."""
    assert secret_values("http://cam/x?access_token=abc&session_id=s9") == ["abc", "s9"]
    assert secret_values("rtsp://user%3Asecret@host/x") == ["secret"]
    assert mask_credentials("rtsp://user%3Asecret@host/x?access_token=abc&session_id=s9") == (
        "rtsp://user%3A***@host/x?access_token=***&session_id=***"
    )
    assert [is_credential_name(name) for name in ("keyframe", "monkey", "access_token", "session_id")] == [
        False,
        False,
        True,
        True,
    ]


def test_mask_urls_masks_every_url_in_a_text_and_keeps_its_quotes() -> None:
    text = (
        f"cannot open 'rtsp://admin:{SECRET}@cam/x?token={SECRET}': refused; "
        f'retrying "http://cam/video.cgi?user=admin&pwd={SECRET}" (see http://cam/help?key={SECRET}).'
    )
    assert mask_urls(text) == (
        "cannot open 'rtsp://admin:***@cam/x?token=***': refused; "
        'retrying "http://cam/video.cgi?user=admin&pwd=***" (see http://cam/help?key=***).'
    )
    assert mask_urls("no URL here: pwd=1") == "no URL here: pwd=1"


# --- error messages ------------------------------------------------------------------------------------------


def test_errors_meant_for_the_user_never_carry_a_credential() -> None:
    url = f"http://admin:{SECRET}@cam/video.cgi?user=admin&pwd={SECRET}"
    for error in (ConfigError(f"sources.0: {url}: bad"), SourceError(f"camera door: cannot open {url}")):
        shown = (str(error), repr(error), *map(str, error.args), str(pickle.loads(pickle.dumps(error))))
        assert all(SECRET not in text for text in shown), shown
        assert "http://admin:***@cam/video.cgi?user=admin&pwd=***" in str(error)
    assert ConfigError("x").exit_code == 2
    assert VisioncapError("a", 3).args == ("a", 3)


def _pipeline_text(source: str) -> str:
    return f"name: p\nvlm: {{model: m}}\nsources:\n  - camera: door\n{source}"


CAMERA_URL = f"rtsp://admin:{SECRET}@cam.example/live?token={SECRET}&channel=1"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # A URL as a key: pydantic and the duplicate-key check name the key in the message.
        (f"    kind: rtsp\n    url: rtsp://cam/x\n    {CAMERA_URL}: 1\n", "sources.0.rtsp://admin:***@cam.example"),
        (f"    kind: rtsp\n    url: x\n    {CAMERA_URL}: 1\n    {CAMERA_URL}: 2\n", "key given twice"),
        # `kind` left out: the URL would be a video file that does not exist, named in the message.
        (f"    path: {CAMERA_URL}\n", "sources.0.path: is a URL, not a file or folder"),
        (f"    kind: folder\n    path: {CAMERA_URL}\n", "a network camera needs `kind: rtsp`"),
    ],
    ids=["extra-key", "duplicate-key", "url-as-file", "url-as-folder"],
)
def test_config_errors_never_repeat_a_password(tmp_path: Path, source: str, expected: str) -> None:
    path = write_pipeline(tmp_path, _pipeline_text(source))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    message = str(info.value)
    assert expected in message, message
    assert SECRET not in message, message


def test_cli_log_lines_mask_urls_in_messages_and_tracebacks() -> None:
    # The CLI's own logging setup, in a process of its own (basicConfig does nothing under pytest's handlers).
    script = (
        "import logging\n"
        "from visioncap.cli import _setup_logging\n"
        "_setup_logging('INFO')\n"
        "try:\n"
        f"    raise RuntimeError('cannot open http://cam/video.cgi?user=admin&pwd={SECRET}')\n"
        "except RuntimeError:\n"
        f"    logging.getLogger('visioncap.test').exception('camera %s failed', 'rtsp://a:{SECRET}@cam/x')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO, check=True
    )
    assert "camera rtsp://a:***@cam/x failed" in result.stderr, result.stderr
    assert "RuntimeError: cannot open http://cam/video.cgi?user=admin&pwd=***" in result.stderr, result.stderr
    assert SECRET not in result.stderr


def test_masking_formatter_keeps_the_record_itself() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "open %s", (f"http://cam/x?pwd={SECRET}",), None)
    assert MaskingFormatter("%(message)s").format(record) == "open http://cam/x?pwd=***"
    assert SECRET in record.getMessage()  # other handlers (pytest's, a user's) get the record as it was logged


class _FailingSource(FrameSource):
    """A source whose frames() raises with the URL in the message, as a third-party error might."""

    _config: StreamSourceConfig

    def __init__(self, camera: str, url: str) -> None:
        super().__init__(StreamSourceConfig(camera=camera, kind="http", url=url))

    def frames(self) -> Iterator[Frame]:
        raise RuntimeError(f"cannot decode {self._config.url}")
        yield  # pragma: no cover

    def stop(self) -> None:
        pass

    @property
    def description(self) -> str:
        return mask_credentials(self._config.url)

    def time_anchor(self) -> datetime:
        return datetime.now(UTC)

    def _full_rate(self) -> float:
        return 1.0


def test_a_failing_camera_reports_its_error_without_the_password() -> None:
    finished: dict[str, str | None] = {}
    done = threading.Event()

    def on_finished(camera: str, error: str | None) -> None:
        finished[camera] = error
        done.set()

    hub = FrameHub([_FailingSource("door", f"http://cam/x?user=admin&pwd={SECRET}")], on_finished=on_finished)
    hub.start()
    assert done.wait(30)
    hub.join(10)
    assert finished == {"door": "camera door: RuntimeError: cannot decode http://cam/x?user=admin&pwd=***"}


# --- stream sources --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_gradient_clip(tmp_path_factory.mktemp("credentials-video") / "clip.mp4")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stream_config(url: str, kind: str, **overrides: Any) -> StreamSourceConfig:
    settings: dict[str, Any] = {
        "camera": "door",
        "kind": kind,
        "url": url,
        "open_timeout_s": 5.0,
        "read_timeout_s": 5.0,
        "reconnect_initial_s": 0.2,
        "reconnect_max_s": 1.0,
    }
    return StreamSourceConfig(**(settings | overrides))


def assert_no_secret(text: str) -> None:
    assert SECRET not in text, text[-3000:]


def test_mjpeg_camera_with_credentials_in_the_query_streams_and_logs_them_masked(
    clip: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    # The server answers only this exact request target: frames arriving prove the camera got its credentials.
    with MjpegServer(clip, fps=20, path=f"/video.cgi?user=admin&pwd={SECRET}&channel=1") as camera:
        states = StateRecorder()
        source = StreamSource(stream_config(camera.url, "http"), on_state=states)
        with FrameCollector(source) as collector:
            collector.wait_count(3)
            states.wait_for(CameraState.ONLINE)
        port = camera.url.split(":")[2].split("/")[0]
    masked = f"http://127.0.0.1:{port}/video.cgi?user=admin&pwd=***&channel=1"
    lines = [r.getMessage() for r in caplog.records if r.name == "visioncap.sources.stream"]
    assert any(masked in line and "online" in line for line in lines), lines
    assert_no_secret(caplog.text)
    out, err = capfd.readouterr()
    assert_no_secret(out + err)  # FFmpeg's and OpenCV's own messages too


@pytest.mark.parametrize("kind", ["rtsp", "http"])
def test_dead_camera_is_reported_without_its_credentials(
    kind: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    port = closed_port()
    url = f"{kind}://admin:{SECRET}@127.0.0.1:{port}/stream?token={SECRET}&PWD={SECRET}&channel=1"
    states = StateRecorder()
    source = StreamSource(stream_config(url, kind), on_state=states)
    with FrameCollector(source) as collector:
        states.wait_for(CameraState.RECONNECTING)
        assert collector.taken == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert f"{kind}://admin:***@127.0.0.1:{port}/stream?token=***&PWD=***&channel=1" in errors[0], errors
    assert "cannot open" in errors[0]
    assert_no_secret(caplog.text)
    out, err = capfd.readouterr()
    assert_no_secret(out + err)


# --- stored rows and the API -----------------------------------------------------------------------------------


def api_client(data_dir: Path, database: str) -> TestClient:
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        database_url=database,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"})],
    )
    return TestClient(create_app(settings), headers={"Authorization": f"Bearer {READ_KEY}"})


def test_api_masks_rows_stored_before_query_parameters_were_masked(tmp_path: Path) -> None:
    database = f"sqlite:///{tmp_path / 'old.db'}"
    store = CaptionStore(create_db_engine(database))
    store.create_schema()
    # What an earlier version wrote: the user info password masked, the query left as it was.
    old_source = f"http://admin:***@cam/video.cgi?user=admin&pwd={SECRET}"
    row_id = store.add(
        NewCaption(
            pipeline="p",
            camera="door",
            source=old_source,
            frame_index=0,
            offset_s=0.0,
            captured_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
            reason="new-event",
            event_key="door:1",
            event_ids=[1],
            score=0.5,
            people=[],
            image_width=64,
            image_height=48,
            image_tokens=4,
            model="m",
        )
    )
    now = datetime.now(UTC)
    write_camera(
        store.engine,
        CameraReport("door", "p", old_source, "failed", now, error=f"camera door: OSError: {old_source} refused"),
    )
    with api_client(tmp_path / "data", database) as client:
        page = client.get("/v1/captions")
        one = client.get(f"/v1/captions/{row_id}")
        cameras = client.get("/v1/cameras")
    for response in (page, one, cameras):
        assert response.status_code == 200, response.text
        assert_no_secret(response.text)
    masked = "http://admin:***@cam/video.cgi?user=admin&pwd=***"
    assert page.json()["items"][0]["source"] == masked
    assert one.json()["source"] == masked
    assert cameras.json()["items"][0]["error"] == f"camera door: OSError: {masked} refused"


@pytest.mark.detector
def test_pipeline_on_a_camera_with_credentials_stores_and_serves_it_masked(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    video = tmp_path / "person.mp4"
    make_event_video(video, [("zidane-right", 4)])
    database = f"sqlite:///{tmp_path / 'c.db'}"
    store = CaptionStore(create_db_engine(database))
    store.create_schema()
    dead_vlm = f"http://127.0.0.1:{closed_port()}/v1"  # rows stay pending: what is stored is what matters here
    with MjpegServer(video, path=f"/video.cgi?user=admin&pwd={SECRET}") as camera:
        url = camera.url.replace("http://", f"http://viewer:{SECRET}@")
        data = pipeline_dict(video)
        data["sources"] = [{"camera": "door", "kind": "http", "url": url, "analyze_fps": 5, "reconnect_max_s": 1}]
        data["vlm"] = {**data["vlm"], "base_url": dead_vlm, "timeout_s": 2}
        config = PipelineConfig.model_validate(yaml.safe_load(yaml.safe_dump(data)))
        settings = Settings(database_url=database, data_dir=tmp_path / "data")
        with build_pipeline(config, settings, check_vlm=False) as pipeline:
            thread = threading.Thread(target=pipeline.run, name="credentials-pipeline", daemon=True)
            thread.start()
            try:
                wait_for(lambda: store.count() >= 1, WAIT_S, "a row selected from the camera")
            finally:
                pipeline.stop()
                thread.join(60)
        assert not thread.is_alive()
        masked = url.replace(f"viewer:{SECRET}@", "viewer:***@").replace(f"pwd={SECRET}", "pwd=***")
    assert masked.endswith("/video.cgi?user=admin&pwd=***") and "viewer:***@" in masked
    rows = store.list(limit=50)
    assert rows and {row.source for row in rows} == {masked}
    assert camera_states(store.engine)["door"].source == masked
    with api_client(tmp_path / "data", database) as client:
        responses = [client.get("/v1/captions"), client.get(f"/v1/captions/{rows[0].id}"), client.get("/v1/cameras")]
    for response in responses:
        assert response.status_code == 200, response.text
        assert_no_secret(response.text)
    assert responses[0].json()["items"][0]["source"] == masked
    assert_no_secret(caplog.text)
