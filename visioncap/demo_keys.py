"""The published demo keys, and the check that keeps them off any address other than loopback.

The example files (pipelines/gateway.example.yaml, pipelines/compose-gateway.yaml) ship keys whose text is in
this repository, so anyone can use them. A server that listens only on loopback is reachable from this machine
alone, where they are harmless (`make demo`, the tests); on any other address they are an open door. The check
runs before `visioncap gateway` and `visioncap api` bind their socket.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from visioncap.config.keys import hash_key
from visioncap.errors import ConfigError

# Every key whose text this repository publishes (in example configs, .env.example or the README), in one place:
# tests/test_safe_defaults.py fails when a shipped file names a demo key that is missing here.
PUBLISHED_DEMO_KEYS: tuple[str, ...] = ("demo-chat-key", "demo-captions-key", "demo-alerts-key")
# As the gateway and the API store them.
DEMO_KEY_HASHES: frozenset[str] = frozenset(hash_key(key) for key in PUBLISHED_DEMO_KEYS)


def is_loopback(host: str) -> bool:
    """Whether listening on `host` is reachable from this machine only: 127.0.0.0/8, ::1 or `localhost`.

    Any other name counts as reachable: what it resolves to can change, and 0.0.0.0 or :: listen everywhere.
    """
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def demo_key_names(keys: Iterable[tuple[str, str]]) -> list[str]:
    """Names of the (name, sha256) pairs whose hash is that of a published demo key."""
    return [name for name, digest in keys if digest.lower() in DEMO_KEY_HASHES]


def refuse_demo_keys(host: str, keys: Iterable[tuple[str, str]], where: str, fix: str) -> None:
    """Raise a one-line ConfigError when `host` is not loopback and a configured key is a published demo key.

    `keys` are (name, sha256) pairs, `where` says where they are configured and `fix` how to make a key of one's
    own. The line names the keys, never a secret.
    """
    if is_loopback(host):
        return
    names = demo_key_names(keys)
    if not names:
        return
    which = (
        f"key {names[0]!r} is a published demo key"
        if len(names) == 1
        else f"keys {', '.join(repr(name) for name in names)} are published demo keys"
    )
    raise ConfigError(
        f"{where}: {which}, and --host {host} is reachable from other machines; {fix}, or listen on 127.0.0.1"
    )
