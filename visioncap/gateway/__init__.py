"""The priority gateway: an OpenAI-compatible proxy in front of vLLM that keeps interactive latency stable.

Laid out like vLLM's endpoint folders: `router` (thin routes), `protocol` (the request fields read),
`serving` (the request flow), and one module per concern: `auth`, `admission` (the controller, pure logic),
`miss_model` (the start rate the inter-token objective allows, learnt from measured gaps), `scheduler`
(background queue), `images`, `proxy`, `sse`, `metrics`, `upstream_metrics`, `replicas` (one per upstream: its
pool, controller, queue and health checks; which replica a chat goes to). `in_thread` runs a gateway in a
thread of the current process (tests, benchmarks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visioncap.gateway.app import create_app, run_gateway

__all__ = ["create_app", "run_gateway"]


def __getattr__(name: str) -> Any:
    # The web stack is imported on first use, so the pure parts (admission, images) load without it.
    if name in __all__:
        from visioncap.gateway import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
