"""A stand-in for vLLM for tests of the launcher and vllm_entry.py's supervisor: installed as the `vllm` package
on the server's PYTHONPATH, it serves /health on --port until killed, or exits at once with FAKE_VLLM_EXIT's code.
A fake, because a real vLLM start costs ~40 s here; the processes around it (the supervisor, the kills) are real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from visioncap.config.profiles import ModelProfile
from visioncap.serve import VllmServer, free_port

# vLLM's CLI entry as vllm_entry.py imports it: serves /health on --port until killed, or exits at once with
# FAKE_VLLM_EXIT's code.
FAKE_MAIN = """
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main():
    if "FAKE_VLLM_EXIT" in os.environ:
        print("fake vllm: failing at start", flush=True)
        return int(os.environ["FAKE_VLLM_EXIT"])
    port = int(sys.argv[sys.argv.index("--port") + 1])
    server = HTTPServer(("127.0.0.1", port), Health)
    print(f"fake vllm {os.getpid()} serving on {port}", flush=True)
    server.serve_forever()
"""


def install_fake_vllm(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`folder` holding the stand-in `vllm` package, put on the server's PYTHONPATH."""
    package = folder / "vllm" / "entrypoints" / "cli"
    package.mkdir(parents=True)
    for level in (package, package.parent, package.parent.parent):
        (level / "__init__.py").write_text("")
    (package / "main.py").write_text(FAKE_MAIN)
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return folder


def fake_server(tmp_path: Path, restarts_per_hour: int = 5) -> VllmServer:
    """A launcher for the stand-in, with its log and pid files in `tmp_path`."""
    profile = ModelProfile(name="fake", served_model_name="fake", model=str(tmp_path))
    server = VllmServer(
        profile, python=Path(sys.executable), port=free_port(), log_file=tmp_path / "vllm.log", run_dir=tmp_path / "run"
    )
    # Set after construction, so that the tests run (and fail for what they test) on a launcher without them too.
    server.restarts_per_hour = restarts_per_hour
    server.restart_backoff_s = 1.0
    return server
