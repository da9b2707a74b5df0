"""What `bench fleet` runs against: a throwaway PostgreSQL reachable from other network namespaces, live MJPEG
cameras whose people come and go on a known clock, and `visioncap worker` processes.

The cameras are served here rather than from a file so that the bench knows, on this machine's wall clock, when
a person appeared in each stream: the first-caption delay is measured from that moment.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import cv2
import httpx
import numpy as np
import yaml
from sqlalchemy import Engine, text

from visioncap.bench.common.machine import REPO
from visioncap.bench.detection.shared import PERSON_CLASSES, WEIGHTS
from visioncap.serve.ports import free_port

BOUNDARY = "visioncapframe"
WIDTH, HEIGHT = 640, 480


# --- PostgreSQL -------------------------------------------------------------------------------------------------


# --- cameras ----------------------------------------------------------------------------------------------------


def _frames() -> tuple[bytes, bytes]:
    """(nobody, people) as JPEGs: a plain wall with faint noise, and Ultralytics' zidane.jpg (two people) on it."""
    import ultralytics

    rng = np.random.default_rng(1)
    wall = np.full((HEIGHT, WIDTH, 3), (120, 130, 140), np.float32) + rng.normal(0, 2, (HEIGHT, WIDTH, 3))
    wall = wall.clip(0, 255).astype(np.uint8)
    source = Path(ultralytics.__file__).parent / "assets" / "zidane.jpg"
    photo = cv2.imread(str(source))
    if photo is None:
        raise FileNotFoundError(f"{source}: Ultralytics' sample photo is missing or unreadable")
    scale = WIDTH / photo.shape[1]
    photo = cv2.resize(photo, (WIDTH, round(photo.shape[0] * scale)))
    people = wall.copy()
    top = (HEIGHT - photo.shape[0]) // 2
    people[top : top + photo.shape[0]] = photo
    out = []
    for image in (wall, people):
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
        assert ok
        out.append(jpeg.tobytes())
    return out[0], out[1]


@dataclass
class CameraFeeds:
    """MJPEG cameras /cam0.mjpg ... at `fps`, each a loop of `empty_s` of nobody then `people_s` of two people,
    phase-shifted per camera so that their arrivals spread over the loop. `arrivals[camera]` holds the wall
    times (time.time()) at which a person frame was first written after nobody, per client connection."""

    count: int
    fps: float = 10.0
    empty_s: float = 4.0
    people_s: float = 4.0
    host: str = "127.0.0.1"
    arrivals: dict[str, list[float]] = field(default_factory=dict)
    _httpd: ThreadingHTTPServer | None = None
    _stopping: threading.Event = field(default_factory=threading.Event)

    def camera(self, index: int) -> str:
        return f"cam{index}"

    def url(self, index: int, host: str | None = None) -> str:
        assert self._httpd is not None
        return f"http://{host or '127.0.0.1'}:{self._httpd.server_address[1]}/{self.camera(index)}.mjpg"

    def __enter__(self) -> CameraFeeds:
        empty, people = _frames()
        loop = round((self.empty_s + self.people_s) * self.fps)
        first_person = round(self.empty_s * self.fps)
        feeds = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.strip("/").removesuffix(".mjpg")
                if not name.startswith("cam") or not name[3:].isdigit() or int(name[3:]) >= feeds.count:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.end_headers()
                # Each camera starts at its own phase; a reconnecting client resumes on the same clock.
                phase = round(int(name[3:]) * loop / max(feeds.count, 1))
                period = 1.0 / feeds.fps
                started = time.monotonic()
                step, was_people = 0, True  # no arrival is counted for a stream that opens on people
                try:
                    while not feeds._stopping.is_set():
                        position = (step + phase) % loop
                        is_people = position >= first_person
                        if is_people and not was_people:
                            feeds.arrivals.setdefault(name, []).append(time.time())
                        was_people = is_people
                        jpeg = people if is_people else empty
                        self.wfile.write(
                            f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n".encode()
                        )
                        self.wfile.write(jpeg + b"\r\n")
                        self.wfile.flush()
                        step += 1
                        feeds._stopping.wait(max(0.0, started + step * period - time.monotonic()))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer((self.host, 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="fleet-cameras", daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


# --- workers ----------------------------------------------------------------------------------------------------


def write_pipeline(folder: Path, cameras: list[tuple[str, str]], analyze_fps: float, max_tokens: int) -> Path:
    """A pipeline file: the person detector at 320 (as the detector benchmarks), the default selection policy,
    short captions from the tiny model (its random weights never stop on their own)."""
    data = {
        "name": "fleet",
        "sources": [{"camera": c, "kind": "http", "url": u, "analyze_fps": analyze_fps} for c, u in cameras],
        "detector": {"weights": WEIGHTS, "person_classes": PERSON_CLASSES, "image_size": 320},
        "caption": {"max_tokens": max_tokens, "max_image_tokens": 256},
        "vlm": {"model": "visioncap-tiny", "extra_body": {"ignore_eos": True}},
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@dataclass
class Worker:
    """One `visioncap worker` process (its log in a file: a pipe nobody reads would block it)."""

    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int | None

    @property
    def pid(self) -> int:
        return self.process.pid

    def serving(self) -> bool:
        """Its /metrics answers: the detector has loaded (the health server starts after it)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def frames(self, camera: str) -> float:
        """visioncap_frames_analysed_total{camera} on its /metrics (0 before the first)."""
        if self.metrics_port is None:
            raise RuntimeError("this worker serves no metrics")
        try:
            body = httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return 0.0
        prefix = f'visioncap_frames_analysed_total{{camera="{camera}"}}'
        for line in body.splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()


def start_worker(
    pipeline: Path,
    env: dict[str, str],
    log: Path,
    capacity: int,
    lease_s: float,
    renew_s: float,
    prefix: list[str] | None = None,
    metrics: bool = True,
) -> Worker:
    port = free_port() if metrics else None
    argv = [sys.executable, "-m", "visioncap", "worker", "--pipeline", str(pipeline), "--capacity", str(capacity),
            "--lease-s", str(lease_s), "--renew-s", str(renew_s), "--progress", "none"]  # fmt: skip
    if port is not None:
        argv += ["--metrics-port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*(prefix or []), *argv], stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO
        )
    return Worker(process, log, port)


@contextlib.contextmanager
def workers_stopped(workers: list[Worker]) -> Iterator[list[Worker]]:
    try:
        yield workers
    finally:
        for worker in workers:
            worker.stop()


# --- observations -----------------------------------------------------------------------------------------------


def lease_owner(engine: Engine, camera: str) -> str | None:
    with engine.connect() as conn:
        return cast(
            "str | None",
            conn.scalar(
                text("SELECT owner FROM camera_leases WHERE camera = :c AND expires_at > now()"), {"c": camera}
            ),
        )


def owned_by(engine: Engine, camera: str, worker: Worker) -> bool:
    owner = lease_owner(engine, camera)
    return owner is not None and f"/{worker.pid}/" in owner


def has_heartbeat(engine: Engine, worker: Worker) -> bool:
    with engine.connect() as conn:
        ids = conn.scalars(text("SELECT id FROM workers")).all()
    return any(f"/{worker.pid}/" in wid for wid in ids)


def wait_until(condition: Any, timeout_s: float, what: str, poll_s: float = 0.05) -> float:
    """Polls `condition()` until true; returns time.monotonic() when it was seen. TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
