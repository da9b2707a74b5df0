"""Live stream and image folder sources against real servers: GStreamer RTSP in a child process, MJPEG over HTTP."""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from servers.mjpeg_server import MjpegServer
from streams import WAIT_S, FrameCollector, RtspServer, StateRecorder, skip_unless_gstreamer

from visioncap.config.sources import FolderSourceConfig, StreamSourceConfig
from visioncap.errors import SourceError
from visioncap.sources.image_folder import ImageFolderSource
from visioncap.sources.stream import StreamSource
from visioncap.sources.urls import mask_credentials
from visioncap.store.records import CameraState

WIDTH, HEIGHT, FPS, SECONDS = 320, 240, 10, 3


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s of 320x240 at 10 fps; each frame's brightness encodes its number, so order is visible in pixels."""
    path = tmp_path_factory.mktemp("stream-video") / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    assert writer.isOpened()
    for i in range(FPS * SECONDS):
        image = np.full((HEIGHT, WIDTH, 3), 8 * i, np.uint8)
        cv2.putText(image, str(i), (110, 150), cv2.FONT_HERSHEY_SIMPLEX, 3, (0, 0, 255), 5)
        writer.write(image)
    writer.release()
    return path


@pytest.fixture(scope="module")
def rtsp(video: Path) -> Iterator[RtspServer]:
    """One server for the tests that leave it alone."""
    skip_unless_gstreamer()
    with RtspServer(video) as server:
        yield server


@pytest.fixture
def own_rtsp(video: Path) -> Iterator[RtspServer]:
    """A server of the test's own, to kill, restart or freeze."""
    skip_unless_gstreamer()
    with RtspServer(video) as server:
        yield server


def stream_config(url: str, **overrides: Any) -> StreamSourceConfig:
    settings: dict[str, Any] = {
        "camera": "cam-1",
        "kind": "rtsp",
        "url": url,
        "open_timeout_s": 5.0,
        # The product's default: a loaded machine's pauses must never look like a stalled camera to the watchdog
        # (that would add reconnects to tests that expect none); the stall tests set their own.
        "read_timeout_s": 5.0,
        "reconnect_initial_s": 0.2,
        "reconnect_max_s": 1.0,
    }
    return StreamSourceConfig(**(settings | overrides))


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_mask_credentials() -> None:
    assert mask_credentials("rtsp://user:secret@host/x") == "rtsp://user:***@host/x"
    assert mask_credentials("rtsp://admin:p@ss@10.0.0.2:554/live?a=1") == "rtsp://admin:***@10.0.0.2:554/live?a=1"
    assert mask_credentials("http://user@host/x") == "http://user@host/x"
    assert mask_credentials("rtsp://127.0.0.1:8554/stream") == "rtsp://127.0.0.1:8554/stream"
    assert mask_credentials("http://host/path@x") == "http://host/path@x"
    assert mask_credentials("0") == "0"
    assert mask_credentials("/dev/video0") == "/dev/video0"


def test_rtsp_frames_arrive_and_state_goes_online(rtsp: RtspServer) -> None:
    states = StateRecorder()
    source = StreamSource(stream_config(rtsp.url), on_state=states)
    assert source.state is CameraState.STARTING
    with FrameCollector(source) as collector:
        taken = collector.wait_count(5)
        assert source.state is CameraState.ONLINE
    assert states.states == [CameraState.STARTING, CameraState.ONLINE, CameraState.FINISHED]
    assert source.state is CameraState.FINISHED
    assert all(t.shape == (HEIGHT, WIDTH, 3) for t in taken)
    indexes = [t.index for t in taken]
    assert indexes == sorted(set(indexes))
    offsets = [t.offset_s for t in taken]
    assert offsets == sorted(offsets) and offsets[0] >= 0
    assert source.started_at is not None
    assert source.reconnects == 0


def test_stop_is_prompt_and_ends_frames(rtsp: RtspServer) -> None:
    # A camera of its own, so that its threads (named after it) are told apart from other tests' threads.
    source = StreamSource(stream_config(rtsp.url, camera="cam-stop"))
    frames = source.frames()
    # Not index 0 necessarily: on a loaded machine the first frames decode in a burst and the newest is handed out.
    assert next(frames).camera == "cam-stop"
    source.stop()
    # stop() gives up on its threads after STOP_JOIN_S and returns either way, so how long it took proves little
    # (and a clock bound flakes on a loaded machine). That its threads are gone when it returns proves they were
    # woken and left: a supervisor left asleep would sleep on to its read_timeout_s (5 s) watchdog deadline.
    assert [t.name for t in threading.enumerate() if t.name.startswith("stream-cam-stop")] == []
    assert source.state is CameraState.FINISHED
    assert list(frames) == []


def test_slow_consumer_gets_the_newest_frame_and_memory_stays_bounded(rtsp: RtspServer) -> None:
    source = StreamSource(stream_config(rtsp.url))
    work_s = 0.5  # a detector five times slower than the camera
    lags = []
    yielded = 0
    for frame in source.frames():
        yielded += 1
        # Frames decoded after the one handed out: 0 for the newest, 1 if a frame lands right now, 2 if a loaded
        # machine holds this thread up a little. A source handing out older frames lags by the whole work time
        # (about 5 frames at 10 fps), a queue by more each time.
        lags.append(source.frames_read - 1 - frame.index)
        # At most one decoded frame waits for the consumer: nothing queues up.
        assert source.frames_read - source.frames_dropped - yielded <= 1
        if yielded == 5:
            break
        time.sleep(work_s)  # the consumer's work, not synchronisation
    assert source.state is CameraState.FINISHED
    assert max(lags) <= 2, lags
    # ~2 s at 10 fps (about 15 dropped on a quiet machine) while five frames were taken: the reader went on draining
    # the camera during every 0.5 s of work (at least one frame dropped each time, however slow the machine) instead
    # of waiting for the consumer.
    assert source.frames_dropped >= 4
    assert source.frames_read - source.frames_dropped - yielded <= 1


def test_analyze_fps_paces_the_consumer(rtsp: RtspServer) -> None:
    period = 0.5  # 2 per second, from a 10 fps camera: unpaced, frames would come 0.1 s apart
    source = StreamSource(stream_config(rtsp.url, analyze_fps=1 / period))
    with FrameCollector(source) as collector:
        taken = collector.wait_count(6)
    gaps = [b.taken_at - a.taken_at for a, b in itertools.pairwise(taken)]
    print("pacing gaps", [round(g, 3) for g in gaps])
    # The source hands out frame k no earlier than k periods after the first, and never two within half a period;
    # the collector notes the time a little after the source decides, so each bound leaves a loaded machine 0.1 s
    # of scheduling delay per gap and still fails an unpaced source by far. The upper bound only says pacing does not
    # halve the rate (a frame arrives within 0.1 s of every slot).
    assert min(gaps) >= period / 2 - 0.1, gaps
    assert period - 0.1 <= sum(gaps) / len(gaps) <= 2 * period, gaps
    index_steps = [b.index - a.index for a, b in itertools.pairwise(taken)]
    assert max(index_steps) >= 2, index_steps  # frames in between were skipped


def test_unreachable_camera_logs_one_masked_error_and_keeps_trying(
    rtsp: RtspServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="visioncap.sources.stream")
    url = f"rtsp://admin:hunter2@127.0.0.1:{closed_port()}/stream"
    states = StateRecorder()
    down = StreamSource(stream_config(url, camera="cam-down"), on_state=states)
    healthy = StreamSource(stream_config(rtsp.url, camera="cam-up"))
    with FrameCollector(down) as down_frames, FrameCollector(healthy) as healthy_frames:
        states.wait_for(CameraState.RECONNECTING)
        # The other camera is not held up by the dead one.
        healthy_frames.wait_count(10)
        # Waits of 0.2, 0.4, 0.8 s, then the 1 s maximum: reported once as offline, still retrying.
        states.wait_for(CameraState.OFFLINE)
        assert down.reconnects >= 3
        assert down_frames.taken == [] and down_frames.error is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "cam-down" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "admin:***@127.0.0.1" in message and "cannot open" in message
    assert all("hunter2" not in r.getMessage() for r in caplog.records)
    assert states.states == [CameraState.STARTING, CameraState.RECONNECTING, CameraState.OFFLINE, CameraState.FINISHED]


def test_killed_server_reconnects_after_restart_on_the_same_port(
    own_rtsp: RtspServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="visioncap.sources.stream")
    states = StateRecorder()
    # Long, so that the watchdog cannot be what notices the kill: the failed read must.
    read_timeout_s = 10.0
    source = StreamSource(stream_config(own_rtsp.url, read_timeout_s=read_timeout_s), on_state=states)
    with FrameCollector(source) as collector:
        states.wait_for(CameraState.ONLINE)
        collector.wait_count(3)
        port = own_rtsp.port
        killed_at = time.monotonic()
        own_rtsp.kill()
        lost_at = states.wait_for(CameraState.RECONNECTING, after=killed_at)
        read_before = source.frames_read
        restarted_at = time.monotonic()
        own_rtsp.start()
        assert own_rtsp.port == port
        back_at = states.wait_for(CameraState.ONLINE, after=restarted_at)
        taken = collector.wait_for(lambda t: t[-1].index >= read_before + 3)
    print(f"kill detected in {lost_at - killed_at:.3f} s; online {back_at - restarted_at:.3f} s after restart")
    # The kernel resets the connection and read() fails within milliseconds: the loss is the reader's finding, not
    # the watchdog's, which would take read_timeout_s. Half of that leaves a loaded machine seconds of headroom.
    reasons = [r.getMessage() for r in caplog.records if "cam-1" in r.getMessage() and "reconnecting" in r.getMessage()]
    assert reasons and "connection was lost" in reasons[0], reasons
    assert lost_at - killed_at < read_timeout_s / 2
    assert source.reconnects >= 1
    indexes = [t.index for t in taken]
    assert indexes == sorted(set(indexes))  # the count runs on across the reconnect


def test_frozen_server_is_detected_within_the_read_timeout(
    own_rtsp: RtspServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="visioncap.sources.stream")
    states = StateRecorder()
    read_timeout_s = 3.0
    source = StreamSource(
        stream_config(own_rtsp.url, read_timeout_s=read_timeout_s, open_timeout_s=2.0), on_state=states
    )
    with FrameCollector(source) as collector:
        collector.wait_count(3)
        frozen_at = time.monotonic()
        own_rtsp.freeze()
        # Long enough for OpenCV's own timeout too, so that a missing watchdog fails the asserts below, not this.
        lost_at = states.wait_for(CameraState.RECONNECTING, after=frozen_at, timeout=4 * read_timeout_s + WAIT_S)
        thawed_at = time.monotonic()
        own_rtsp.thaw()
        back_at = states.wait_for(CameraState.ONLINE, after=thawed_at)
        count = len(collector.taken)
        collector.wait_count(count + 3)
    last_s = max(t.taken_at for t in collector.taken if t.taken_at < lost_at) - frozen_at
    print(f"freeze detected in {lost_at - frozen_at:.3f} s, last frame {last_s:.3f} s after the freeze")
    print(f"online {back_at - thawed_at:.3f} s after thaw")
    # Detected by the watchdog, not by OpenCV's read(), which blocks for about three times its read timeout (9 s
    # here) on a frozen stream: the reason says which. The watchdog fires read_timeout_s after the last frame, which
    # is usually at the freeze (3.0 s), but one loaded run took 6.2 s: most likely OpenCV's own timeout interrupt
    # (also read_timeout_s) came first and handed out a frame the decoder still held, restarting the count. So the
    # bound sits halfway between twice read_timeout_s and the 9 s of a source without a watchdog.
    reasons = [r.getMessage() for r in caplog.records if "cam-1" in r.getMessage() and "reconnecting" in r.getMessage()]
    assert reasons and "stream stalled" in reasons[0], reasons
    assert lost_at - frozen_at < 2.5 * read_timeout_s


def test_mjpeg_over_http(video: Path) -> None:
    states = StateRecorder()
    with MjpegServer(video) as server:
        source = StreamSource(stream_config(server.url, camera="cam-http", kind="http"), on_state=states)
        with FrameCollector(source) as collector:
            taken = collector.wait_count(5)
    assert all(t.shape == (HEIGHT, WIDTH, 3) for t in taken)
    assert states.states == [CameraState.STARTING, CameraState.ONLINE, CameraState.FINISHED]


# -- image folders -----------------------------------------------------------------------------------------------


def write_images(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        image = np.full((48, 64, 3), 10 * (i + 1), np.uint8)
        assert cv2.imwrite(str(folder / name), image)


def folder_config(path: Path, **overrides: Any) -> FolderSourceConfig:
    return FolderSourceConfig(**({"camera": "cam-dir", "kind": "folder", "path": path, "fps": 2.0} | overrides))


def test_image_folder_natural_order_and_timestamps(tmp_path: Path) -> None:
    # Written in this order, so pixel value 10*(k+1) tells which file a frame came from.
    names = ["frame1.jpg", "frame2.png", "frame10.bmp", "Frame11.jpeg"]
    write_images(tmp_path, names)
    (tmp_path / "notes.txt").write_text("not an image")
    source = ImageFolderSource(folder_config(tmp_path))
    frames = list(source.frames())
    assert [f.index for f in frames] == [0, 1, 2, 3]
    assert [f.offset_s for f in frames] == [0.0, 0.5, 1.0, 1.5]
    assert [round(float(f.image.mean()) / 10) for f in frames] == [1, 2, 3, 4]
    assert all(f.image.shape == (48, 64, 3) and f.camera == "cam-dir" for f in frames)
    assert source.frames_read == 4


def test_image_folder_subsamples_to_analyze_fps(tmp_path: Path) -> None:
    write_images(tmp_path, [f"img_{i:03d}.png" for i in range(10)])
    source = ImageFolderSource(folder_config(tmp_path, fps=4.0, analyze_fps=2.0))
    assert [f.index for f in source.frames()] == [0, 2, 4, 6, 8]


def test_image_folder_skips_a_corrupt_image(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_images(tmp_path, ["a1.jpg", "a3.jpg"])
    (tmp_path / "a2.jpg").write_bytes(b"\xff\xd8 this is not a jpeg")
    source = ImageFolderSource(folder_config(tmp_path))
    with caplog.at_level(logging.WARNING):
        frames = list(source.frames())
    assert [f.index for f in frames] == [0, 2]  # the broken one keeps its place in time
    assert source.frames_skipped == 1
    assert any("a2.jpg" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("case", ["missing", "empty", "only-corrupt"])
def test_image_folder_without_readable_images_is_an_error(tmp_path: Path, case: str) -> None:
    folder = tmp_path / "images"
    if case != "missing":
        folder.mkdir()
    if case == "only-corrupt":
        (folder / "x.png").write_bytes(b"garbage")
    with pytest.raises(SourceError, match="cam-dir"):
        list(ImageFolderSource(folder_config(folder)).frames())
