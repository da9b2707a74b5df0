"""Live cameras (RTSP, HTTP/MJPEG, webcams) read with OpenCV, where only the newest frame matters.

A reader thread drains the camera as fast as it sends and keeps one frame, the newest: a detector slower than the
camera then analyses what is happening now instead of falling further and further behind, and memory stays at
one frame whatever the speed difference. A lost stream is reopened with a new capture (OpenCV's old one never
recovers after the server restarts), with waits growing from `reconnect_initial_s` to `reconnect_max_s`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import cv2
import numpy as np

from visioncap.config.settings import load_settings
from visioncap.config.sources import StreamSourceConfig, webcam_problem
from visioncap.frames import Frame
from visioncap.sources.base import FrameSource
from visioncap.sources.registry import register_source
from visioncap.sources.state import StateListener
from visioncap.sources.urls import mask_urls
from visioncap.store.records import CameraState

log = logging.getLogger(__name__)

FFMPEG_OPTIONS_ENV = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
# FFmpeg's default probing makes an RTSP open take ~2.8 s; a camera sends one video stream, which half a second
# and 50 kB identify (~0.6 s).
RTSP_PROBE_OPTIONS = "analyzeduration;500000|probesize;50000"
# How long stop() waits for the threads. A thread blocked inside OpenCV cannot be interrupted; it is a daemon and
# releases its capture when OpenCV returns (within the open or read timeout).
STOP_JOIN_S = 2.0

_LEVELS = {
    CameraState.STARTING: logging.INFO,
    CameraState.ONLINE: logging.INFO,
    CameraState.RECONNECTING: logging.WARNING,
    CameraState.OFFLINE: logging.WARNING,
    CameraState.FINISHED: logging.INFO,
}

_Latest = tuple[int, float, np.ndarray]


class _FfmpegOptionsGate:
    """Sets OPENCV_FFMPEG_CAPTURE_OPTIONS around opens, safely for several cameras in one process.

    OpenCV reads the variable inside every open, and the environment belongs to the whole process: a camera that
    wants UDP must not open while another camera's TCP setting is in place, and nobody may change the value under a
    running open. Opens that want the same value run side by side, because an open can take its whole timeout and
    one lock for all would let a dead camera hold up every other; an open wanting another value waits until they
    are done (and new arrivals wait behind it, so that it is not starved). When no open runs, the process's own
    value is back in place for everything else that opens videos.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active: str | None = None
        self._users = 0
        self._waiting: Counter[str | None] = Counter()
        self._original: str | None = None

    def _may_enter(self, value: str | None) -> bool:
        if self._users == 0:
            return True
        others_waiting = any(count for other, count in self._waiting.items() if other != value)
        return self._active == value and not others_waiting

    @contextmanager
    def use(self, value: str | None) -> Iterator[None]:
        """Holds the variable at `value` (None: the process's own value) for the duration of the block."""
        with self._cond:
            self._waiting[value] += 1
            try:
                self._cond.wait_for(lambda: self._may_enter(value))
            finally:
                self._waiting[value] -= 1
            if self._users == 0:
                self._original = os.environ.get(FFMPEG_OPTIONS_ENV)
                self._active = value
                if value is not None:
                    os.environ[FFMPEG_OPTIONS_ENV] = value
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if self._users == 0:
                    if self._original is None:
                        os.environ.pop(FFMPEG_OPTIONS_ENV, None)
                    else:
                        os.environ[FFMPEG_OPTIONS_ENV] = self._original
                self._cond.notify_all()


_FFMPEG_OPTIONS = _FfmpegOptionsGate()

# The rate of a live camera is not known before it sends (and may change when it reconnects); the tracker's memory
# is sized for a typical camera.
ASSUMED_STREAM_FPS = 10.0


@register_source(StreamSourceConfig)
class StreamSource(FrameSource):
    """A live camera: yields the newest frame, reopens a lost stream, and reports its state.

    `frames()` starts the reader and blocks until a frame newer than the last one it yielded exists; it ends when
    `stop()` is called (or when the loop over it is left, which stops the source). Counters: `frames_read` (decoded
    from the camera), `frames_dropped` (decoded but replaced by a newer frame before anyone took them),
    `reconnects` (opens tried after the first one). `started_at` is the wall-clock time of offset 0 (the first
    `frames()` call), for turning `Frame.offset_s` into capture times.
    """

    _config: StreamSourceConfig

    def __init__(self, config: StreamSourceConfig, on_state: StateListener | None = None) -> None:
        super().__init__(config, on_state)
        self.state = CameraState.STARTING
        self.frames_dropped = 0
        self.reconnects = 0
        self.started_at: datetime | None = None
        self._masked_url = config.description
        # Read here, not passed in: every way a worker opens a camera goes through this, whoever made the config.
        # A bad setting is a ConfigError, which fails this camera alone.
        self._allowed_hosts = load_settings().camera_hosts() if config.kind != "webcam" else None
        self._lock = threading.Lock()
        # Consumers wait for a newer frame; the supervisor waits for its reader to fail or for the stall deadline.
        self._new_frame = threading.Condition(self._lock)
        self._reader_event = threading.Condition(self._lock)
        # Held across a state change and its log line and listener call, so that listeners see changes in order.
        self._state_lock = threading.RLock()
        self._start_lock = threading.Lock()
        self._stopping = threading.Event()
        self._latest: _Latest | None = None
        # Id of the capture whose frames count. Bumped to abandon a capture stuck in read(): its late frames are
        # then ignored and its thread ends on its own.
        self._attempt = 0
        self._attempt_failure: str | None = None
        self._attempt_got_frame = False
        self._last_frame_at = 0.0
        self._started_at = 0.0
        self._supervisor: threading.Thread | None = None
        self._reader: threading.Thread | None = None

    @property
    def description(self) -> str:
        return self._masked_url

    def time_anchor(self) -> datetime:
        """When `frames()` was first called (live frames are timed from then); until then, now."""
        return self.started_at or datetime.now(UTC)

    def _full_rate(self) -> float:
        return ASSUMED_STREAM_FPS

    def frames(self) -> Iterator[Frame]:
        self._start()
        period = 1.0 / self._config.analyze_fps if self._config.analyze_fps else 0.0
        next_due = 0.0
        try:
            while True:
                with self._new_frame:
                    while True:
                        if self._stopping.is_set():
                            return
                        now = time.monotonic()
                        if now < next_due:
                            # Not due yet: whatever arrives meanwhile replaces what is waiting, nothing queues.
                            self._new_frame.wait(next_due - now)
                        elif self._latest is None:
                            self._new_frame.wait()
                        else:
                            break
                    index, offset_s, image = self._latest
                    self._latest = None
                if period:
                    taken_at = time.monotonic()
                    # Keep the analysis grid while roughly on time, so frames arriving a little after their slot do
                    # not lower the rate; a consumer that fell behind restarts the grid instead of catching up
                    # with a burst. Two frames are thus never closer than half a period.
                    next_due = next_due + period if taken_at - next_due < period / 2 else taken_at + period
                yield Frame(camera=self.camera, index=index, offset_s=offset_s, image=image)
        finally:
            self.stop()

    def stop(self) -> None:
        """Ends the reader (waiting at most a few seconds for it) and sets the state to FINISHED."""
        with self._lock:
            self._stopping.set()
            self._new_frame.notify_all()
            self._reader_event.notify_all()
        deadline = time.monotonic() + STOP_JOIN_S
        with self._start_lock:
            supervisor = self._supervisor
        if supervisor is not None and supervisor is not threading.current_thread():
            supervisor.join(max(0.0, deadline - time.monotonic()))
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(max(0.0, deadline - time.monotonic()))
        self._transition(CameraState.FINISHED, "stopped")

    # -- reader side ---------------------------------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._supervisor is not None or self._stopping.is_set():
                return
            self._started_at = time.monotonic()
            self.started_at = datetime.now(UTC)
            self._supervisor = threading.Thread(target=self._supervise, name=f"stream-{self.camera}", daemon=True)
            self._supervisor.start()

    def _supervise(self) -> None:
        cfg = self._config
        self._transition(CameraState.STARTING, "opening the stream", announce=True)
        delay = cfg.reconnect_initial_s
        first = True
        while not self._stopping.is_set():
            try:
                failure, got_frame = self._run_attempt()
            except Exception as exc:
                # Whatever OpenCV or a listener throws, this camera keeps trying and the others never notice.
                log.exception("camera %s (%s): unexpected error", self.camera, self._masked_url)
                failure, got_frame = mask_urls(f"unexpected error: {exc!r}"), False
            if failure is None or self._stopping.is_set():
                break
            if got_frame:
                delay = cfg.reconnect_initial_s
            if first and not got_frame:
                self._transition(
                    CameraState.RECONNECTING,
                    f"{failure}; retrying in the background",
                    level=logging.ERROR,
                )
            elif self.state is not CameraState.ONLINE and delay >= cfg.reconnect_max_s:
                self._transition(
                    CameraState.OFFLINE, f"{failure}; retrying every {cfg.reconnect_max_s:g} s", level=logging.WARNING
                )
            else:
                self._transition(CameraState.RECONNECTING, failure)
            log.debug("camera %s (%s): %s; next open in %.2f s", self.camera, self._masked_url, failure, delay)
            first = False
            if self._stopping.wait(delay):
                break
            delay = min(delay * 2, cfg.reconnect_max_s)
            with self._lock:
                self.reconnects += 1

    def _run_attempt(self) -> tuple[str | None, bool]:
        """Opens the stream and reads it until it fails; returns why (None: stopping) and whether it gave frames."""
        cfg = self._config
        if problem := self._refusal():
            return f"cannot open the stream: {problem}", False
        started = time.monotonic()
        capture = self._open()
        if not capture.isOpened():
            capture.release()
            elapsed = time.monotonic() - started
            if elapsed >= 0.9 * cfg.open_timeout_s:
                return f"cannot open the stream: no answer within the {cfg.open_timeout_s:g} s open timeout", False
            return "cannot open the stream: connection failed or no playable video", False
        with self._lock:
            if self._stopping.is_set():
                capture.release()
                return None, False
            self._attempt += 1
            attempt = self._attempt
            self._attempt_failure = None
            self._attempt_got_frame = False
            self._last_frame_at = time.monotonic()
            reader = threading.Thread(
                target=self._read, args=(capture, attempt), name=f"stream-{self.camera}-read", daemon=True
            )
            self._reader = reader
            reader.start()
            # The watchdog: OpenCV's read() on a stream that stalls without closing (a frozen server, a cable
            # pulled without a TCP reset) blocks for about three times its read timeout, measured; count the
            # stream as lost after read_timeout_s without a frame instead, and leave that read to return alone.
            while True:
                if self._stopping.is_set():
                    return None, self._attempt_got_frame
                if self._attempt_failure is not None:
                    failure = self._attempt_failure
                    break
                remaining = self._last_frame_at + cfg.read_timeout_s - time.monotonic()
                if remaining <= 0:
                    failure = f"no frame for {cfg.read_timeout_s:g} s (stream stalled)"
                    self._attempt += 1
                    break
                self._reader_event.wait(remaining)
            got_frame = self._attempt_got_frame
            abandoned = self._attempt != attempt
        if not abandoned:
            # The reader failed on its own and is returning: let it release the capture before the reopen.
            reader.join(STOP_JOIN_S)
        return failure, got_frame

    def _refusal(self) -> str | None:
        """Why this camera may not be opened now, or None: a host outside VISIONCAP_CAMERA_ALLOWED_HOSTS (checked at
        every open, its name resolved then: what it resolves to may have changed since the camera was submitted),
        a webcam path out of /dev (rows stored before submissions were limited to network cameras)."""
        if self._config.kind == "webcam":
            return webcam_problem(self._config.url)
        return self._allowed_hosts.url_problem(self._config.url) if self._allowed_hosts else None

    def _open(self) -> cv2.VideoCapture:
        cfg = self._config
        if cfg.kind == "webcam":
            device: int | str = int(cfg.url) if cfg.url.strip().isdigit() else cfg.url
            # No timeout parameters: OpenCV refuses to open with parameters the chosen backend does not support,
            # and the watchdog covers a device that stops delivering.
            return cv2.VideoCapture(device)
        params = [
            cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
            round(cfg.open_timeout_s * 1000),
            cv2.CAP_PROP_READ_TIMEOUT_MSEC,
            round(cfg.read_timeout_s * 1000),
        ]
        # rtsp_transport must always be spelled out: with the variable set, FFmpeg otherwise falls back to UDP.
        options = f"rtsp_transport;{cfg.rtsp_transport}|{RTSP_PROBE_OPTIONS}" if cfg.kind == "rtsp" else None
        with _FFMPEG_OPTIONS.use(options):
            return cv2.VideoCapture(cfg.url, cv2.CAP_FFMPEG, params)

    def _read(self, capture: cv2.VideoCapture, attempt: int) -> None:
        try:
            while True:
                ok, image = capture.read()
                now = time.monotonic()
                with self._lock:
                    if attempt != self._attempt or self._stopping.is_set():
                        return
                    if not ok or image is None:
                        self._attempt_failure = "the stream ended or the connection was lost"
                        self._reader_event.notify_all()
                        return
                    index = self.frames_read
                    self.frames_read += 1
                    if self._latest is not None:
                        self.frames_dropped += 1
                    self._latest = (index, now - self._started_at, image)
                    self._last_frame_at = now
                    first = not self._attempt_got_frame
                    self._attempt_got_frame = True
                    self._new_frame.notify_all()
                if first:
                    self._transition(CameraState.ONLINE, "receiving frames", attempt=attempt)
        except Exception as exc:
            with self._lock:
                if attempt == self._attempt:
                    # Failures are logged with the state change; OpenCV's message may quote the URL.
                    self._attempt_failure = mask_urls(f"read error: {exc!r}")
                    self._reader_event.notify_all()
        finally:
            capture.release()

    def _transition(
        self,
        new: CameraState,
        reason: str,
        *,
        attempt: int | None = None,
        level: int | None = None,
        announce: bool = False,
    ) -> None:
        """Sets the state, logs the change once and tells the listener; stale or repeated changes are ignored."""
        with self._state_lock:
            with self._lock:
                if self.state is CameraState.FINISHED:
                    return
                if new is not CameraState.FINISHED and self._stopping.is_set():
                    return
                if attempt is not None and attempt != self._attempt:
                    return
                if new is self.state and not announce:
                    return
                self.state = new
            log.log(level or _LEVELS[new], "camera %s (%s): %s - %s", self.camera, self._masked_url, new, reason)
            if self._on_state is not None:
                try:
                    self._on_state(self.camera, new)
                except Exception:
                    log.exception("camera %s: state listener failed", self.camera)
