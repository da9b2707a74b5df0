"""Reads vLLM's load (requests waiting and running) from its Prometheus /metrics, periodically."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from visioncap.gateway.proxy import UpstreamBroken

log = logging.getLogger(__name__)

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True)
class VllmLoad:
    waiting: float
    running: float


def parse_vllm_load(text: str) -> VllmLoad | None:
    """Sum of each gauge over its label sets (engines, models); None when vLLM exports neither."""
    totals = {WAITING: 0.0, RUNNING: 0.0}
    seen = False
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            try:
                totals[name] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return VllmLoad(totals[WAITING], totals[RUNNING]) if seen else None


class UpstreamPoller:
    """Polls vLLM's /metrics every `interval_s` and hands each reading to `on_load` (None when it failed)."""

    def __init__(
        self,
        fetch: Callable[[str, float], Awaitable[str]],
        url: str,
        interval_s: float,
        on_load: Callable[[float, VllmLoad | None], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch  # (url, timeout in seconds) -> the answer's text
        self.url = url
        self.interval_s = interval_s
        self._on_load = on_load
        self._clock = clock
        self.last: VllmLoad | None = None
        self.last_error: str | None = None

    async def poll_once(self) -> VllmLoad | None:
        try:
            text = await self._fetch(self.url, max(1.0, self.interval_s * 2))
            load = parse_vllm_load(text)
            self.last_error = None if load is not None else "no vllm:num_requests_* series"
        except UpstreamBroken as exc:
            load = None
            self.last_error = str(exc)
        self.last = load
        self._on_load(self._clock(), load)
        return load

    async def run(self) -> None:
        while True:
            await self.poll_once()
            await asyncio.sleep(self.interval_s)
