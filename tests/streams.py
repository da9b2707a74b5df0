"""Pytest-side helpers for live-stream tests: a real RTSP server process, and waiting on sources without sleeps."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
from helpers import missing

from visioncap.sources.stream import StreamSource
from visioncap.store.records import CameraState

SERVERS = Path(__file__).resolve().parent / "servers"
# How long a test waits for a state or for frames before failing: a bound on a broken test, never a measurement,
# so it is many times what a loaded 2-core machine needs (the waits return as soon as the condition holds).
WAIT_S = 30.0
SYSTEM_PYTHON = "/usr/bin/python3"
GSTREAMER_PACKAGES = (
    "gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-good gstreamer1.0-plugins-bad "
    "gstreamer1.0-plugins-ugly gstreamer1.0-libav gstreamer1.0-tools"
)
_GSTREAMER_CHECK = """
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer
Gst.init(None)
missing = [e for e in ("intervideosrc", "intervideosink", "x264enc", "rtph264pay", "decodebin", "videoconvert")
           if Gst.ElementFactory.find(e) is None]
if missing:
    raise SystemExit("missing GStreamer elements: " + ", ".join(missing))
"""


@cache
def _gstreamer_problem() -> str | None:
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} is missing"
    result = subprocess.run(
        [SYSTEM_PYTHON, "-c", _GSTREAMER_CHECK], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        return (result.stderr.strip().splitlines() or ["GStreamer check failed"])[-1]
    return None


def skip_unless_gstreamer() -> None:
    """Skips the test when the GStreamer RTSP server cannot run here; under CI=true that is a failure instead."""
    problem = _gstreamer_problem()
    if problem is not None:
        missing(
            f"GStreamer's RTSP server ({problem})", f"apt-get install -y --no-install-recommends {GSTREAMER_PACKAGES}"
        )


class RtspServer:
    """tests/servers/rtsp_server.py in a child process; kill, restart on the same port, freeze and thaw it."""

    def __init__(
        self,
        video: Path,
        *,
        port: int = 0,
        mount: str = "/stream",
        ready_timeout_s: float = 20.0,
        host: str = "127.0.0.1",
    ) -> None:
        self.video = video
        self.host = host
        self.port = port
        self.mount = mount
        self.ready_timeout_s = ready_timeout_s
        self.url = ""
        self.ready_s = 0.0
        self._process: subprocess.Popen[str] | None = None
        self._frozen = False
        # Kept for the server's whole life (all restarts) and closed in __exit__, so no `with` block fits.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115

    def start(self) -> str:
        """Starts the server (on the previous port after the first start) and waits for its READY line."""
        if self._process is not None:
            raise RuntimeError("RTSP server already running")
        started = time.monotonic()
        process = subprocess.Popen(
            [
                SYSTEM_PYTHON,
                str(SERVERS / "rtsp_server.py"),
                str(self.video),
                "--port",
                str(self.port),
                "--mount",
                self.mount,
                "--host",
                self.host,
            ],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._process = process
        lines: queue.Queue[str] = queue.Queue()
        # A thread reads stdout so that the wait below can time out; readline() alone would block for good.
        threading.Thread(target=lambda: [lines.put(line) for line in process.stdout or ()], daemon=True).start()
        deadline = started + self.ready_timeout_s
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.kill()
                raise RuntimeError(
                    f"RTSP server not ready within {self.ready_timeout_s} s: {self._stderr_tail()}"
                ) from None
            if line.startswith("READY "):
                break
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        self.ready_s = time.monotonic() - started
        return self.url

    def kill(self) -> None:
        """SIGKILL, as a crashed camera: no RTSP teardown, connections reset by the kernel."""
        if self._process is None:
            return
        self._process.kill()
        self._process.wait(10)
        self._process = None
        self._frozen = False

    def restart(self) -> str:
        """Starts again on the same port, right after kill()."""
        self.kill()
        return self.start()

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its connections open but sends nothing, like a hung camera."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)
        self._frozen = False

    def stop(self) -> None:
        if self._process is None:
            return
        if self._frozen:
            self.thaw()
        self._process.terminate()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    def _stderr_tail(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:] or "(no output)"

    def __enter__(self) -> RtspServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._stderr.close()


class StateRecorder:
    """A StateListener that records (monotonic time, state) and lets a test wait for a state with a timeout."""

    def __init__(self) -> None:
        self.changes: list[tuple[float, CameraState]] = []
        self._cond = threading.Condition()

    def __call__(self, camera: str, state: CameraState) -> None:
        with self._cond:
            self.changes.append((time.monotonic(), state))
            self._cond.notify_all()

    @property
    def states(self) -> list[CameraState]:
        with self._cond:
            return [state for _, state in self.changes]

    def wait_for(self, state: CameraState, *, after: float = 0.0, timeout: float = WAIT_S) -> float:
        """Monotonic time of the first change to `state` at or after `after`; fails the test after `timeout`."""

        def found() -> float | None:
            return next((at for at, s in self.changes if s is state and at >= after), None)

        with self._cond:
            if not self._cond.wait_for(lambda: found() is not None, timeout):
                pytest.fail(f"state {state} not reached within {timeout} s; states: {[s for _, s in self.changes]}")
            at = found()
            assert at is not None
            return at


@dataclass(frozen=True, slots=True)
class Taken:
    """What a consumer saw of one frame (images are not kept: tests must not hold memory the source bounds)."""

    index: int
    offset_s: float
    taken_at: float
    shape: tuple[int, ...]


class FrameCollector:
    """Runs `source.frames()` in a thread, like the pipeline does, and lets a test wait for frames."""

    def __init__(self, source: StreamSource, *, work: Callable[[], None] | None = None) -> None:
        self.source = source
        self.taken: list[Taken] = []
        self.error: BaseException | None = None
        self._work = work
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"collect-{source.camera}", daemon=True)

    def __enter__(self) -> FrameCollector:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.source.stop()
        self._thread.join(10)
        assert not self._thread.is_alive(), "frames() did not return after stop()"

    def _run(self) -> None:
        try:
            for frame in self.source.frames():
                with self._cond:
                    self.taken.append(Taken(frame.index, frame.offset_s, time.monotonic(), frame.image.shape))
                    self._cond.notify_all()
                if self._work is not None:
                    self._work()
        except BaseException as exc:
            self.error = exc
            raise

    def wait_for(self, predicate: Callable[[list[Taken]], bool], *, timeout: float = WAIT_S) -> list[Taken]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.taken), timeout):
                pytest.fail(f"frames not as expected within {timeout} s: {len(self.taken)} taken, error {self.error!r}")
            return list(self.taken)

    def wait_count(self, count: int, *, timeout: float = WAIT_S) -> list[Taken]:
        return self.wait_for(lambda taken: len(taken) >= count, timeout=timeout)
