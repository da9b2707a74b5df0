"""The gateway's admission controller and background scheduler, driven by recorded sequences (no clock, no I/O).

Times are plain numbers handed to the controller; the scheduler runs on an event loop, but every step waits
on its state, never on time.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Iterable

import pytest

from visioncap.config.gateway import BackgroundConfig, ControllerConfig, ObjectivesConfig, PacingConfig
from visioncap.gateway.admission import AdmissionController, Caps, Decision
from visioncap.gateway.scheduler import BackgroundScheduler, DeadlineExceededError, Grant, QueueFullError

OBJECTIVES = ObjectivesConfig(ttft_p99_ms=100, itl_p99_ms=20, window_s=10)
BACKGROUND = BackgroundConfig(max_concurrency=8, min_concurrency=1, max_image_tokens_in_flight=4000)
CONTROLLER = ControllerConfig(
    additive_increase=1, decrease_factor=0.5, idle_after_s=1.0, increase_interval_s=0, upstream_waiting_limit=0
)


def controller(**background: int) -> AdmissionController:
    """A controller whose limit starts at the ceiling, the state these recorded sequences begin from."""
    config = BACKGROUND.model_copy(update=background)
    return AdmissionController(OBJECTIVES, config, CONTROLLER, start_limit=config.max_concurrency)


FULL = -1  # a tick's in-flight count: background uses everything the limit allows


def replay(ctl: AdmissionController, events: Iterable[tuple[float, str, float]]) -> list[Decision]:
    """Feed (time, kind, value) events; `tick` events decide with `value` background requests in flight."""
    decisions = []
    for t, kind, value in events:
        if kind == "start":
            ctl.interactive_started(t)
        elif kind == "end":
            ctl.interactive_finished(t)
        elif kind == "ttft":
            ctl.observe_ttft(t, value / 1000)
        elif kind == "itl":
            ctl.observe_itl(t, value / 1000)
        elif kind == "waiting":
            ctl.observe_upstream(t, waiting=value, running=1)
        elif kind == "bg":
            ctl.background_started(t)
        elif kind == "tick":
            in_flight = int(ctl.limit) if value == FULL else int(value)
            decisions.append(ctl.tick(t, in_flight, background_waiting=1 if value == FULL else 0))
        else:
            raise AssertionError(kind)
    return decisions


def itl_stream(start: float, end: float, gap_ms: float, step: float = 0.01) -> list[tuple[float, str, float]]:
    count = round((end - start) / step)
    return [(start + i * step, "itl", gap_ms) for i in range(count)]


def ticks(start: float, end: float, in_flight: int, every: float = 0.25) -> list[tuple[float, str, float]]:
    count = round((end - start) / every)
    return [(start + i * every, "tick", in_flight) for i in range(count)]


def merged(*parts: list[tuple[float, str, float]]) -> list[tuple[float, str, float]]:
    # Stable on time: at equal times measurements come before the tick that reads them.
    return sorted((event for part in parts for event in part), key=lambda e: (e[0], e[1] == "tick"))


# -- work conservation and caps ---------------------------------------------------------------------------


def test_no_interactive_traffic_means_full_configured_caps() -> None:
    ctl = controller()
    decisions = replay(ctl, ticks(0, 5, in_flight=8))
    assert {d.action for d in decisions} == {"idle"}
    assert ctl.caps(5.0) == Caps(concurrency=8, image_tokens=4000, interactive_active=False)


def test_caps_return_to_full_after_interactive_goes_idle_and_limit_is_remembered() -> None:
    ctl = controller()
    events = [(0.0, "start", 0), *itl_stream(0.0, 1.0, gap_ms=80), (1.0, "tick", 8)]
    [decision] = replay(ctl, events)
    assert decision.action == "decrease" and ctl.limit == 4
    assert ctl.caps(1.0) == Caps(4, 2000, True)
    ctl.interactive_finished(2.0)
    assert ctl.caps(2.5).interactive_active  # within idle_after_s of the last interactive request
    assert ctl.caps(3.0) == Caps(8, 4000, False)  # work-conserving once idle
    ctl.interactive_started(10.0)
    assert ctl.caps(10.0) == Caps(4, 2000, True)  # back to the learned limit at once


# -- multiplicative decrease -----------------------------------------------------------------------------


def test_bad_inter_token_latency_halves_the_limit_once_per_effect() -> None:
    ctl = controller()
    events = merged(
        [(0.0, "start", 0)],
        itl_stream(0.0, 0.5, gap_ms=5),
        itl_stream(0.5, 3.0, gap_ms=60),  # background floods the engine: every gap over the 20 ms target
    )
    # First decision with 8 in flight; they drain slowly (still 8, then 6, then 4 in flight).
    replay(ctl, [e for e in events if e[0] < 1.0])
    d1 = ctl.tick(1.0, 8)
    assert (d1.action, d1.limit, d1.reasons) == ("decrease", 4, ("itl",))
    replay(ctl, [e for e in events if 1.0 <= e[0] < 1.5])
    d2 = ctl.tick(1.5, 6)
    assert (d2.action, d2.limit) == ("hold", 4)  # the decrease has not taken effect: no second cut
    d3 = ctl.tick(1.75, 4)
    assert (d3.action, d3.limit) == ("hold", 4)  # took effect now; no violation newer than that yet
    replay(ctl, [e for e in events if 1.75 <= e[0] < 2.0])
    d4 = ctl.tick(2.0, 4)
    assert (d4.action, d4.limit) == ("decrease", 2)  # still bad with 4: cut again
    assert ctl.caps(2.0) == Caps(2, 1000, True)


def test_bad_ttft_decreases_and_the_floor_holds() -> None:
    ctl = controller(min_concurrency=2)
    events = [(0.0, "start", 0)]
    t = 0.0
    for _ in range(10):  # every interactive request waits 400 ms for its first token
        t += 0.5
        events += [(t, "ttft", 400), (t + 0.01, "tick", FULL)]
    decisions = replay(ctl, events)
    limits = [d.limit for d in decisions if d.action == "decrease"]
    assert limits[:2] == [4, 2]  # 8 -> 4 -> 2 = floor; then it stays there
    assert ctl.limit == 2
    assert all(d.reasons == ("ttft",) for d in decisions if d.action == "decrease")


def test_decrease_starts_from_what_is_in_flight_not_from_an_unused_limit() -> None:
    ctl = controller()
    events = [(0.0, "start", 0), *itl_stream(0.0, 1.0, gap_ms=50)]
    replay(ctl, events)
    decision = ctl.tick(1.0, background_in_flight=2)
    assert decision.limit == 1  # min(8, 2) * 0.5 = 1, not 8 * 0.5 = 4


def test_an_old_outlier_is_answered_by_one_decrease_only() -> None:
    ctl = controller()
    events = merged(
        [(0.0, "start", 0), (0.5, "ttft", 900)],  # one slow first token
        [(0.6 + i * 0.5, "ttft", 30) for i in range(30)],  # then all fine
        ticks(1.0, 16.0, in_flight=FULL),
    )
    decisions = replay(ctl, events)
    assert [d.action for d in decisions].count("decrease") == 1
    # While the outlier is inside the 10 s window, p99 misses the target: no increase either.
    assert all(d.action == "hold" for d in decisions if 1.0 < d.at <= 10.5)
    # Once it has aged out, healthy fresh samples grow the limit again.
    assert any(d.action == "increase" for d in decisions if d.at > 10.5)


def test_vllm_waiting_queue_counts_as_overload_only_when_fresh_and_interactive_active() -> None:
    ctl = controller()
    ctl.observe_upstream(0.0, waiting=5, running=8)
    assert ctl.tick(0.1, 8).action == "idle"  # no interactive traffic: vLLM's queue is background's business
    ctl.interactive_started(1.0)
    ctl.observe_upstream(1.0, waiting=3, running=8)
    decision = ctl.tick(1.1, 8)
    assert (decision.action, decision.reasons, decision.limit) == ("decrease", ("upstream_waiting",), 4)
    assert ctl.tick(1.3, 4).action == "hold"  # the same reading never counts twice
    assert ctl.tick(20.0, 4).action == "hold"  # nor a stale one
    ctl.observe_upstream(20.1, waiting=0, running=4)
    assert ctl.tick(20.2, 4).reasons == ()


# -- additive increase -----------------------------------------------------------------------------------


def test_healthy_latency_grows_the_limit_additively_up_to_the_ceiling() -> None:
    ctl = controller()
    replay(ctl, [(0.0, "start", 0), *itl_stream(0.0, 1.0, gap_ms=60), (1.0, "tick", 4)])
    assert ctl.limit == 2
    # Background's pressure is gone (gaps 5 ms); the bad gaps must age out of the 10 s window first.
    decisions = replay(ctl, merged(itl_stream(1.0, 30.0, gap_ms=5), ticks(1.25, 30.0, in_flight=FULL)))
    grown = [d for d in decisions if d.action == "increase"]
    assert [d.limit for d in grown] == [3, 4, 5, 6, 7, 8]  # +1 per healthy decision, never above the ceiling
    assert all(d.at > 10.5 for d in grown)  # only once (nearly all) bad samples left the 10 s window
    assert [d.at for d in grown] == [grown[0].at + 0.25 * i for i in range(6)]  # one step per decision


def test_an_unused_limit_does_not_grow() -> None:
    ctl = controller()
    replay(ctl, [(0.0, "start", 0), *itl_stream(0.0, 1.0, gap_ms=60), (1.0, "tick", 8)])
    assert ctl.limit == 4
    events = merged(itl_stream(11.0, 14.0, gap_ms=5), ticks(11.25, 14.0, in_flight=1))
    decisions = replay(ctl, events)
    assert {d.action for d in decisions} == {"hold"}  # 1 in flight under a limit of 4: no demand
    assert ctl.tick(14.0, 1, background_waiting=3).action == "increase"  # work waits: grow


def test_no_fresh_samples_means_no_increase() -> None:
    ctl = controller()
    replay(ctl, [(0.0, "start", 0), *itl_stream(0.0, 1.0, gap_ms=60), (1.0, "tick", 8)])
    # The interactive request is in a long prefill: no samples at all, healthy or not.
    decisions = replay(ctl, ticks(12.0, 14.0, in_flight=4))
    assert {d.action for d in decisions} == {"hold"}


def test_recorded_burst_sequence_gives_the_same_trajectory_every_time() -> None:
    # A chat session (gaps ~5 ms) hit by a caption burst from t=2 to t=4 (gaps 35-70 ms), then calm again.
    def recording() -> list[tuple[float, str, float]]:
        calm = [(t / 100, "itl", 4 + (t % 3)) for t in range(0, 200)]
        burst = [(t / 100, "itl", 35 + (t * 7) % 36) for t in range(200, 400)]
        after = [(t / 100, "itl", 4 + (t % 3)) for t in range(400, 2000)]
        return merged([(0.0, "start", 0), (0.0, "ttft", 40)], calm, burst, after)

    def run() -> list[tuple[str, float]]:
        ctl = controller()
        decisions = replay(ctl, merged(recording(), ticks(0.25, 20.0, in_flight=FULL)))
        return [(d.action, d.limit) for d in decisions]

    first, second = run(), run()
    assert first == second
    limits = [limit for _, limit in first]
    assert min(limits) == 1 and limits[-1] == 8  # cut to the floor in the burst, back at the ceiling after
    assert [action for action, _ in first].count("decrease") == 3  # 8 -> 4 -> 2 -> 1


# -- scheduler ---------------------------------------------------------------------------------------------


class FixedCaps:
    def __init__(self, concurrency: int, image_tokens: int = 10_000) -> None:
        self.caps = Caps(concurrency, image_tokens, True)

    def __call__(self) -> Caps:
        return self.caps


async def _waiting(scheduler: BackgroundScheduler, count: int) -> None:
    await scheduler.wait_until(lambda s: s.waiting == count, timeout=10)


class FakeClock:
    """The scheduler's clock, moved by the test: what is due is decided by it, never by how fast this host runs."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _admitted(tasks: list[asyncio.Task[Grant]], count: int) -> None:
    async with asyncio.timeout(10):
        while sum(task.done() for task in tasks) < count:
            await asyncio.sleep(0)


def test_round_robin_across_cameras_oldest_first_within_one() -> None:
    async def scenario() -> list[str]:
        scheduler = BackgroundScheduler(FixedCaps(1), queue_size=10)
        holder = await scheduler.acquire("x", 0, deadline_s=10)
        order: list[str] = []

        async def request(camera: str, name: str) -> None:
            grant = await scheduler.acquire(camera, 0, deadline_s=10)
            order.append(name)
            grant.release()

        tasks = []
        for camera, name in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("c", "c1")]:
            tasks.append(asyncio.create_task(request(camera, name)))
            await _waiting(scheduler, len(tasks))
        holder.release()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(scenario()) == ["a1", "b1", "c1", "a2", "a3"]


def test_waits_while_the_cap_is_reached_and_proceeds_after() -> None:
    async def scenario() -> None:
        caps = FixedCaps(1)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        first = await scheduler.acquire("a", 0, deadline_s=10)
        second = asyncio.create_task(scheduler.acquire("b", 0, deadline_s=10))
        await _waiting(scheduler, 1)
        assert not second.done()
        first.release()
        grant = await asyncio.wait_for(second, 10)
        assert scheduler.state().in_flight == 1
        grant.release()
        grant.release()  # idempotent
        assert scheduler.state().in_flight == 0

    asyncio.run(scenario())


def test_a_raised_cap_admits_waiting_requests_on_dispatch() -> None:
    async def scenario() -> None:
        caps = FixedCaps(1)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        held = await scheduler.acquire("a", 0, deadline_s=10)
        waiting = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10)) for c in "bc"]
        await _waiting(scheduler, 2)
        caps.caps = Caps(3, 10_000, False)  # interactive went idle: full concurrency
        scheduler.dispatch()
        grants: list[Grant] = [await asyncio.wait_for(t, 10) for t in waiting]
        assert scheduler.state().in_flight == 3
        for grant in [held, *grants]:
            grant.release()

    asyncio.run(scenario())


def test_image_token_cap_holds_back_a_request_that_does_not_fit() -> None:
    async def scenario() -> None:
        scheduler = BackgroundScheduler(FixedCaps(4, image_tokens=1000), queue_size=10)
        first = await scheduler.acquire("a", 600, deadline_s=10)
        blocked = asyncio.create_task(scheduler.acquire("b", 600, deadline_s=10))  # 1200 > 1000
        await _waiting(scheduler, 1)
        assert scheduler.state().image_tokens_in_flight == 600
        first.release()
        second = await asyncio.wait_for(blocked, 10)
        assert scheduler.state().image_tokens_in_flight == 600
        second.release()
        alone = await scheduler.acquire("c", 5000, deadline_s=10)  # larger than the cap: runs, but alone
        assert scheduler.state().in_flight == 1
        alone.release()

    asyncio.run(scenario())


def test_full_queue_refuses_at_once_with_a_retry_hint() -> None:
    async def scenario() -> None:
        scheduler = BackgroundScheduler(FixedCaps(1), queue_size=1)
        held = await scheduler.acquire("a", 0, deadline_s=10)
        queued = asyncio.create_task(scheduler.acquire("a", 0, deadline_s=10))
        await _waiting(scheduler, 1)
        with pytest.raises(QueueFullError) as refused:
            await scheduler.acquire("b", 0, deadline_s=10)
        assert refused.value.retry_after_s >= 1
        held.release()
        (await asyncio.wait_for(queued, 10)).release()

    asyncio.run(scenario())


def test_deadline_passes_while_waiting_and_the_place_is_given_up() -> None:
    async def scenario() -> None:
        scheduler = BackgroundScheduler(FixedCaps(1), queue_size=5)
        held = await scheduler.acquire("a", 0, deadline_s=10)
        with pytest.raises(DeadlineExceededError):
            await scheduler.acquire("b", 0, deadline_s=0.05)  # nothing releases `held` meanwhile
        assert scheduler.state().waiting == 0
        held.release()
        assert scheduler.state().in_flight == 0

    asyncio.run(scenario())


def test_a_cancelled_waiter_leaves_the_queue() -> None:
    async def scenario() -> None:
        scheduler = BackgroundScheduler(FixedCaps(1), queue_size=5)
        held = await scheduler.acquire("a", 0, deadline_s=10)
        waiter = asyncio.create_task(scheduler.acquire("b", 0, deadline_s=10))
        await _waiting(scheduler, 1)
        waiter.cancel()
        await _waiting(scheduler, 0)
        held.release()
        assert scheduler.state().in_flight == 0

    asyncio.run(scenario())


# -- start, pacing and per-image caps ------------------------------------------------------------------------


def test_a_fresh_controller_starts_interactive_periods_at_the_floor() -> None:
    ctl = AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER)
    assert ctl.caps(0.0) == Caps(8, 4000, False)  # idle: full caps whatever the limit
    ctl.interactive_started(1.0)
    assert ctl.caps(1.0).concurrency == 1  # not 8: a chat after a quiet spell must not meet 8 image prefills


def test_increases_are_paced_by_increase_interval() -> None:
    paced = CONTROLLER.model_copy(update={"increase_interval_s": 1.0})
    ctl = AdmissionController(OBJECTIVES, BACKGROUND, paced)
    decisions = replay(ctl, merged([(0.0, "start", 0)], itl_stream(0.0, 5.0, gap_ms=5), ticks(0.25, 5.0, FULL)))
    grown = [d.at for d in decisions if d.action == "increase"]
    assert grown == [0.25, 1.25, 2.25, 3.25, 4.25]  # one per second, though every tick was healthy
    assert ctl.limit == 6


def test_per_image_cap_applies_only_while_interactive_is_active() -> None:
    background = BACKGROUND.model_copy(update={"active_max_image_tokens": 64})
    ctl = AdmissionController(OBJECTIVES, background, CONTROLLER, start_limit=4)
    assert ctl.caps(0.0).max_tokens_per_image is None
    ctl.interactive_started(1.0)
    assert ctl.caps(1.0) == Caps(4, 2000, True, max_tokens_per_image=64)


def test_scheduler_counts_downscaled_tokens_and_tells_the_grant() -> None:
    async def scenario() -> None:
        caps = FixedCaps(4, image_tokens=200)
        caps.caps = Caps(4, 200, True, max_tokens_per_image=64)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        grants = [await scheduler.acquire(c, 391, deadline_s=10) for c in "abc"]  # 3 x 64 fit under 200
        assert [g.tokens for g in grants] == [64, 64, 64]
        assert all(g.max_tokens_per_image == 64 for g in grants)
        assert scheduler.state().image_tokens_in_flight == 192
        for grant in grants:
            grant.release()

    asyncio.run(scenario())


def test_under_pacing_a_chat_after_idle_preempts_the_unpaced_burst_and_keeps_paced_starts() -> None:
    """Pacing keeps the concurrency cap, so excess over it never shows; what a chat arriving after idle meets is
    the burst admitted unpaced just before it. Those fresh grants give way; ones the pacer started beside chat
    (and any older than the window, probably decoding) stay."""

    async def scenario() -> None:
        clock = FakeClock(0.0)
        caps = FixedCaps(8)  # idle: full caps, unpaced
        scheduler = BackgroundScheduler(caps, queue_size=10, clock=clock)
        asked: list[str] = []

        async def admit(camera: str, at: float) -> Grant:
            clock.now = at
            grant = await scheduler.acquire(camera, 0, deadline_s=10)
            grant.preempt = lambda: asked.append(camera)
            return grant

        old = await admit("old", 0.0)  # unpaced, but long enough ago to be decoding
        burst = [await admit(camera, 9.5) for camera in "abc"]
        caps.caps = Caps(8, 10_000, True, starts_per_s=1000.0)  # a chat arrived: paced from now on
        paced = await admit("paced", 9.6)
        clock.now = 10.0
        assert scheduler.preempt_excess(max_age_s=1.5) == 3
        assert sorted(asked) == ["a", "b", "c"] and not paced.preempted and not old.preempted
        assert scheduler.preempt_excess(max_age_s=1.5) == 0  # asked once; they give way on release
        for grant in [old, *burst, paced]:
            grant.release()

    asyncio.run(scenario())


def test_preemption_asks_the_newest_fresh_grants_beyond_the_cap() -> None:
    async def scenario() -> None:
        now = [0.0]
        caps = FixedCaps(4)
        scheduler = BackgroundScheduler(caps, queue_size=10, clock=lambda: now[0])
        asked: list[str] = []
        grants = []
        for i, camera in enumerate("abcd"):
            now[0] = float(i)
            grant = await scheduler.acquire(camera, 0, deadline_s=10)
            grant.preempt = lambda camera=camera: asked.append(camera)
            grants.append(grant)
        grants[3].preempt = None  # a request whose answer is already arriving: not preemptible
        now[0] = 3.5
        assert scheduler.preempt_excess(max_age_s=10) == 0  # nothing beyond the cap
        caps.caps = Caps(1, 10_000, True)
        assert scheduler.preempt_excess(max_age_s=2.0) == 1  # c (admitted at 2) qualifies; b (at 1) is too old
        assert asked == ["c"] and grants[2].preempted
        assert scheduler.preempt_excess(max_age_s=2.0) == 0  # c was asked already; it gives way on release
        grants[2].release()
        # Queued again at the head of the line, with its first enqueue time kept.
        again = asyncio.create_task(scheduler.acquire("c", 0, deadline_s=10, requeue_of=grants[2]))
        other = asyncio.create_task(scheduler.acquire("e", 0, deadline_s=10))
        await _waiting(scheduler, 2)
        for grant in (grants[0], grants[1], grants[3]):
            grant.release()
        first = await asyncio.wait_for(again, 10)
        assert first.enqueued_at == grants[2].enqueued_at and not other.done()
        first.release()
        (await asyncio.wait_for(other, 10)).release()

    asyncio.run(scenario())


# -- the pacing policy ----------------------------------------------------------------------------------------

PACING = PacingConfig(start_per_s=2.0, min_per_s=0.5, max_per_s=3.0, increase_per_s=0.5, decrease_factor=0.5)


def pacer(**pacing: float) -> AdmissionController:
    return AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER, pacing=PACING.model_copy(update=pacing))


def test_pacing_spreads_starts_only_while_interactive_is_active() -> None:
    ctl = pacer(first_token_hold_s=0)
    assert ctl.caps(0.0) == Caps(8, 4000, False)  # idle: full caps, not paced
    ctl.interactive_started(1.0)
    # Active: the idle caps (a frame's decode beside chat is cheap), but starts spread at the rate.
    assert ctl.caps(1.0) == Caps(8, 4000, True, starts_per_s=2.0, min_starts_per_s=0.5)


def test_pacing_slows_when_over_one_percent_of_fresh_gaps_miss_and_waits_for_new_evidence() -> None:
    ctl = pacer(min_fresh_gaps=100, evidence_z=0)  # any count above 1 % is a miss
    # 1 s of gaps every 10 ms, 2 of them (2 %) above the 20 ms objective.
    gaps = [(i / 100, "itl", 50.0 if i in (30, 60) else 5.0) for i in range(100)]
    events = merged([(0.0, "start", 0)], gaps, [(1.0, "tick", 0)])
    decisions = replay(ctl, events)
    assert decisions[-1].action == "decrease" and ctl.starts_per_s == 1.0 and decisions[-1].reasons == ("itl",)
    # The same window still holds those misses, but no new gaps have come: no second decrease.
    assert replay(ctl, [(1.25, "tick", 0)])[-1].action == "hold"
    # 100 new gaps with one miss (1 %: within p99) do not count either.
    fresh = [(1.3 + i / 100, "itl", 50.0 if i == 10 else 5.0) for i in range(100)]
    assert replay(ctl, [*fresh, (2.5, "tick", 0)])[-1].action == "hold"
    assert ctl.starts_per_s == 1.0


def test_a_miss_must_clear_one_percent_by_the_evidence_margin() -> None:
    def decide(misses: int) -> str:
        ctl = pacer(min_fresh_gaps=100, evidence_z=2.0)
        gaps = [(i / 100, "itl", 50.0 if i % (100 // misses) == 0 else 5.0) for i in range(100)]
        return replay(ctl, merged([(0.0, "start", 0)], gaps, [(1.0, "tick", 0)]))[-1].action

    # 2 of 100 is what a true 1 % shows half of the time; 8 of 100 clears 1 % by 2 x sqrt(8) = 5.7.
    assert [decide(2), decide(4), decide(10)] == ["hold", "hold", "decrease"]


def test_first_tokens_need_the_same_evidence_and_keep_it_beyond_the_window() -> None:
    """One slow first token (a host stall) is not evidence; several are, even spread over more than the 10 s
    window; a decrease answers them once."""
    ctl = pacer(evidence_z=2.0)
    # One chat a second; the 3rd is slow: one miss in 20 is within what a p99 allows at this sample size.
    chats = [(0.0, "start", 0)] + [(t + 0.5, "ttft", 400.0 if t == 3 else 30.0) for t in range(20)]
    decisions = replay(ctl, merged(chats, ticks(0.25, 20.0, in_flight=1)))
    assert "decrease" not in {d.action for d in decisions} and ctl.starts_per_s == 2.0
    # Then slow ones 4 s apart. The 4th (at 32.5 s) makes 5 with the one at 3.5 s, 29 s earlier and long out of
    # the window: 5 of 33 clears 1 % by 2 x sqrt(5); 4 of 29 did not.
    slow = [(20.0 + t + 0.5, "ttft", 400.0 if t % 4 == 0 else 30.0) for t in range(20)]
    decisions = replay(ctl, merged(slow, ticks(20.25, 40.0, in_flight=1)))
    first = next(d for d in decisions if d.action == "decrease")
    assert first.reasons == ("ttft",) and first.at == 32.5 and ctl.starts_per_s == 1.0
    assert [d.action for d in decisions].count("decrease") == 1  # the same misses never count twice


def test_pacing_never_goes_below_its_floor() -> None:
    ctl = pacer(min_fresh_gaps=10)
    events = [(0.0, "start", 0)]
    for second in range(6):
        events += [(second + i / 100, "itl", 80.0) for i in range(20)] + [(second + 0.5, "tick", 0)]
    actions = [d.action for d in replay(ctl, events)]
    assert actions == ["decrease", "decrease", "hold", "hold", "hold", "hold"]  # 2 -> 1 -> 0.5, the floor
    assert ctl.starts_per_s == 0.5
    assert ctl.caps(6.0).starts_per_s == 0.5  # background still starts, every 2 s


def test_pacing_grows_while_healthy_only_when_frames_wait() -> None:
    ctl = pacer()
    healthy = merged([(0.0, "start", 0)], itl_stream(0.0, 5.0, gap_ms=5))
    nothing_waits = replay(ctl, merged(healthy, ticks(0.25, 5.0, in_flight=1)))
    assert {d.action for d in nothing_waits} == {"hold"} and ctl.starts_per_s == 2.0
    more = merged(itl_stream(5.0, 10.0, gap_ms=5), ticks(5.25, 10.0, in_flight=FULL))
    grown = [d.starts_per_s for d in replay(ctl, more) if d.action == "increase"]
    assert grown == [2.5, 3.0]  # up to max_per_s


def measured_prelude(seconds: float, host_misses: int = 0) -> list[tuple[float, str, float]]:
    """Chat active for `seconds` with 5 ms gaps every 10 ms and a frame start every 0.5 s, nothing waiting: enough
    for the learnt model's evidence (1,000 gaps, 20 frames). `host_misses` gaps of 50 ms fall far from any frame
    start (0.35 s after one): the host's own share above the objective."""
    gaps = itl_stream(0.0, seconds, gap_ms=5)
    far_from_frames = [i for i, (t, _, _) in enumerate(gaps) if round(t * 100) % 50 == 35][:host_misses]
    for i in far_from_frames:
        gaps[i] = (gaps[i][0], "itl", 50.0)
    starts = [(i * 0.5, "bg", 0.0) for i in range(round(seconds / 0.5))]
    return merged([(0.0, "start", 0)], gaps, starts, ticks(0.25, seconds, in_flight=1))


def test_pacing_grows_in_proportion_far_from_the_objectives_once_the_model_has_measured_room() -> None:
    """A loose objective is reached in a few increases; near the objective increases stay small."""
    ctl = pacer(max_per_s=50.0, increase_per_s=0.25, increase_factor=1.5, headroom=0.8)
    assert {d.action for d in replay(ctl, measured_prelude(10.0))} == {"hold"} and ctl.starts_per_s == 2.0
    far = merged(itl_stream(10.0, 11.0, gap_ms=5), ticks(10.25, 11.0, in_flight=FULL))
    assert [d.starts_per_s for d in replay(ctl, far) if d.action == "increase"] == [3.0, 4.5, 6.75]
    # Gaps at 90 % of the 20 ms objective: healthy, but no longer within 80 % of it. The window still holds the
    # 5 ms gaps; from the first tick the 18 ms ones are more than 1 % of it, so its p99 is 18 ms.
    near = merged(itl_stream(11.0, 12.0, gap_ms=18), ticks(11.25, 12.0, in_flight=FULL))
    assert [d.starts_per_s for d in replay(ctl, near) if d.action == "increase"] == [7.0, 7.25, 7.5]
    additive = pacer(max_per_s=50.0, increase_per_s=0.25, increase_factor=1.0)
    replay(additive, measured_prelude(10.0))
    assert [d.starts_per_s for d in replay(additive, far) if d.action == "increase"] == [2.25, 2.5, 2.75]


def test_pacing_grows_by_steps_until_the_model_has_measured_room() -> None:
    """Far inside the objectives by a few seconds of gaps is not enough to grow in proportion: before the learnt
    model has its evidence a fast-growing rate overshoots before its frames show in the window; and where the host's
    own gaps already use the target share up there is no room to grow into."""
    unmeasured = pacer(max_per_s=50.0, increase_per_s=0.25, increase_factor=1.5, headroom=0.8)
    far = merged([(0.0, "start", 0)], itl_stream(0.0, 1.0, gap_ms=5), ticks(0.25, 1.0, in_flight=FULL))
    decisions = replay(unmeasured, far)
    assert [d.starts_per_s for d in decisions if d.action == "increase"] == [2.25, 2.5, 2.75]
    assert all(d.learnt is None for d in decisions)
    crowded = pacer(max_per_s=50.0, increase_per_s=0.25, increase_factor=1.5, headroom=0.8)
    replay(crowded, measured_prelude(10.0, host_misses=8))  # 8 of ~700 gaps far from frames: 1.1 % > 0.7 %
    far = merged(itl_stream(10.0, 11.0, gap_ms=5), ticks(10.25, 11.0, in_flight=FULL))
    decisions = replay(crowded, far)
    assert [d.starts_per_s for d in decisions if d.action == "increase"] == [2.25, 2.5, 2.75]
    learnt = decisions[-1].learnt
    assert learnt is not None and learnt.base_share > 0.007


def test_a_chat_awaiting_its_first_token_holds_background_starts_for_at_most_the_hold() -> None:
    ctl = pacer(first_token_hold_s=0.5)
    first = ctl.interactive_started(1.0)
    assert ctl.caps(1.2).hold_until == 1.5
    assert ctl.caps(1.6).hold_until is None  # a prefill that long is not held for
    second = ctl.interactive_started(2.0)
    ctl.interactive_first_token(second)
    assert ctl.caps(2.1).hold_until is None
    ctl.interactive_finished(2.2, first)
    third = ctl.interactive_started(3.0)
    ctl.interactive_finished(3.1, third)  # ended without a token (an error): holds nothing
    assert ctl.caps(3.2).hold_until is None


def test_a_non_streaming_chat_holds_nothing_and_steady_chats_renew_the_hold() -> None:
    ctl = pacer(first_token_hold_s=0.5)
    whole = ctl.interactive_started(1.0, streams=False)  # its caller sees no first token: nothing to hold for
    assert ctl.caps(1.1).hold_until is None
    ctl.interactive_finished(1.2, whole)
    # Streaming chats every 0.2 s, each waiting 0.3 s for its first token: the hold never lapses on its own.
    holds = []
    for step in range(10):
        at = 2.0 + 0.2 * step
        handle = ctl.interactive_started(at)
        holds.append(ctl.caps(at + 0.1).hold_until)
        if step % 2:
            ctl.interactive_first_token(handle)  # some answer; the next chat keeps the hold
    assert all(until is not None and until > 2.0 for until in holds)


def test_a_start_due_under_the_floor_goes_ahead_of_a_hold_that_never_ends() -> None:
    """Steady chat renews the first-token hold for ever; the rate's floor still starts one request per interval,
    counted from the last start (or from the request's arrival): never sooner, so the hold still spares each chat's
    prefill everything but the floor's starts."""
    clock = FakeClock(100.0)

    async def scenario() -> list[float]:
        caps = FixedCaps(8)
        caps.caps = Caps(8, 10_000, True, starts_per_s=1000.0, hold_until=math.inf, min_starts_per_s=2.0)
        scheduler = BackgroundScheduler(caps, queue_size=10, clock=clock)
        waiting = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=3600)) for c in "abc"]
        await _waiting(scheduler, 3)
        started: list[float] = []
        for _ in range(3):
            clock.now += 0.25  # half the floor's interval: still held
            scheduler.dispatch()
            await asyncio.sleep(0)
            assert sum(task.done() for task in waiting) == len(started)
            clock.now += 0.25  # the floor's interval since the last start (or the arrival): due
            scheduler.dispatch()
            await _admitted(waiting, len(started) + 1)
            started.append(clock.now)
        for task in waiting:
            task.result().release()
        return started

    assert asyncio.run(scenario()) == [100.5, 101.0, 101.5]


def test_paced_starts_are_spread_one_at_a_time_even_after_a_quiet_spell() -> None:
    async def scenario() -> list[float]:
        caps = FixedCaps(8)
        caps.caps = Caps(8, 10_000, True, starts_per_s=20.0)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        tasks = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10)) for c in "abcdef"]
        grants = [await asyncio.wait_for(t, 10) for t in tasks]
        for grant in grants:
            grant.release()
        return sorted(g.admitted_at for g in grants)

    starts = asyncio.run(scenario())
    # Six requests at once: one starts now, the others one every 50 ms, woken by the pacer's timer.
    assert min(b - a for a, b in itertools.pairwise(starts)) >= 0.05 - 1e-4


def test_a_hold_keeps_background_back_until_it_ends_or_the_caps_drop_it() -> None:
    async def scenario() -> None:
        caps = FixedCaps(8)
        now = time.monotonic()
        caps.caps = Caps(8, 10_000, True, starts_per_s=1000.0, hold_until=now + 3600)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        waiting = asyncio.create_task(scheduler.acquire("a", 0, deadline_s=10))
        await _waiting(scheduler, 1)
        assert not waiting.done()
        caps.caps = Caps(8, 10_000, True, starts_per_s=1000.0)  # the chat's first token came
        scheduler.dispatch()
        (await asyncio.wait_for(waiting, 10)).release()

    asyncio.run(scenario())


def test_a_paced_start_of_several_frames_spends_one_start_per_frame() -> None:
    """The pacer's rate is a rate of frames: an event described from three frames starts when one would, and the
    next request waits for the three (1.5 s at 2 a second), not for one (0.5 s)."""
    clock = FakeClock(100.0)

    async def scenario() -> list[float]:
        caps = FixedCaps(8)
        caps.caps = Caps(8, 10_000, True, starts_per_s=2.0)
        scheduler = BackgroundScheduler(caps, queue_size=10, clock=clock)
        event = await scheduler.acquire("a", 900, deadline_s=3600, images=3)
        following = [asyncio.create_task(scheduler.acquire(c, 300, deadline_s=3600)) for c in "bc"]
        await _waiting(scheduler, 2)
        for admitted in (1, 2):
            while scheduler.state().waiting > 2 - admitted:
                clock.now += 0.25
                scheduler.dispatch()
            await _admitted(following, admitted)
        grants = [event, *(task.result() for task in following)]
        for grant in grants:
            grant.release()
        return [grant.admitted_at for grant in grants]

    assert asyncio.run(scenario()) == [100.0, 101.5, 102.0]


def test_a_request_of_several_images_is_capped_per_image() -> None:
    async def scenario() -> None:
        caps = FixedCaps(4, image_tokens=1000)
        caps.caps = Caps(4, 1000, True, max_tokens_per_image=64)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        three = await scheduler.acquire("a", 3 * 391, deadline_s=10, images=3)
        small = await scheduler.acquire("b", 3 * 40, deadline_s=10, images=3)
        # Each of the three images downscaled to 64 tokens, not the three together to 64; small ones as sent.
        assert (three.tokens, small.tokens) == (192, 120)
        three.release()
        small.release()

    asyncio.run(scenario())


# -- the alert class: a line of its own, ahead of background ---------------------------------------------------


def test_an_alert_waits_ahead_of_every_background_request_and_the_cameras_keep_their_turns() -> None:
    async def scenario() -> list[str]:
        caps = FixedCaps(1)
        scheduler = BackgroundScheduler(caps, queue_size=10)
        holder = await scheduler.acquire("x", 0, deadline_s=10)
        captions = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10)) for c in "abc"]
        await _waiting(scheduler, 3)
        alerts = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10, urgent=True)) for c in "dd"]
        state = await scheduler.wait_until(lambda s: s.waiting == 5, timeout=10)
        assert (state.waiting_urgent, state.in_flight_urgent) == (2, 0)
        order = []
        named = {task: name for task, name in zip([*captions, *alerts], ["a", "b", "c", "d1", "d2"], strict=True)}
        holder.release()
        pending = set(named)
        while pending:
            done, pending = await asyncio.wait(pending, timeout=10, return_when=asyncio.FIRST_COMPLETED)
            assert len(done) == 1  # one slot: one admitted at a time
            task = done.pop()
            order.append(named[task])
            task.result().release()
        return order

    assert asyncio.run(scenario()) == ["d1", "d2", "a", "b", "c"]


def test_a_full_background_line_does_not_refuse_an_alert_and_alerts_have_their_own_bound() -> None:
    async def scenario() -> None:
        scheduler = BackgroundScheduler(FixedCaps(1), queue_size=2)
        holder = await scheduler.acquire("x", 0, deadline_s=10)
        captions = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10)) for c in "ab"]
        await _waiting(scheduler, 2)
        with pytest.raises(QueueFullError):
            await scheduler.acquire("c", 0, deadline_s=10)
        alerts = [asyncio.create_task(scheduler.acquire(c, 0, deadline_s=10, urgent=True)) for c in "de"]
        await _waiting(scheduler, 4)
        with pytest.raises(QueueFullError, match="alert"):
            await scheduler.acquire("f", 0, deadline_s=10, urgent=True)
        holder.release()
        for task in [*alerts, *captions]:
            (await asyncio.wait_for(task, 10)).release()

    asyncio.run(scenario())


def test_under_pacing_an_alert_starts_on_borrowed_credit_background_pays_it_back_and_chat_never_preempts_it() -> None:
    """An alert does not wait for the next paced start: it borrows up to ALERT_BORROW_STARTS, the caption waiting
    before it waits until the debt is paid (starts stay at the pacer's rate), and a second alert at the debt's
    limit waits too."""
    clock = FakeClock(100.0)

    async def scenario() -> None:
        caps = FixedCaps(8)
        caps.caps = Caps(8, 10_000, True, starts_per_s=2.0)
        scheduler = BackgroundScheduler(caps, queue_size=10, clock=clock)
        first = await scheduler.acquire("a", 0, deadline_s=3600)  # the credit of now
        caption = asyncio.create_task(scheduler.acquire("b", 0, deadline_s=3600))
        await _waiting(scheduler, 1)
        # Credit 0: the alert starts at once on a borrowed start (credit -1), the caption still waits.
        alert = await asyncio.wait_for(scheduler.acquire("c", 0, deadline_s=3600, urgent=True), 10)
        second = asyncio.create_task(scheduler.acquire("d", 0, deadline_s=3600, images=2, urgent=True))
        await _admitted([second], 1)  # credit -1 is the borrowing limit's edge: -1 -> -3
        third = asyncio.create_task(scheduler.acquire("e", 0, deadline_s=3600, urgent=True))
        await _waiting(scheduler, 2)  # credit -3: the next alert waits 1 s (to -1), the caption 2 s (to 1)
        clock.now += 1.0  # credit -1
        scheduler.dispatch()
        await _admitted([third], 1)
        assert not caption.done()  # credit -2
        clock.now += 1.5  # credit 1: the caption's start at last, at the pacer's rate over the whole stretch
        scheduler.dispatch()
        await _admitted([caption], 1)
        assert len(scheduler.recent_starts) == 5
        # What each took before the pacer gave it (the gateway's borrowed-starts counter adds these up).
        grants = [first, alert, second.result(), third.result(), caption.result()]
        assert [grant.borrowed for grant in grants] == [0.0, 1.0, 2.0, 1.0, 0.0]
        for grant in [second.result(), third.result()]:
            grant.release()
        # A chat after idle asks the unpaced burst to give way: an alert admitted unpaced stays.
        caps.caps = Caps(8, 10_000, True)
        burst = [await scheduler.acquire(c, 0, deadline_s=10, urgent=c == "u") for c in "uv"]
        asked: list[str] = []
        for grant in burst:
            grant.preempt = lambda camera=grant.camera: asked.append(camera)
        caps.caps = Caps(8, 10_000, True, starts_per_s=2.0)
        scheduler.preempt_excess(max_age_s=10)
        assert asked == ["v"]
        for grant in [first, alert, caption.result(), *burst]:
            grant.release()

    asyncio.run(scenario())
