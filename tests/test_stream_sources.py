"""Live stream and image folder sources against real servers: GStreamer RTSP in a child process, MJPEG over HTTP."""

from __future__ import annotations

import itertools
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from servers.mjpeg_server import MjpegServer
from streams import FrameCollector, RtspServer, StateRecorder, skip_unless_gstreamer

from visioncap.config.sources import FolderSourceConfig, StreamSourceConfig
from visioncap.errors import SourceError
from visioncap.sources.image_folder import ImageFolderSource
from visioncap.sources.state import CameraState
from visioncap.sources.stream import StreamSource
from visioncap.sources.urls import mask_credentials

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
        "read_timeout_s": 2.0,
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
    source = StreamSource(stream_config(rtsp.url))
    frames = source.frames()
    first = next(frames)
    assert first.camera == "cam-1" and first.index == 0
    started = time.monotonic()
    source.stop()
    assert time.monotonic() - started < 2.5
    assert source.state is CameraState.FINISHED
    assert list(frames) == []


def test_slow_consumer_gets_the_newest_frame_and_memory_stays_bounded(rtsp: RtspServer) -> None:
    source = StreamSource(stream_config(rtsp.url))
    work_s = 0.5  # a detector five times slower than the camera
    fresh = []
    yielded = 0
    for frame in source.frames():
        yielded += 1
        # The frame handed out is the newest decoded one (or the one before, if a frame lands right now).
        fresh.append(frame.index >= source.frames_read - 2)
        # At most one decoded frame waits for the consumer: nothing queues up.
        assert source.frames_read - source.frames_dropped - yielded <= 1
        if yielded == 5:
            break
        time.sleep(work_s)  # the consumer's work, not synchronisation
    assert source.state is CameraState.FINISHED
    assert all(fresh)
    # ~2 s at 10 fps while five frames were taken: most were dropped, not queued.
    assert source.frames_dropped >= 8
    assert source.frames_read - source.frames_dropped - yielded <= 1


def test_analyze_fps_paces_the_consumer(rtsp: RtspServer) -> None:
    source = StreamSource(stream_config(rtsp.url, analyze_fps=4))
    with FrameCollector(source) as collector:
        taken = collector.wait_count(6)
    gaps = [b.taken_at - a.taken_at for a, b in itertools.pairwise(taken)]
    print("pacing gaps", [round(g, 3) for g in gaps])
    # 4 per second: on average one per 0.25 s, and never two within half of that.
    assert min(gaps) >= 0.12, gaps
    assert 0.23 <= sum(gaps) / len(gaps) <= 0.4, gaps
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
        states.wait_for(CameraState.RECONNECTING, timeout=10)
        # The other camera is not held up by the dead one.
        healthy_frames.wait_count(10)
        # Waits of 0.2, 0.4, 0.8 s, then the 1 s maximum: reported once as offline, still retrying.
        states.wait_for(CameraState.OFFLINE, timeout=10)
        assert down.reconnects >= 3
        assert down_frames.taken == [] and down_frames.error is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and "cam-down" in r.getMessage()]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    message = errors[0].getMessage()
    assert "admin:***@127.0.0.1" in message and "cannot open" in message
    assert all("hunter2" not in r.getMessage() for r in caplog.records)
    assert states.states == [CameraState.STARTING, CameraState.RECONNECTING, CameraState.OFFLINE, CameraState.FINISHED]


def test_killed_server_reconnects_after_restart_on_the_same_port(own_rtsp: RtspServer) -> None:
    states = StateRecorder()
    source = StreamSource(stream_config(own_rtsp.url), on_state=states)
    with FrameCollector(source) as collector:
        states.wait_for(CameraState.ONLINE)
        collector.wait_count(3)
        port = own_rtsp.port
        killed_at = time.monotonic()
        own_rtsp.kill()
        lost_at = states.wait_for(CameraState.RECONNECTING, after=killed_at, timeout=5)
        read_before = source.frames_read
        restarted_at = time.monotonic()
        own_rtsp.start()
        assert own_rtsp.port == port
        back_at = states.wait_for(CameraState.ONLINE, after=restarted_at, timeout=10)
        taken = collector.wait_for(lambda t: t[-1].index >= read_before + 3, timeout=10)
    assert lost_at - killed_at < 1.0
    print(f"kill detected in {lost_at - killed_at:.3f} s; online {back_at - restarted_at:.3f} s after restart")
    assert source.reconnects >= 1
    indexes = [t.index for t in taken]
    assert indexes == sorted(set(indexes))  # the count runs on across the reconnect


def test_frozen_server_is_detected_within_the_read_timeout(own_rtsp: RtspServer) -> None:
    states = StateRecorder()
    read_timeout_s = 1.5
    source = StreamSource(
        stream_config(own_rtsp.url, read_timeout_s=read_timeout_s, open_timeout_s=2.0), on_state=states
    )
    with FrameCollector(source) as collector:
        collector.wait_count(3)
        frozen_at = time.monotonic()
        own_rtsp.freeze()
        lost_at = states.wait_for(CameraState.RECONNECTING, after=frozen_at, timeout=read_timeout_s + 3)
        thawed_at = time.monotonic()
        own_rtsp.thaw()
        back_at = states.wait_for(CameraState.ONLINE, after=thawed_at, timeout=15)
        count = len(collector.taken)
        collector.wait_count(count + 3)
    print(f"freeze detected in {lost_at - frozen_at:.3f} s; online {back_at - thawed_at:.3f} s after thaw")
    # Detected by the watchdog after read_timeout_s, not after OpenCV's ~3x read timeout.
    assert lost_at - frozen_at < read_timeout_s + 1.0


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
