"""The launcher: the command it builds, its errors, and the server it started for the session."""

from __future__ import annotations

import shlex
from pathlib import Path

import httpx
from helpers import REPO, TINY_MODEL, run_cli

from visioncap.serve import VllmServer


def test_dry_run_prints_the_full_vllm_command() -> None:
    result = run_cli("serve", "--profile", "tiny", "--port", "8123", "--dry-run")
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.strip())
    assert argv[1].endswith("visioncap/serve/vllm_entry.py") and argv[2] == "serve"
    assert Path(argv[3]) == REPO / "models" / "build" / "tiny-qwen2vl"
    joined = " ".join(argv)
    for expected in (f"--served-model-name {TINY_MODEL}", "--port 8123", "--scheduling-policy priority"):
        assert expected in joined


def test_unknown_profile_is_a_clear_error() -> None:
    result = run_cli("serve", "--profile", "no-such-model", "--dry-run")
    assert result.returncode == 2
    assert "profile 'no-such-model' not found" in result.stderr and "tiny" in result.stderr


def test_missing_server_environment_is_a_clear_error(tmp_path: Path) -> None:
    result = run_cli("serve", "--profile", "tiny", env={"VISIONCAP_SERVER_PYTHON": str(tmp_path / "nope")})
    assert result.returncode == 1
    assert "vLLM server environment not found" in result.stderr and "make server-env" in result.stderr


def test_session_server_serves_the_tiny_model(vllm_server: VllmServer) -> None:
    models = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [TINY_MODEL]
    # The chat template of the built model turns one image part into vision tokens.
    response = httpx.post(
        f"{vllm_server.base_url}/chat/completions",
        json={
            "model": TINY_MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
