"""A real vLLM under `run --serve`'s supervisor: kill -9 of its API server is logged in one line, /readyz of the
pipeline says vLLM is away meanwhile, and the server comes back and answers (the hourly cap and the clear failure
after it: test_vllm_supervisor.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
from helpers import TINY_MODEL, children_of, pipeline_dict, wait_for

from visioncap.config.pipeline import PipelineConfig
from visioncap.config.settings import Settings
from visioncap.pipeline.compose import build_pipeline
from visioncap.serve import free_port
from visioncap.serve.launcher import group_members

pytestmark = pytest.mark.vllm

RESTART_S = 300  # a bound on a vLLM that never comes back, never a measurement


def readyz(port: int) -> tuple[int, dict[str, object]]:
    response = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10)
    return response.status_code, response.json()


def test_a_killed_vllm_api_server_is_restarted_and_readyz_says_so_meanwhile(
    tmp_path: Path, demo_video: tuple[Path, object], capfd: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "data"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'c.db'}", data_dir=data_dir)
    config = PipelineConfig.model_validate(pipeline_dict(demo_video[0]))
    port = free_port()
    with build_pipeline(config, settings, serve="tiny", metrics_port=port):
        status, ready = readyz(port)
        assert status == 200 and ready["vllm"]["ok"], ready  # type: ignore[index]
        (pid_file,) = (data_dir / "run").glob("vllm-tiny-*.pid")
        supervisor = int(json.loads(pid_file.read_text())["pid"])
        base_url = str(ready["vllm"]["url"])  # type: ignore[index]
        (api_server,) = children_of(supervisor, live=True)
        os.kill(api_server, signal.SIGKILL)
        wait_for(lambda: api_server not in children_of(supervisor, live=True), 30, "the killed API server to be reaped")
        # vLLM takes tens of seconds to start again: /readyz says it is away meanwhile.
        status, ready = readyz(port)
        assert status == 503, ready
        vllm = ready["vllm"]
        assert not vllm["ok"] and "its supervisor restarts it after an exit" in vllm["error"], vllm  # type: ignore[index]
        wait_for(lambda: readyz(port)[0] == 200, RESTART_S, lambda: f"vLLM to come back: {readyz(port)}")
        (restarted,) = children_of(supervisor, live=True)
        assert restarted != api_server
        body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
        answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
    assert group_members(supervisor) == []
    (log_file,) = (data_dir / "logs").glob("vllm-tiny-*.log")
    log = log_file.read_text()
    assert log.count(f"vLLM (pid {api_server}) was killed by SIGKILL; restarting it in 2 s") == 1, log[-3000:]
    assert "Errno 22" not in log  # the supervisor no longer dies re-raising a SIGKILL it cannot handle
    # The pipeline's own log (this process's stderr) says it too, in one line.
    said = capfd.readouterr().err
    assert f"WARNING visioncap.serve.supervisor: vLLM (pid {api_server}) was killed by SIGKILL" in said
