"""A real HTTP MJPEG camera for tests: a video's frames as `multipart/x-mixed-replace`, looped forever.

Runs in the test process (stdlib only, plus OpenCV to decode the video once):

    with MjpegServer(video) as server:
        StreamSource(StreamSourceConfig(camera="cam", kind="http", url=server.url))
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cv2

BOUNDARY = "visioncapframe"


def _jpeg_frames(video: Path) -> tuple[list[bytes], float]:
    capture = cv2.VideoCapture(str(video))
    try:
        fps = capture.get(cv2.CAP_PROP_FPS) or 10.0
        frames = []
        while True:
            ok, image = capture.read()
            if not ok:
                break
            ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 80])
            if ok:
                frames.append(jpeg.tobytes())
    finally:
        capture.release()
    if not frames:
        raise ValueError(f"no frame could be decoded from {video}")
    return frames, fps


class MjpegServer:
    """Serves `video` as MJPEG at its own frame rate (or `fps`) on 127.0.0.1; every client gets the loop."""

    def __init__(
        self, video: Path, *, fps: float | None = None, path: str = "/stream.mjpg", host: str = "127.0.0.1"
    ) -> None:
        self._frames, self._video_fps = _jpeg_frames(video)
        self._host = host
        # None: every client gets the loop from its first frame, one frame per send. A wall-clock time
        # (time.time()): one scene for all clients, as a real camera shows, the video's frame k at origin + k /
        # its own frame rate (whatever the sending rate) and the first frame before origin; what a client sees at
        # a time is then known without asking it.
        self.origin: float | None = None
        self._period = 1.0 / (fps or self._video_fps)
        self._path = path
        self._stopping = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.frames_sent = 0

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("MjpegServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("MjpegServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}{self._path}"

    def start(self) -> MjpegServer:
        self._stopping.clear()
        self._httpd = ThreadingHTTPServer((self._host, 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="mjpeg-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        # Streaming handlers loop until told to stop; shutdown() only ends the accept loop.
        self._stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> MjpegServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != server._path:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                server._stream(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def _frame_at(self, sent: int) -> int:
        if self.origin is None:
            return sent % len(self._frames)
        elapsed = time.time() - self.origin
        return int(elapsed * self._video_fps) % len(self._frames) if elapsed >= 0 else 0

    def _stream(self, handler: BaseHTTPRequestHandler) -> None:
        next_at = time.monotonic()
        index = 0
        try:
            while not self._stopping.is_set():
                jpeg = self._frames[self._frame_at(index)]
                handler.wfile.write(
                    f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpeg)}\r\n\r\n".encode()
                )
                handler.wfile.write(jpeg)
                handler.wfile.write(b"\r\n")
                handler.wfile.flush()
                self.frames_sent += 1
                index += 1
                # Pace like a camera; waiting on the stop event lets stop() end the stream at once.
                next_at += self._period
                self._stopping.wait(max(0.0, next_at - time.monotonic()))
        except (BrokenPipeError, ConnectionResetError):
            pass
