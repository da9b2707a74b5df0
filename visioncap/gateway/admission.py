"""The admission controller: how much background work may run at vLLM right now.

Pure logic, no I/O and no clock of its own: the gateway feeds it measurements with their time stamps
(interactive streams' time to first token and inter-token gaps, vLLM's waiting/running counts, interactive
requests starting and ending) and asks it for decisions, so recorded sequences replay exactly in tests.

The policy is AIMD on a background concurrency limit, with the image-token cap scaled alongside it:

- Work-conserving: with no interactive request active (none running and none ended within `idle_after_s`),
  background gets `max_concurrency` and `max_image_tokens_in_flight` whatever the adaptive limit is.
- While interactive traffic is active the limit applies. It starts at the floor (`min_concurrency`), not at
  the ceiling: a chat that arrives after a quiet spell must not find the engine full of image prefills that
  an optimistic start let in. Background images may also be capped per request (`active_max_image_tokens`;
  the gateway downscales them), which makes each one cheap enough to run beside streaming chat.
- Multiplicative decrease when an objective is missed: the interactive TTFT or inter-token p99 over the
  sliding window is above its target (and a sample newer than the last decrease is too: old evidence that a
  decrease already answered never counts twice), or vLLM reports more waiting (or running) requests than
  allowed. The limit shrinks from what is actually in flight, never below `min_concurrency`, and no second
  decrease comes until the first has taken effect (background in flight has drained to the new limit).
- Additive increase when fresh interactive samples all meet the objectives and the limit is what holds
  background back (in flight at the limit, or work waiting); an unused limit does not grow, and two increases
  are at least `increase_interval_s` apart so each is judged on latency measured with the previous in effect.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from visioncap.config.gateway import BackgroundConfig, ControllerConfig, ObjectivesConfig

Action = Literal["idle", "decrease", "increase", "hold"]


class SlidingWindow:
    """Time-stamped samples of the last `max_age_s` seconds (at most `max_samples`), with percentiles.

    The values are also kept sorted (insort on add, bisect on removal), so a percentile is one index: the
    controller asks for p99 several times a tick, and sorting a window of thousands of inter-token gaps each time
    was the gateway's largest cost after the proxying itself.
    """

    def __init__(self, max_age_s: float, max_samples: int) -> None:
        self.max_age_s = max_age_s
        self.max_samples = max_samples
        self._samples: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []

    def add(self, now: float, value: float) -> None:
        if len(self._samples) >= self.max_samples:
            self._drop_oldest()
        self._samples.append((now, value))
        bisect.insort(self._sorted, value)

    def _drop_oldest(self) -> None:
        _, value = self._samples.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]

    def prune(self, now: float) -> None:
        horizon = now - self.max_age_s
        while self._samples and self._samples[0][0] < horizon:
            self._drop_oldest()

    def __len__(self) -> int:
        return len(self._samples)

    def percentile(self, q: float) -> float | None:
        """Nearest-rank percentile (q in 0..100) of the samples held; None when empty."""
        if not self._sorted:
            return None
        rank = max(1, math.ceil(q / 100 * len(self._sorted)))
        return self._sorted[rank - 1]

    def max_since(self, since: float) -> float | None:
        """Largest sample newer than `since`; None when there is none (reads only the newer samples)."""
        largest = None
        for t, value in reversed(self._samples):
            if t <= since:
                break
            if largest is None or value > largest:
                largest = value
        return largest

    def any_since(self, since: float) -> bool:
        return bool(self._samples) and self._samples[-1][0] > since


@dataclass(frozen=True)
class Caps:
    """What background may have in flight now."""

    concurrency: int
    image_tokens: int
    interactive_active: bool
    max_tokens_per_image: int | None = None  # larger background images are downscaled to this; None: as sent


@dataclass(frozen=True)
class Decision:
    """One controller step, for metrics, logs and tests."""

    at: float
    action: Action
    limit: float
    caps: Caps
    reasons: tuple[str, ...]
    ttft_p99_s: float | None
    itl_p99_s: float | None


@dataclass(frozen=True)
class UpstreamLoad:
    """vLLM's own counts, read from its /metrics at `at`."""

    at: float
    waiting: float
    running: float


class AdmissionController:
    """Background caps from interactive latency and vLLM load; see the module docstring for the policy."""

    def __init__(
        self,
        objectives: ObjectivesConfig,
        background: BackgroundConfig,
        controller: ControllerConfig,
        start_limit: float | None = None,
    ) -> None:
        """`start_limit`: the adaptive limit to begin with (default the floor; replays may restore a state)."""
        self.objectives = objectives
        self.background = background
        self.settings = controller
        self.ttft = SlidingWindow(objectives.window_s, objectives.window_max_samples)
        self.itl = SlidingWindow(objectives.window_s, objectives.window_max_samples)
        self._limit = float(background.min_concurrency if start_limit is None else start_limit)
        self._active = 0
        self._last_interactive_at = -math.inf
        self._last_tick = -math.inf
        self._last_decrease = -math.inf
        self._last_increase = -math.inf
        # Time from which a new violation may count again: the last decrease once it has taken effect.
        self._settled_since: float | None = -math.inf
        self._upstream: UpstreamLoad | None = None
        self.last_decision: Decision | None = None

    # -- measurements ---------------------------------------------------------------------------------

    def interactive_started(self, now: float) -> None:
        self._active += 1
        self._last_interactive_at = now

    def interactive_finished(self, now: float) -> None:
        self._active = max(0, self._active - 1)
        self._last_interactive_at = now

    def observe_ttft(self, now: float, seconds: float) -> None:
        self.ttft.add(now, seconds)

    def observe_itl(self, now: float, seconds: float) -> None:
        self.itl.add(now, seconds)

    def observe_upstream(self, now: float, waiting: float, running: float) -> None:
        self._upstream = UpstreamLoad(now, waiting, running)

    # -- decisions ------------------------------------------------------------------------------------

    @property
    def limit(self) -> float:
        """The adaptive concurrency limit (applies while interactive traffic is active)."""
        return self._limit

    @property
    def interactive_in_flight(self) -> int:
        return self._active

    def interactive_active(self, now: float) -> bool:
        return self._active > 0 or now - self._last_interactive_at < self.settings.idle_after_s

    def caps(self, now: float) -> Caps:
        """The caps the scheduler applies at `now`."""
        background = self.background
        if not self.interactive_active(now):
            return Caps(background.max_concurrency, background.max_image_tokens_in_flight, interactive_active=False)
        concurrency = int(self._limit)
        share = self._limit / background.max_concurrency
        tokens = max(1, int(background.max_image_tokens_in_flight * share))
        return Caps(
            concurrency, tokens, interactive_active=True, max_tokens_per_image=background.active_max_image_tokens
        )

    def tick(self, now: float, background_in_flight: int, background_waiting: int = 0) -> Decision:
        """One control step; call every `interval_s` with the scheduler's current counts."""
        self.ttft.prune(now)
        self.itl.prune(now)
        ttft_p99 = self.ttft.percentile(99)
        itl_p99 = self.itl.percentile(99)
        if self._settled_since is None and background_in_flight <= int(self._limit):
            self._settled_since = now
        reasons: tuple[str, ...] = ()
        if not self.interactive_active(now):
            action: Action = "idle"
        else:
            reasons = self._violations(now, ttft_p99, itl_p99)
            floor = float(self.background.min_concurrency)
            ceiling = float(self.background.max_concurrency)
            if reasons and self._settled_since is not None and self._limit > floor:
                action = "decrease"
                base = min(self._limit, max(float(background_in_flight), floor))
                self._limit = max(floor, base * self.settings.decrease_factor)
                self._last_decrease = now
                self._settled_since = now if background_in_flight <= int(self._limit) else None
            elif reasons:
                action = "hold"  # at the floor already, or the last decrease has not taken effect yet
            elif (
                self._limit < ceiling
                and now - self._last_increase >= self.settings.increase_interval_s
                and self._healthy_since(max(self._last_tick, self._last_increase))
                and (background_in_flight >= int(self._limit) or background_waiting > 0)
            ):
                action = "increase"
                self._limit = min(ceiling, self._limit + self.settings.additive_increase)
                self._last_increase = now
            else:
                action = "hold"
        self._last_tick = now
        decision = Decision(now, action, self._limit, self.caps(now), reasons, ttft_p99, itl_p99)
        self.last_decision = decision
        return decision

    def _violations(self, now: float, ttft_p99: float | None, itl_p99: float | None) -> tuple[str, ...]:
        # Only evidence newer than the point from which the last decrease took effect can ask for another.
        since = self._settled_since if self._settled_since is not None else now
        found = []
        for name, p99, window, target_ms in (
            ("ttft", ttft_p99, self.ttft, self.objectives.ttft_p99_ms),
            ("itl", itl_p99, self.itl, self.objectives.itl_p99_ms),
        ):
            target = target_ms / 1000
            fresh = window.max_since(since)
            if p99 is not None and p99 > target and fresh is not None and fresh > target:
                found.append(name)
        upstream = self._upstream
        if upstream is not None and now - upstream.at <= self.settings.upstream_stale_s and upstream.at > since:
            if upstream.waiting > self.settings.upstream_waiting_limit:
                found.append("upstream_waiting")
            running_limit = self.settings.upstream_running_limit
            if running_limit is not None and upstream.running > running_limit:
                found.append("upstream_running")
        return tuple(found)

    def _healthy_since(self, since: float) -> bool:
        """Fresh interactive samples exist and every windowed percentile meets its objective."""
        if not (self.ttft.any_since(since) or self.itl.any_since(since)):
            return False
        ttft_p99 = self.ttft.percentile(99)
        itl_p99 = self.itl.percentile(99)
        return (ttft_p99 is None or ttft_p99 <= self.objectives.ttft_p99_ms / 1000) and (
            itl_p99 is None or itl_p99 <= self.objectives.itl_p99_ms / 1000
        )
