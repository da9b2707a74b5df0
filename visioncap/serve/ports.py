"""Loopback ports for the servers a process starts, and whether the server answering on one is the one it started.

A port picked free (bound to 0, then closed) stays free only until somebody binds it: another process that picked
the same port a moment earlier or later can bind it first. The server started on it then fails to bind and exits,
but only after its imports (seconds), and a readiness poll on the port meanwhile gets the other process's answer:
a start that trusts it talks to a stranger (seen in CI: two gateways of parallel tests on one port, one test's
uploads answered and cut off by the other test's gateway). Readiness therefore also asks the kernel who listens.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

import psutil

# What a server prints when its port is taken (uvicorn and aiohttp both report errno 98 so).
ADDRESS_IN_USE = "address already in use"


class _Connection(Protocol):
    """A socket as psutil lists it (a process's or the system's)."""

    @property
    def status(self) -> str: ...

    @property
    def laddr(self) -> Any: ...


class PortTakenError(RuntimeError):
    """The port a server was started on is held by another process."""

    def __init__(self, port: int, holders: set[int]) -> None:
        who = ", ".join(f"pid {pid}" for pid in sorted(holders)) or "a process this one cannot see"
        super().__init__(f"port {port} is held by {who}, not by the server started on it")
        self.port = port
        self.holders = holders


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody holds now; see the module's note on why that is not enough."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` or one of its descendants has a listening TCP socket on `port` (vLLM's API server may
    be a child of the process started)."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in family:
        try:
            if any(_listening_on(c, port) for c in process.net_connections(kind="tcp")):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def holders(port: int) -> set[int]:
    """Processes with a listening TCP socket on `port` (those this process may see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return set()
    return {c.pid for c in connections if c.pid is not None and _listening_on(c, port)}


def bind_refused(port: int, output: str) -> PortTakenError | None:
    """The PortTakenError for `port` when an exited server's `output` says its port was taken; None otherwise."""
    return PortTakenError(port, holders(port)) if ADDRESS_IN_USE in output else None


def check_own(pid: int, port: int) -> None:
    """Raises PortTakenError when a server answering on `port` is not process `pid` (nor its descendants)."""
    if not listens(pid, port):
        raise PortTakenError(port, holders(port) - {pid})


def _listening_on(connection: _Connection, port: int) -> bool:
    return connection.status == psutil.CONN_LISTEN and bool(connection.laddr) and connection.laddr.port == port
