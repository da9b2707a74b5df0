"""vllm_entry.py's supervisor under the launcher, with a stand-in for vLLM: an exit while serving is logged in one
line and restarted with backoff, up to a number of restarts an hour, then the server fails clearly; an exit before
serving is not restarted. The stand-in is a fake (a 20-line HTTP server installed as the `vllm` package) because a
real vLLM start costs ~40 s here and this test needs four of them; the kills are real SIGKILLs. The same behaviour
on the real vLLM, once: test_vllm_restart.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_vllm import fake_server, install_fake_vllm
from helpers import children_of, wait_for

from visioncap.serve import VllmServer
from visioncap.serve.launcher import ServerError, group_members


@pytest.fixture
def fake_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return install_fake_vllm(tmp_path / "fake", monkeypatch)


def answers(server: VllmServer) -> bool:
    try:
        return httpx.get(f"{server.root_url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
def stopped_after() -> Iterator[list[VllmServer]]:
    servers: list[VllmServer] = []
    yield servers
    for server in servers:
        group = server.pid
        server.stop(grace_s=10)
        if group is not None:
            assert group_members(group) == []


def test_a_killed_server_is_restarted_with_backoff_then_given_up_at_the_hourly_cap(
    fake_vllm: Path, tmp_path: Path, stopped_after: list[VllmServer], capfd: pytest.CaptureFixture[str]
) -> None:
    server = fake_server(tmp_path, restarts_per_hour=2)
    stopped_after.append(server)
    server.start()
    server.wait_ready(timeout_s=60)
    supervisor = server.pid
    assert supervisor is not None
    killed: list[int] = []
    for restart in (1, 2):
        (child,) = children_of(supervisor, live=True)
        os.kill(child, signal.SIGKILL)
        killed.append(child)
        wait_for(lambda c=child: c not in children_of(supervisor, live=True), 10, f"killed child {child} to be reaped")
        # The restart waits its backoff (1 s, then 2 s): meanwhile the server is not ready, and says why.
        ready, details = server.readiness()
        assert not ready and "restarts it after an exit" in str(details["error"]), details
        wait_for(
            lambda: [c for c in children_of(supervisor, live=True) if c not in killed] and answers(server),
            30,
            f"restart {restart} to serve",
        )
        assert server.readiness()[0] and server.exit_error() is None
    lines = (tmp_path / "vllm.log").read_text()
    assert lines.count("was killed by SIGKILL; restarting it in") == 2, lines
    assert "restarting it in 1 s (restart 1 of at most 2 an hour)" in lines
    assert "restarting it in 2 s (restart 2 of at most 2 an hour)" in lines
    # The third exit within the hour is one too many: a clear failure, on the launcher's stderr too.
    (child,) = children_of(supervisor, live=True)
    os.kill(child, signal.SIGKILL)
    assert server.wait() == 1
    error = server.exit_error()
    assert error is not None and "exited with code 1" in error and "vllm.log" in error
    assert not server.readiness()[0]
    said = capfd.readouterr().err
    assert said.count("visioncap.serve.supervisor: vLLM (pid") == 3, said
    assert "2 restarts within the last hour already, the most allowed (2); giving up" in said
    assert "OSError" not in (tmp_path / "vllm.log").read_text()


def test_an_exit_before_serving_is_reported_not_restarted(
    fake_vllm: Path, tmp_path: Path, stopped_after: list[VllmServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_VLLM_EXIT", "3")
    server = fake_server(tmp_path, restarts_per_hour=5)
    stopped_after.append(server)
    server.start()
    with pytest.raises(ServerError, match=r"vLLM exited with code 3 before becoming healthy; last log lines:"):
        server.wait_ready(timeout_s=60)
    assert "restarting" not in (tmp_path / "vllm.log").read_text()
