"""The gateway's upstreams: vLLM replicas of one model, each with its own connection pool, admission
controller, background queue, load poll and health checks; and the choice of replica for a chat.

A chat goes to the replica with the best predicted time to first token (`predicted_ttft_s`); background
requests go to their key's own replica (the camera box's GPU: frames stay local) and spill to another only
while it is out. A replica is out after `down_after_failures` failed health checks in a row, or at once when it
refuses a connection, and back at the first check that passes.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from visioncap.config.gateway import GatewayConfig, UpstreamConfig
from visioncap.gateway.admission import AdmissionController, Decision
from visioncap.gateway.metrics import GatewayMetrics
from visioncap.gateway.proxy import Upstream, UpstreamBroken
from visioncap.gateway.scheduler import BackgroundScheduler
from visioncap.gateway.upstream_metrics import UpstreamPoller, VllmLoad

log = logging.getLogger(__name__)

# A running request shares every engine step with a new one (its decode), which costs the newcomer's prefill a
# fraction of a step; a waiting one takes a whole turn ahead of it. Coarse on purpose: only the order matters.
RUNNING_SHARE = 0.25
DEFAULT_TTFT_S = 0.1  # the estimate while no replica has streamed a first token yet
TTFT_SMOOTHING = 0.2  # weight of the newest first token in a replica's moving estimate


@dataclass(frozen=True)
class ReplicaLoad:
    """What the gateway knows of one replica's load when a chat arrives."""

    queued: float  # requests ahead of a new one: vLLM's waiting, at least the gateway's chats without a first token
    running: float  # requests being decoded: vLLM's running, at least the gateway's others in flight there
    ttft_s: float | None  # moving average of first tokens streamed from it; None before the first


def predicted_ttft_s(load: ReplicaLoad, prior_s: float) -> float:
    """Time to first token a new chat would see there: its recent first token (`prior_s` before any) for each
    request queued ahead plus its own, stretched by the share of every engine step the running ones take."""
    base = load.ttft_s if load.ttft_s is not None else prior_s
    return base * (1 + load.queued + RUNNING_SHARE * load.running)


def rank_for_chat(loads: Sequence[ReplicaLoad]) -> list[int]:
    """Indices of `loads`, best predicted time to first token first; ties keep the configured order.

    A replica without a measured first token is assumed as fast as the fastest measured one, so a new or
    returning replica gets chats and a measurement instead of being avoided for lack of one.
    """
    measured = [load.ttft_s for load in loads if load.ttft_s is not None]
    prior_s = min(measured) if measured else DEFAULT_TTFT_S
    return sorted(range(len(loads)), key=lambda index: predicted_ttft_s(loads[index], prior_s))


class Replica:
    """One upstream and everything the gateway keeps for it; `start()`/`aclose()` on the serving event loop."""

    def __init__(
        self, config: UpstreamConfig, gateway: GatewayConfig, metrics: GatewayMetrics, clock: Callable[[], float]
    ) -> None:
        self.name = config.name
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.stale_s = gateway.controller.upstream_stale_s
        self.background = gateway.background
        self.controller = AdmissionController(
            gateway.objectives, gateway.background, gateway.controller, pacing=gateway.pacing
        )
        self.scheduler = BackgroundScheduler(
            caps=lambda: self.controller.caps(self.clock()),
            queue_size=gateway.background.queue_size,
            clock=clock,
            on_change=partial(metrics.scheduler_changed, self.name),
        )
        self.upstream: Upstream | None = None
        self.poller: UpstreamPoller | None = None
        self.checked = config.health_interval_s > 0
        self.up = not self.checked  # until its first health check passes
        self.failures = 0  # health checks failed in a row
        self.health_error: str | None = "not checked yet" if self.checked else None
        self.since = clock()  # when `up` last changed, on `clock`
        self._watchers: list[tuple[bool, asyncio.Future[None]]] = []
        self.ttft_s: float | None = None
        self.record(self.controller.tick(clock(), 0))

    # -- lifecycle ------------------------------------------------------------------------------------

    def start(self) -> list[asyncio.Task[None]]:
        """Open the pool and start the health checks and the load poll; returns their tasks."""
        env = self.config.api_key_env
        self.upstream = Upstream(self.config, os.environ.get(env) if env else None)
        self._set_up(self.up)
        tasks: list[asyncio.Task[None]] = []
        if self.checked:
            tasks.append(asyncio.create_task(self._health_loop(), name=f"gateway-health-{self.name}"))
        if self.config.metrics_poll_s > 0:
            self.poller = UpstreamPoller(
                self.upstream.get_text,
                self.upstream.metrics_url,
                self.config.metrics_poll_s,
                self._observe_load,
                clock=self.clock,
                busy=self._background_present,
                idle_interval_s=self.config.metrics_idle_poll_s,
            )
            tasks.append(asyncio.create_task(self.poller.run(), name=f"gateway-upstream-metrics-{self.name}"))
        return tasks

    async def aclose(self) -> None:
        if self.upstream is not None:
            await self.upstream.aclose()

    # -- health ---------------------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        while True:
            try:
                await self.check_health()
            except Exception:  # a fault of ours must not end the checks
                log.exception("health check of upstream %s failed", self.name)
            await asyncio.sleep(self.config.health_interval_s)

    async def check_health(self) -> bool:
        """One GET of vLLM's /health; returns whether it passed."""
        assert self.upstream is not None
        try:
            await self.upstream.get_text(self.upstream.health_url, self.config.health_timeout_s)
        except UpstreamBroken as exc:
            self.failures += 1
            self.health_error = str(exc)
            if self.failures >= self.config.down_after_failures:
                self._set_up(False)
            return False
        self.failures = 0
        self.health_error = None
        self._set_up(True)
        return True

    def unreachable(self, error: str) -> None:
        """A forwarded request could not reach it: out at once (the next passing health check brings it back)."""
        if not self.checked:  # nothing would bring it back
            return
        self.failures = max(self.failures, self.config.down_after_failures)
        self.health_error = error
        self._set_up(False)

    def _set_up(self, up: bool) -> None:
        if up != self.up:
            if up:
                log.info("upstream %s is in", self.name)
            else:
                log.warning("upstream %s is out: %s", self.name, self.health_error)
            self.since = self.clock()
        self.up = up
        self.metrics.upstream_up.labels(self.name).set(1 if up else 0)
        for wanted, future in self._watchers:
            if wanted == up and not future.done():
                future.set_result(None)

    async def wait_until(self, up: bool, timeout: float) -> float:
        """Wait until the replica is in (`up`) or out; returns since when (on `clock`). For tests, tools."""
        if self.up != up:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (up, future)
            self._watchers.append(entry)
            try:
                await asyncio.wait_for(future, timeout)
            finally:
                self._watchers.remove(entry)
        return self.since

    # -- load -----------------------------------------------------------------------------------------

    def _background_present(self) -> bool:
        state = self.scheduler.state()
        return state.waiting + state.in_flight > 0

    def _observe_load(self, now: float, load: VllmLoad | None) -> None:
        if load is not None:
            self.metrics.upstream_waiting.labels(self.name).set(load.waiting)
            self.metrics.upstream_running.labels(self.name).set(load.running)
            self.controller.observe_upstream(now, load.waiting, load.running)

    def observe_ttft(self, seconds: float) -> None:
        """A first token streamed from this replica, for the chat predictor."""
        previous = self.ttft_s
        self.ttft_s = seconds if previous is None else previous + TTFT_SMOOTHING * (seconds - previous)

    def load(self, now: float) -> ReplicaLoad:
        """The predictor's view: the gateway's own counts (current), raised to vLLM's polled ones (which also
        see traffic that bypasses the gateway) while those are fresh."""
        queued = float(self.controller.interactive_awaiting_first_token)
        running = float(self.controller.interactive_in_flight + self.scheduler.state().in_flight) - queued
        polled = self.poller.last if self.poller is not None else None
        read_at = self.poller.last_at if self.poller is not None else None
        if polled is not None and read_at is not None and now - read_at <= self.stale_s:
            queued = max(queued, polled.waiting)
            running = max(running, polled.running)
        return ReplicaLoad(queued, max(0.0, running), self.ttft_s)

    # -- control --------------------------------------------------------------------------------------

    def control_step(self) -> Decision:
        """One controller decision with the scheduler's counts, then admit what the new caps allow."""
        state = self.scheduler.state()
        decision = self.controller.tick(self.clock(), state.in_flight, state.waiting)
        self.record(decision)
        self.preempt()
        self.scheduler.dispatch()
        return decision

    def preempt(self) -> None:
        """Cancel the background requests over the caps that started recently (`background.preempt`)."""
        if self.background.preempt:
            asked = self.scheduler.preempt_excess(self.background.preempt_window_s)
            if asked:
                self.metrics.preemptions.labels(self.name).inc(asked)

    def record(self, decision: Decision) -> None:
        self.metrics.decision(self.name, decision)
        if decision.action == "decrease":
            log.debug(
                "upstream %s: background limit -> %.2f (%s; ttft p99 %s, itl p99 %s)",
                self.name,
                decision.limit,
                ",".join(decision.reasons),
                _ms(decision.ttft_p99_s),
                _ms(decision.itl_p99_s),
            )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"
