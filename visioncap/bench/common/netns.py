"""A second host on this machine: a Linux network namespace joined to this one by a veth pair (iproute2, as root).

A process started with `Host.command(...)` has its own network stack: it reaches this machine only at
`Host.gateway_ip` (the host side of the pair), and `cut()` takes that link down, which is what a pulled cable or
a partitioned switch does to it: its packets go nowhere, its open connections hang instead of being reset, and
`join()` brings the link back. The fleet test and `bench fleet` use it to cut a worker off from PostgreSQL and the
gateway for real. Services it must reach listen on `gateway_ip` or on all addresses.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from types import TracebackType

from visioncap.errors import VisioncapError

# A private /24 per host, out of a /16 that nothing else here uses; `index` picks the /24.
SUBNET_PREFIX = "10.231"


class NetnsError(VisioncapError):
    """The namespace cannot be made here (not root, no iproute2, or the kernel refuses)."""


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {result.stderr.strip() or result.returncode}")


def netns_problem() -> str | None:
    """Why no namespace can be made here, or None when it can."""
    if shutil.which("ip") is None:
        return "`ip` (Debian's iproute2) is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    return None


def _free_index() -> int:
    found = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, timeout=30).stdout
    taken = {int(m) for m in re.findall(rf"inet {re.escape(SUBNET_PREFIX)}\.(\d+)\.", found)}
    for index in range(1, 255):
        if index not in taken:
            return index
    raise NetnsError(f"every {SUBNET_PREFIX}.X.0/24 is in use here")


class Host:
    """A namespace with one veth link to this machine; a context manager that removes both on exit."""

    def __init__(self, index: int | None = None) -> None:
        """`index` picks the /24 (1-254); None: the first one no address of this machine is in yet."""
        index = _free_index() if index is None else index
        if not 1 <= index <= 254:
            raise ValueError("index must be 1-254")
        tag = uuid.uuid4().hex[:6]
        self.name = f"vc-{tag}"
        # Interface names are at most 15 characters.
        self._outer, self._inner = f"vco{tag}", f"vci{tag}"
        self.gateway_ip = f"{SUBNET_PREFIX}.{index}.1"
        self.ip = f"{SUBNET_PREFIX}.{index}.2"
        self.subnet = f"{SUBNET_PREFIX}.{index}.0/24"
        self._made = False

    def __enter__(self) -> Host:
        problem = netns_problem()
        if problem is not None:
            raise NetnsError(problem)
        _ip("netns", "add", self.name)
        self._made = True
        try:
            _ip("link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
            _ip("link", "set", self._inner, "netns", self.name)
            _ip("addr", "add", f"{self.gateway_ip}/24", "dev", self._outer)
            _ip("-n", self.name, "addr", "add", f"{self.ip}/24", "dev", self._inner)
            _ip("-n", self.name, "link", "set", "lo", "up")
            _ip("-n", self.name, "link", "set", self._inner, "up")
            _ip("-n", self.name, "route", "add", "default", "via", self.gateway_ip)
            self.join()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace (same files, users and clock; its own network)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def cut(self) -> None:
        """Takes the link down: nothing passes either way until `join()`."""
        _ip("link", "set", self._outer, "down")

    def join(self) -> None:
        _ip("link", "set", self._outer, "up")

    def remove(self) -> None:
        if not self._made:
            return
        # Deleting the namespace deletes the inner end, and with it the pair.
        subprocess.run(["ip", "link", "del", self._outer], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        self._made = False
