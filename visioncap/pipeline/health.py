"""A running pipeline's own HTTP port: Prometheus metrics, liveness and readiness (`--metrics-port`, on the
address `--metrics-host` names)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from visioncap import __version__
from visioncap.pipeline.metrics import PipelineMetrics

log = logging.getLogger(__name__)

# (ready, details): not ready while captions cannot reach the database or frames cannot be saved.
Readiness = Callable[[], tuple[bool, dict[str, Any]]]


class HealthServer:
    """`/metrics`, `/healthz` and `/readyz` (200 ready, 503 degraded, JSON details) on one port, loopback unless
    `host` says otherwise (0.0.0.0 in a container, for probes from outside it)."""

    def __init__(self, readiness: Readiness, metrics: PipelineMetrics, port: int = 0, host: str = "127.0.0.1") -> None:
        handler = type("Handler", (_Handler,), {"readiness": staticmethod(readiness), "metrics": metrics})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> HealthServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    readiness: Readiness
    metrics: PipelineMetrics

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(200, self.metrics.render(), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._send(200, json.dumps({"status": "ok", "version": __version__}).encode(), "application/json")
        elif path == "/readyz":
            ready, details = self.readiness()
            body = json.dumps({"status": "ready" if ready else "degraded", "version": __version__, **details}).encode()
            self._send(200 if ready else 503, body, "application/json")
        else:
            self._send(404, b'{"error":"not found"}', "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "5")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("health: " + format, *args)
