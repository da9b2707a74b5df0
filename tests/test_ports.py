"""A server started on a port another process took meanwhile is never mistaken for that process (visioncap.serve.ports).

The stranger is a real HTTP server in this process answering 200 to everything, as another test's gateway or API
on the same port would; the collision is made certain by handing the stranger's port to the start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import helpers
import httpx
import pytest

from visioncap.bench.common.gateway_proc import GatewayProcess
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.serve.ports import PortTakenError, check_own, free_port, holders, listens

KEY = "ports-camera-key"


class _Healthy(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def stranger() -> Iterator[int]:
    """A server of this process that answers 200 on every path; yields its port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_holder_of_a_port_is_known_and_a_stranger_is_named() -> None:
    with stranger() as port:
        assert listens(os.getpid(), port)
        assert os.getpid() in holders(port)
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert not listens(child.pid, port)
            with pytest.raises(PortTakenError, match=f"port {port} is held by pid {os.getpid()}"):
                check_own(child.pid, port)
        finally:
            child.kill()
            child.wait()
    assert not listens(os.getpid(), port)


def test_a_gateway_started_on_a_port_another_server_holds_moves_to_a_port_of_its_own(
    silent_vlm: str, tmp_path: Path
) -> None:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "silent", "base_url": silent_vlm, "metrics_poll_s": 0, "health_interval_s": 0}],
            "keys": [{"name": "cams", "sha256": hash_key(KEY), "traffic_class": "background"}],
        }
    )
    with stranger() as taken:
        gateway = GatewayProcess(config, tmp_path)
        gateway.port = taken  # as if the stranger had bound the port between free_port() and the gateway's bind
        with gateway:
            assert gateway.port != taken
            assert gateway.pid is not None and listens(gateway.pid, gateway.port)
            # Its own answer: the stranger answers {} to everything, the gateway's metrics are Prometheus text.
            assert "visioncap_gateway" in httpx.get(f"{gateway.root_url}/metrics", timeout=10).text


def test_serve_cli_moves_off_a_port_another_server_holds(
    monkeypatch: pytest.MonkeyPatch, silent_vlm: str, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"upstreams:\n- name: silent\n  base_url: {silent_vlm}\n  metrics_poll_s: 0\n  health_interval_s: 0\n"
        f"keys:\n- name: cams\n  sha256: {hash_key(KEY)}\n  traffic_class: background\n",
        encoding="utf-8",
    )
    with stranger() as taken:
        picks = iter([taken])
        monkeypatch.setattr(helpers, "free_port", lambda: next(picks, None) or free_port())
        with helpers.serve_cli(["gateway", "--config", str(config)], dict(os.environ)) as url:
            assert url != f"http://127.0.0.1:{taken}"
            assert "visioncap_gateway" in httpx.get(f"{url}/metrics", timeout=10).text
