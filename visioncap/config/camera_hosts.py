"""Which hosts cameras may be at (VISIONCAP_CAMERA_ALLOWED_HOSTS): networks and host names.

A camera URL is a request the worker makes; without a limit, whoever may add a camera may make the worker fetch
any address it reaches (the database, a cloud metadata service, an admin page on loopback). The list is checked
when a camera is submitted and again, names resolved, each time a worker opens a network camera, since what a
name resolves to can change after it was submitted.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

SETTING = "VISIONCAP_CAMERA_ALLOWED_HOSTS"

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _label_ok(label: str) -> bool:
    return 0 < len(label) <= 63 and label.replace("-", "").replace("_", "").isalnum() and label.isascii()


def parse_entry(entry: str) -> Network | str:
    """One entry: a network (10.0.0.0/8, fd00::/8), an address (a network of one) or a host name (cam.lan, or
    *.cams.lan for every name under cams.lan), the name lowercased; ValueError saying why it is none of them."""
    text = entry.strip()
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        pass
    if "/" in text or ":" in text:
        raise ValueError(f"{entry!r} is not a network (such as 10.0.0.0/8) or an address")
    name = text.lower().rstrip(".")
    labels = name.removeprefix("*.").split(".")
    if not name or not all(_label_ok(label) for label in labels):
        raise ValueError(f"{entry!r} is not a network, an address or a host name (such as cam.lan or *.cams.lan)")
    return name


def _unmapped(address: Address) -> Address:
    # ::ffff:10.0.0.1 reaches 10.0.0.1: judged as that.
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class HostAllowList:
    """The hosts cameras may be at; empty: any."""

    networks: tuple[Network, ...] = ()
    names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, entries: Iterable[str]) -> HostAllowList:
        parsed = [parse_entry(entry) for entry in entries]
        return cls(
            networks=tuple(entry for entry in parsed if not isinstance(entry, str)),
            names=frozenset(entry for entry in parsed if isinstance(entry, str)),
        )

    def __bool__(self) -> bool:
        return bool(self.networks or self.names)

    def _holds_address(self, address: Address) -> bool:
        address = _unmapped(address)
        return any(address.version == network.version and address in network for network in self.networks)

    def _names_host(self, name: str) -> bool:
        return name in self.names or any(entry.startswith("*.") and name.endswith(entry[1:]) for entry in self.names)

    def host_problem(self, host: str) -> str | None:
        """Why the worker may not connect to `host` (a name or an address), or None. A name the list holds is
        trusted as it is; another name is resolved, and every address it resolves to must be in a network."""
        if not self:
            return None
        name = host.lower().rstrip(".")
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            address = None
        if address is not None:
            return None if self._holds_address(address) else f"host {host} is not in {SETTING}"
        if self._names_host(name):
            return None
        if not self.networks:
            return f"host {host} is not in {SETTING}"
        try:
            found = {str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
        except (OSError, UnicodeError) as exc:
            return f"host {host} is not in {SETTING} by name and cannot be resolved to check its addresses ({exc})"
        outside = sorted(
            text for text in found if not self._holds_address(ipaddress.ip_address(text.partition("%")[0]))
        )
        if outside or not found:
            return f"host {host} resolves to {', '.join(outside) or 'nothing'}, not in {SETTING}"
        return None

    def url_problem(self, url: str) -> str | None:
        """`host_problem` for the host of `url`; None for a URL without a host (its own checks refuse it)."""
        if not self:
            return None
        try:
            host = urlsplit(url).hostname
        except ValueError:
            return None
        return self.host_problem(host) if host else None
