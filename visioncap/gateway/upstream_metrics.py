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


def gauges_url(metrics_url: str) -> str:
    """vLLM's /metrics asking for the two load gauges only (prometheus_client's `name[]` filter)."""
    return f"{metrics_url.rstrip('/')}/?name[]={WAITING}&name[]={RUNNING}"


class UpstreamPoller:
    """Polls vLLM's /metrics and hands each reading to `on_load` (None when it failed).

    Every `interval_s` while `busy()` (the readings steer background admission), every `idle_interval_s`
    otherwise. It asks only for the two gauges (`/metrics/?name[]=...`, prometheus_client's filter, which vLLM's
    /metrics/ mount serves): the whole page is 54 KB that vLLM's API server renders on its event loop for about
    9 ms of CPU on the 2-core test machine, the two gauges about 2 ms, and a chat arriving meanwhile waits for it.
    A vLLM whose filtered page lacks the gauges (a multiprocess registry, or a metrics_url that is not vLLM's
    mount) is read whole from then on. Whether the replica is up is the health checks' business
    (`visioncap.gateway.replicas`).
    """

    def __init__(
        self,
        fetch: Callable[[str, float], Awaitable[str]],
        url: str,
        interval_s: float,
        on_load: Callable[[float, VllmLoad | None], None],
        clock: Callable[[], float] = time.monotonic,
        busy: Callable[[], bool] = lambda: True,
        idle_interval_s: float | None = None,
    ) -> None:
        self._fetch = fetch  # (url, timeout in seconds) -> the answer's text
        self.url = url  # the whole page
        self._filtered: str | None = gauges_url(url)
        self.interval_s = interval_s
        self.idle_interval_s = max(interval_s, idle_interval_s or interval_s)
        self._on_load = on_load
        self._clock = clock
        self._busy = busy
        self.last: VllmLoad | None = None
        self.last_at: float | None = None  # on `clock`, when `last` was read
        self.last_error: str | None = None

    @property
    def reads_filtered(self) -> bool:
        """Whether reads ask for the two gauges only (False once the filtered page was found to lack them)."""
        return self._filtered is not None

    async def poll_once(self) -> VllmLoad | None:
        load = None
        if self._filtered is not None:
            load = await self._read(self._filtered)
        if load is None:
            load = await self._read(self.url)
            if load is not None:  # the whole page has the gauges where the filtered one did not: keep to it
                self._filtered = None
        self.last = load
        self.last_at = self._clock()
        self._on_load(self.last_at, load)
        return load

    async def _read(self, url: str) -> VllmLoad | None:
        try:
            load = parse_vllm_load(await self._fetch(url, max(1.0, self.interval_s * 2)))
            self.last_error = None if load is not None else "no vllm:num_requests_* series"
        except UpstreamBroken as exc:
            load = None
            self.last_error = str(exc)
        return load

    def due(self, now: float) -> bool:
        """Whether a read is due: `interval_s` after the last one while busy, `idle_interval_s` after it else."""
        if self.last_at is None:
            return True
        return now - self.last_at >= (self.interval_s if self._busy() else self.idle_interval_s)

    async def run(self) -> None:
        while True:
            if self.due(self._clock()):
                try:
                    await self.poll_once()
                except Exception:  # a fault of ours must not end the polling (or fail the gateway's shutdown)
                    log.exception("reading vLLM's load failed")
                    self.last, self.last_at, self.last_error = None, self._clock(), "gateway error; see its log"
                    self._on_load(self.last_at, None)
            # Woken every interval_s whatever the state, so background work is seen as soon as before.
            await asyncio.sleep(self.interval_s)
