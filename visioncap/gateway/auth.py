"""API keys -> callers and their traffic class; per-key request rate limits.

Keys are stored as SHA-256 hashes only; a presented key is hashed and looked up. Keys come as
`Authorization: Bearer KEY` (what the OpenAI clients send) or `X-Api-Key: KEY`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from visioncap.config.gateway import GatewayConfig, RateLimitConfig, TrafficClassConfig
from visioncap.config.keys import hash_key


class TokenBucket:
    """`rate` requests per second on average, `burst` at once; time comes from the caller."""

    def __init__(self, limit: RateLimitConfig) -> None:
        self.rate = limit.requests_per_s
        self.burst = float(limit.burst)
        self._tokens = self.burst
        self._updated: float | None = None

    def take(self, now: float) -> float | None:
        """Take one request's token: None when allowed, else seconds until one is available."""
        if self._updated is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate)
        self._updated = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return None
        return (1.0 - self._tokens) / self.rate


@dataclass
class Caller:
    """Who sent a request: the key's name, its class and its camera label."""

    name: str
    class_name: str
    traffic_class: TrafficClassConfig
    camera: str | None
    limiter: TokenBucket | None = field(default=None, repr=False)
    cameras: frozenset[str] | None = None  # the cameras its requests may name; None: any
    upstream: str | None = None  # the replica its background requests go to; None: the first

    @property
    def interactive(self) -> bool:
        return self.traffic_class.role == "interactive"

    @property
    def urgent(self) -> bool:
        """An alert class's key: its requests wait in the line served before background's."""
        return self.traffic_class.role == "alert"


class KeyRing:
    """Looks presented keys up by hash."""

    def __init__(self, config: GatewayConfig) -> None:
        self._callers: dict[str, Caller] = {}
        for key in config.keys:
            self._callers[key.sha256] = Caller(
                name=key.name,
                class_name=key.traffic_class,
                traffic_class=config.classes[key.traffic_class],
                camera=key.camera,
                limiter=TokenBucket(key.rate_limit) if key.rate_limit is not None else None,
                cameras=frozenset(key.cameras) if key.cameras is not None else None,
                upstream=key.upstream,
            )

    def identify(self, headers: Mapping[str, str]) -> Caller | None:
        """The caller of a request with these headers, or None for a missing or unknown key."""
        key = presented_key(headers)
        if not key:
            return None
        return self._callers.get(hash_key(key))


def presented_key(headers: Mapping[str, str]) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return headers.get("x-api-key") or None
