"""No orphaned vLLM servers: SIGKILL of `visioncap serve` takes the server's whole process group with it, and a
start stops a server that an earlier run left behind on the same profile and port.

Two vLLM starts in all: a stale server (started with the lifeline left unconnected by a process that then exits),
then `visioncap serve` on the same port, which must stop it and serve; the SIGKILL test then kills that command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from helpers import REPO, TINY_MODEL, children_of, wait_for

from visioncap.serve import free_port
from visioncap.serve.launcher import group_members

pytestmark = pytest.mark.vllm

# Starts the tiny profile's server the way visioncap does, but not tied to this process, and exits without
# stopping it: a real server whose starter is gone, with its pid file left in DATA_DIR/run.
STALE_SERVER = """
import sys
from pathlib import Path
from visioncap.config.profiles import load_profile
from visioncap.serve import VllmServer
from visioncap.config.settings import Settings

settings = Settings()
profile = load_profile("tiny", settings.models_dir)
server = VllmServer(profile, python=settings.server_python, port=int(sys.argv[1]), log_file=Path(sys.argv[2]),
                    die_with_parent=False)
server.start()
server.wait_ready()
print(server.pid, flush=True)
"""


def healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def port_free(port: int) -> bool:
    """Whether a new server could listen on the port (SO_REUSEADDR, as uvicorn binds: TIME_WAIT does not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def end_group(pgid: int) -> None:
    """Teardown only: a group this module started and that is still there (the bug, or a failed test)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not group_members(pgid):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signum)
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not group_members(pgid), 30, f"process group {pgid} to end")


@dataclass
class Restart:
    """A stale server on `port`, then `visioncap serve --profile tiny --port PORT` started over it."""

    port: int
    data_dir: Path
    stale_group: int
    command: subprocess.Popen[bytes]
    log: Path
    groups: list[int]

    def ready(self) -> int:
        """Waits for the command's own "ready" line; the process group of its server."""
        wait_for(
            lambda: self.command.poll() is not None or "vLLM ready at" in self.log.read_text(),
            600,
            "serve to report ready",
        )
        assert self.command.poll() is None, self.log.read_text()[-3000:]
        (group,) = children_of(self.command.pid)  # the server leads its own process group
        if group not in self.groups:
            self.groups.append(group)
        return group


@pytest.fixture(scope="module")
def restart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restart]:
    tmp = tmp_path_factory.mktemp("orphans")
    data_dir = tmp / "data"
    env = {**os.environ, "VISIONCAP_DATA_DIR": str(data_dir)}
    port = free_port()
    groups: list[int] = []
    command: subprocess.Popen[bytes] | None = None
    try:
        made = subprocess.run(
            [sys.executable, "-c", STALE_SERVER, str(port), str(tmp / "stale.log")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=REPO,
            check=False,
        )
        assert made.returncode == 0, made.stderr[-3000:]
        stale_group = int(made.stdout.split()[-1])
        groups.append(stale_group)
        log = tmp / "serve.log"
        with log.open("wb") as stderr:
            command = subprocess.Popen(
                [sys.executable, "-m", "visioncap", "serve", "--profile", "tiny", "--port", str(port)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=REPO,
                env=env,
            )
        yield Restart(port, data_dir, stale_group, command, log, groups)
    finally:
        if command is not None and command.poll() is None:
            command.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                command.wait(timeout=120)
        # Also the groups that pid files name: a stale server whose starter failed before reporting its group.
        for pid_file in (data_dir / "run").glob("vllm-*.pid"):
            with contextlib.suppress(OSError, ValueError, KeyError):
                groups.append(int(json.loads(pid_file.read_text())["pid"]))
        for group in dict.fromkeys(groups):
            end_group(group)


# In file order: the stale server's replacement serves first, then the SIGKILL test kills it.
def test_a_start_stops_the_stale_server_on_its_profile_and_port(restart: Restart) -> None:
    stale = restart.stale_group
    assert stale not in children_of(os.getpid())  # its starter has exited: nothing here would stop it
    group = restart.ready()
    assert group != stale
    assert group_members(stale) == []
    log = restart.log.read_text()
    expected = f"stopping a stale vLLM server of profile tiny on port {restart.port} (process group {stale})"
    assert expected in log, log[-3000:]
    models = httpx.get(f"http://127.0.0.1:{restart.port}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TINY_MODEL]
    # The pid file now names the new server, for the start after this one.
    record = json.loads((restart.data_dir / "run" / f"vllm-tiny-{restart.port}.pid").read_text())
    assert record["pid"] == group and record["owner_pid"] == restart.command.pid


def test_sigkill_of_serve_takes_the_whole_server_group(restart: Restart) -> None:
    group = restart.ready()
    # The launcher's child and vLLM's engine process below it: PR_SET_PDEATHSIG alone would reach only the first.
    assert len(group_members(group)) >= 2, group_members(group)
    restart.command.send_signal(signal.SIGKILL)
    restart.command.wait(timeout=10)
    wait_for(
        lambda: not group_members(group) and port_free(restart.port),
        60,
        f"the server's process group {group} to end and port {restart.port} to be free",
    )
    assert not healthy(restart.port)
    assert f"launching process {restart.command.pid} is gone" in restart.log.read_text()
