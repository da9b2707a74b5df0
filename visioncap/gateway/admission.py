"""The admission controller: how much background work may run at vLLM right now.

Pure logic, no I/O and no clock of its own: the gateway feeds it measurements with their time stamps
(interactive streams' time to first token and inter-token gaps, vLLM's waiting/running counts, interactive
requests starting and ending) and asks it for decisions, so recorded sequences replay exactly in tests.

Two policies, both AIMD. The default paces (`PacingConfig`): while interactive traffic is active, background
requests start one at a time at an adaptive rate (starts per second) under the idle caps, never below a floor, and
none starts while a chat waits for its first token (bounded by `first_token_hold_s`). The rate falls by
`decrease_factor` when clearly more than 1 % of the inter-token gaps measured since the last decrease (at least
`min_fresh_gaps` of them; `evidence_z` standard errors above 1 %) exceed the objective, or when the first tokens
since the last decrease (the newest `TTFT_EVIDENCE` of them) clear 1 % above the TTFT objective by the same margin;
it grows while the objectives hold and frames wait: by `increase_factor` (when above 1) while chat's windowed p99s
are within `headroom` of their objectives (far from a miss, as TCP's slow start) and the learnt model below has
measured room for more frames (so its cap bounds the growth), else by `increase_per_s`. First
tokens come about once a second, so their evidence outlives the sliding window: a single slow first token (the host
stalls now and then whatever the load) is not evidence, and a rate that misses often is still caught within a
handful of chats. Above AIMD sits a cap learnt from measured gaps (`visioncap.gateway.miss_model`,
`pacing.learn_rate`): the host's own share of gaps above the objective, what each frame start adds, and so the
start rate that keeps the total at `pacing.target_share`; AIMD reacts to a clear miss, the cap keeps its additive
increases from winding the rate up past what the gaps allow.

The older policy (`pacing.enabled: false`) is AIMD on a background concurrency limit, with the image-token cap
scaled alongside it:

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
from enum import StrEnum

from visioncap.config.gateway import BackgroundConfig, ControllerConfig, ObjectivesConfig, PacingConfig
from visioncap.gateway.miss_model import MissEstimate, MissModel


class Action(StrEnum):
    """What one controller step did: the `action` label of the decisions metric."""

    IDLE = "idle"  # no interactive traffic is active: background gets the idle caps
    DECREASE = "decrease"  # an objective was missed: the limit (or the start rate) shrank
    INCREASE = "increase"  # the objectives held and background wanted more: the limit (or the start rate) grew
    HOLD = "hold"  # nothing to change, or a miss that cannot shrink anything now (at the floor, not settled)
    LEARNT = "learnt"  # the start rate was above what the learnt model allows and was lowered to it


class Violation(StrEnum):
    """A missed objective (`Decision.reasons`): the `reason` label of the decreases metric."""

    TTFT = "ttft"  # interactive time to first token above its p99 objective
    ITL = "itl"  # interactive inter-token gaps above their p99 objective
    UPSTREAM_WAITING = "upstream_waiting"  # vLLM reports more waiting requests than allowed
    UPSTREAM_RUNNING = "upstream_running"  # vLLM reports more running requests than allowed


# First tokens kept as the pacing policy's TTFT evidence (since the last decrease): minutes of chat at ~1/s.
TTFT_EVIDENCE = 1000


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

    def above_since(self, since: float, threshold: float) -> tuple[int, int]:
        """(samples above `threshold`, samples) among those newer than `since` (reads only the newer samples)."""
        above = count = 0
        for t, value in reversed(self._samples):
            if t <= since:
                break
            count += 1
            above += value > threshold
        return above, count


@dataclass(frozen=True)
class Caps:
    """What background may have in flight now."""

    concurrency: int
    image_tokens: int
    interactive_active: bool
    max_tokens_per_image: int | None = None  # larger background images are downscaled to this; None: as sent
    starts_per_s: float | None = None  # background starts are spread at this rate; None: not paced
    hold_until: float | None = None  # no background request starts before this time (a chat awaits its first token)
    # The floor of the start rate: a start this overdue (one interval after the last start, or after the waiting
    # request arrived) goes ahead whatever holds it, so that steady chat cannot stop captions; None: no floor.
    min_starts_per_s: float | None = None


@dataclass(frozen=True)
class Decision:
    """One controller step, for metrics, logs and tests."""

    at: float
    action: Action
    limit: float
    caps: Caps
    reasons: tuple[Violation, ...]
    ttft_p99_s: float | None
    itl_p99_s: float | None
    starts_per_s: float | None = None  # the paced start rate while interactive traffic is active; None: not pacing
    learnt: MissEstimate | None = None  # what the learnt model measured (None: off, or too little evidence yet)


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
        pacing: PacingConfig | None = None,
    ) -> None:
        """`start_limit`: the adaptive limit to begin with (default the floor; replays may restore a state).
        `pacing`: the pacing policy's settings; None or disabled: the concurrency-limit policy."""
        self.objectives = objectives
        self.background = background
        self.settings = controller
        self.pacing = pacing if pacing is not None and pacing.enabled else None
        self._rate = self.pacing.start_per_s if self.pacing is not None else None
        self.miss_model: MissModel | None = None
        if self.pacing is not None and self.pacing.learn_rate:
            self.miss_model = MissModel(
                objective_s=objectives.itl_p99_ms / 1000,
                target_share=self.pacing.target_share,
                window_s=self.pacing.model_window_s,
                spike_window_s=self.pacing.spike_window_s,
                min_frames=self.pacing.model_min_frames,
                min_gaps=self.pacing.model_min_gaps,
            )
        self._next_handle = 0
        self._awaiting_first: dict[int, float] = {}  # interactive requests without a first token: start times
        self._ttft_misses: deque[bool] = deque(maxlen=TTFT_EVIDENCE)  # since the last decrease: above objective?
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

    def interactive_started(self, now: float, streams: bool = True) -> int:
        """An interactive request begins; returns its handle for `interactive_first_token` and `_finished`.

        Only a streaming request holds background starts for its first token: a caller that waits for the whole
        answer sees no first token, and holding frames back for the whole of it bought that caller nothing.
        """
        self._active += 1
        self._last_interactive_at = now
        self._next_handle += 1
        if streams:
            self._awaiting_first[self._next_handle] = now
        return self._next_handle

    def interactive_first_token(self, handle: int) -> None:
        self._awaiting_first.pop(handle, None)

    def interactive_finished(self, now: float, handle: int | None = None) -> None:
        self._active = max(0, self._active - 1)
        self._last_interactive_at = now
        if handle is not None:
            self._awaiting_first.pop(handle, None)

    def observe_ttft(self, now: float, seconds: float) -> None:
        self.ttft.add(now, seconds)
        self._ttft_misses.append(seconds > self.objectives.ttft_p99_ms / 1000)

    def observe_itl(self, now: float, seconds: float) -> None:
        self.itl.add(now, seconds)
        if self.miss_model is not None:
            self.miss_model.observe_gap(now, seconds)

    def background_started(self, now: float) -> None:
        """A background request was sent upstream (its frame's encoder and prefill follow within steps)."""
        if self.miss_model is not None and self.interactive_active(now):
            self.miss_model.observe_start(now)

    def observe_upstream(self, now: float, waiting: float, running: float) -> None:
        self._upstream = UpstreamLoad(now, waiting, running)

    # -- decisions ------------------------------------------------------------------------------------

    @property
    def limit(self) -> float:
        """The adaptive concurrency limit (applies while interactive traffic is active)."""
        return self._limit

    @property
    def starts_per_s(self) -> float | None:
        """The paced start rate (applies while interactive traffic is active); None under the limit policy."""
        return self._rate

    @property
    def interactive_in_flight(self) -> int:
        return self._active

    @property
    def interactive_awaiting_first_token(self) -> int:
        """Interactive requests sent upstream that have not had their first token (or their answer) yet."""
        return len(self._awaiting_first)

    def interactive_active(self, now: float) -> bool:
        return self._active > 0 or now - self._last_interactive_at < self.settings.idle_after_s

    def caps(self, now: float) -> Caps:
        """The caps the scheduler applies at `now`."""
        background = self.background
        if not self.interactive_active(now):
            return Caps(background.max_concurrency, background.max_image_tokens_in_flight, interactive_active=False)
        if self.pacing is not None:
            return Caps(
                background.max_concurrency,
                background.max_image_tokens_in_flight,
                interactive_active=True,
                max_tokens_per_image=background.active_max_image_tokens,
                starts_per_s=self._rate,
                hold_until=self._hold_until(now),
                min_starts_per_s=self.pacing.min_per_s,
            )
        concurrency = int(self._limit)
        share = self._limit / background.max_concurrency
        tokens = max(1, int(background.max_image_tokens_in_flight * share))
        return Caps(
            concurrency, tokens, interactive_active=True, max_tokens_per_image=background.active_max_image_tokens
        )

    def _hold_until(self, now: float) -> float | None:
        """Until when a chat awaiting its first token holds background starts back; None: nothing holds."""
        assert self.pacing is not None
        hold = self.pacing.first_token_hold_s
        if hold <= 0 or not self._awaiting_first:
            return None
        until = max(self._awaiting_first.values()) + hold
        return until if until > now else None

    def tick(self, now: float, background_in_flight: int, background_waiting: int = 0) -> Decision:
        """One control step; call every `interval_s` with the scheduler's current counts."""
        self.ttft.prune(now)
        self.itl.prune(now)
        ttft_p99 = self.ttft.percentile(99)
        itl_p99 = self.itl.percentile(99)
        if self.pacing is not None:
            return self._pace(now, background_waiting, ttft_p99, itl_p99)
        if self._settled_since is None and background_in_flight <= int(self._limit):
            self._settled_since = now
        reasons: tuple[Violation, ...] = ()
        if not self.interactive_active(now):
            action = Action.IDLE
        else:
            reasons = self._violations(now, ttft_p99, itl_p99)
            floor = float(self.background.min_concurrency)
            ceiling = float(self.background.max_concurrency)
            if reasons and self._settled_since is not None and self._limit > floor:
                action = Action.DECREASE
                base = min(self._limit, max(float(background_in_flight), floor))
                self._limit = max(floor, base * self.settings.decrease_factor)
                self._last_decrease = now
                self._settled_since = now if background_in_flight <= int(self._limit) else None
            elif reasons:
                action = Action.HOLD  # at the floor already, or the last decrease has not taken effect yet
            elif (
                self._limit < ceiling
                and now - self._last_increase >= self.settings.increase_interval_s
                and self._healthy_since(max(self._last_tick, self._last_increase))
                and (background_in_flight >= int(self._limit) or background_waiting > 0)
            ):
                action = Action.INCREASE
                self._limit = min(ceiling, self._limit + self.settings.additive_increase)
                self._last_increase = now
            else:
                action = Action.HOLD
        self._last_tick = now
        decision = Decision(now, action, self._limit, self.caps(now), reasons, ttft_p99, itl_p99)
        self.last_decision = decision
        return decision

    def _pace(self, now: float, waiting: int, ttft_p99: float | None, itl_p99: float | None) -> Decision:
        """The pacing policy's step: AIMD on the start rate (see the module docstring)."""
        pacing = self.pacing
        assert pacing is not None and self._rate is not None
        reasons: tuple[Violation, ...] = ()
        learnt = self._learnt(now)
        if not self.interactive_active(now):
            action = Action.IDLE
        else:
            reasons = self._pace_violations(now)
            if reasons and self._rate > pacing.min_per_s:
                action = Action.DECREASE
                self._rate = max(pacing.min_per_s, self._rate * pacing.decrease_factor)
                self._last_decrease = now
                self._settled_since = now
                self._ttft_misses.clear()
            elif reasons:
                action = Action.HOLD  # at the floor: frames keep moving at the floor rate
            elif (
                self._rate < pacing.max_per_s
                and waiting > 0
                and now - self._last_increase >= self.settings.increase_interval_s
                and self._healthy_since(max(self._last_tick, self._last_increase))
            ):
                action = Action.INCREASE
                far = self._within(ttft_p99, itl_p99, pacing.headroom) and _room_measured(learnt, pacing)
                grown = self._rate * pacing.increase_factor if far else self._rate
                self._rate = min(pacing.max_per_s, max(grown, self._rate + pacing.increase_per_s))
                self._last_increase = now
            else:
                action = Action.HOLD
        if action is not Action.IDLE and learnt is not None and learnt.rate_per_s is not None:
            # The model caps AIMD from above: additive increases never wind the rate up past what it allows.
            cap = min(pacing.max_per_s, max(pacing.min_per_s, learnt.rate_per_s))
            if self._rate > cap:
                self._rate = cap
                action = Action.LEARNT if action is not Action.DECREASE else action
        self._last_tick = now
        decision = Decision(
            now,
            action,
            self._limit,
            self.caps(now),
            reasons,
            ttft_p99,
            itl_p99,
            starts_per_s=self._rate,
            learnt=learnt,
        )
        self.last_decision = decision
        return decision

    def _learnt(self, now: float) -> MissEstimate | None:
        """The learnt model's estimate at this tick (it counts the tick's interactive time first)."""
        model = self.miss_model
        if model is None:
            return None
        if self.interactive_active(now) and self._last_tick > -math.inf:
            model.observe_active(now, min(now - self._last_tick, 2 * self.settings.interval_s))
        return model.estimate(now)

    def _pace_violations(self, now: float) -> tuple[Violation, ...]:
        """Missed objectives on evidence newer than the last decrease (inter-token gaps: inside the window too)."""
        assert self.pacing is not None
        since = max(self._settled_since if self._settled_since is not None else now, now - self.objectives.window_s)
        z = self.pacing.evidence_z
        found: list[Violation] = []
        above, count = self.itl.above_since(since, self.objectives.itl_p99_ms / 1000)
        # Fewer fresh gaps than `min_fresh_gaps` cannot show a miss of a p99.
        if count >= self.pacing.min_fresh_gaps and _clearly_above_one_percent(above, count, z):
            found.append(Violation.ITL)
        # Every first token since the last decrease is fresh evidence (the window would hold only ~10 of them).
        if _clearly_above_one_percent(sum(self._ttft_misses), len(self._ttft_misses), z):
            found.append(Violation.TTFT)
        return (*found, *self._upstream_violations(now, since))

    def _violations(self, now: float, ttft_p99: float | None, itl_p99: float | None) -> tuple[Violation, ...]:
        # Only evidence newer than the point from which the last decrease took effect can ask for another.
        since = self._settled_since if self._settled_since is not None else now
        found: list[Violation] = []
        for name, p99, window, target_ms in (
            (Violation.TTFT, ttft_p99, self.ttft, self.objectives.ttft_p99_ms),
            (Violation.ITL, itl_p99, self.itl, self.objectives.itl_p99_ms),
        ):
            if _window_missed(window, p99, target_ms, since):
                found.append(name)
        return (*found, *self._upstream_violations(now, since))

    def _upstream_violations(self, now: float, since: float) -> tuple[Violation, ...]:
        """vLLM's fresh counts above their limits (only a reading newer than `since` counts)."""
        upstream = self._upstream
        if upstream is None or now - upstream.at > self.settings.upstream_stale_s or upstream.at <= since:
            return ()
        found: list[Violation] = []
        if upstream.waiting > self.settings.upstream_waiting_limit:
            found.append(Violation.UPSTREAM_WAITING)
        running_limit = self.settings.upstream_running_limit
        if running_limit is not None and upstream.running > running_limit:
            found.append(Violation.UPSTREAM_RUNNING)
        return tuple(found)

    def _healthy_since(self, since: float) -> bool:
        """Fresh interactive samples exist and every windowed percentile meets its objective."""
        if not (self.ttft.any_since(since) or self.itl.any_since(since)):
            return False
        return self._within(self.ttft.percentile(99), self.itl.percentile(99), 1.0)

    def _within(self, ttft_p99: float | None, itl_p99: float | None, fraction: float) -> bool:
        """Both windowed p99s (seconds; None: no samples) are at most `fraction` of their objectives."""
        return (ttft_p99 is None or ttft_p99 <= fraction * self.objectives.ttft_p99_ms / 1000) and (
            itl_p99 is None or itl_p99 <= fraction * self.objectives.itl_p99_ms / 1000
        )


def _room_measured(learnt: MissEstimate | None, pacing: PacingConfig) -> bool:
    """Whether the learnt model has measured room for more frames: enough evidence, and the host's own share of gaps
    above the objective below the target. Only then may an increase be multiplicative: a window of a few seconds of
    gaps looks far inside the objective while a fast-growing rate's frames have yet to show in it (bench mixed at
    a 1.25x objective, 2026-12-03 14:03: the rate overshot to 8.8/s and chat's p99 missed), whereas the learnt cap
    then bounds the growth. Without the model (`learn_rate` false) increases stay additive."""
    return learnt is not None and learnt.base_share < pacing.target_share


def _clearly_above_one_percent(above: int, count: int, z: float) -> bool:
    """More than 1 % of `count` samples are above the objective by `z` standard errors (Poisson: z x sqrt(above)).

    p99 within the objective means at most 1 % above it; on a noisy engine a true 1 % shows as 2 of 100 half of
    the time, and each false miss costs captions. With z = 2 it takes at least 5 samples above.
    """
    return above > 0 and above - z * math.sqrt(above) > 0.01 * count


def _window_missed(window: SlidingWindow, p99: float | None, target_ms: float, since: float) -> bool:
    """The window's p99 misses the target, and so does a sample newer than `since` (old evidence never counts
    twice)."""
    target = target_ms / 1000
    fresh = window.max_since(since)
    return p99 is not None and p99 > target and fresh is not None and fresh > target
