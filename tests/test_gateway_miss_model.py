"""The learnt start rate (`visioncap.gateway.miss_model`) on recorded sequences: no clock, no I/O.

Gaps every 5 ms (one chat streaming, a 5 ms engine step), an objective of 20 ms; a frame start makes the gap
that ends 0.1 s later a 40 ms one (its encoder step). The host adds slow gaps of its own, near no frame.
"""

from __future__ import annotations

import pytest

from visioncap.config.gateway import BackgroundConfig, ControllerConfig, ObjectivesConfig, PacingConfig
from visioncap.gateway.admission import AdmissionController
from visioncap.gateway.miss_model import MissModel

OBJECTIVE_S = 0.020
STEP_S = 0.005


def model(target_share: float = 0.007, **kwargs: float) -> MissModel:
    settings = {"window_s": 60.0, "spike_window_s": 0.15, "min_frames": 30, "min_gaps": 2000, **kwargs}
    return MissModel(objective_s=OBJECTIVE_S, target_share=target_share, **settings)  # type: ignore[arg-type]


def feed(m: MissModel, seconds: float, frames_per_s: float, host_every: int, start: float = 0.0) -> float:
    """`seconds` of chat streaming with frame starts at `frames_per_s` and one slow host gap every `host_every`
    gaps (placed away from frames); returns the end time."""
    steps = round(seconds / STEP_S)
    frame_every = round(1 / (frames_per_s * STEP_S)) if frames_per_s > 0 else 0
    spike_at: set[int] = set()
    for i in range(steps):
        now = start + (i + 1) * STEP_S
        if frame_every and i % frame_every == 0:
            m.observe_start(now)
            spike_at.add(i + round(0.1 / STEP_S))
        # The host's slow gaps fall 0.2 s after a frame start and 0.05 s before the next: near no frame.
        host = i % host_every == 40
        m.observe_gap(now, 0.040 if i in spike_at or host else STEP_S)
        if i % 50 == 49:
            m.observe_active(now, 50 * STEP_S)
    return start + steps * STEP_S


def test_the_rate_scales_the_measured_one_by_the_room_the_host_leaves() -> None:
    m = model()
    end = feed(m, 60.0, frames_per_s=4.0, host_every=1000)  # host: 0.1 % of gaps; frames: 4 of 200 a second
    # (frames every 50 gaps, so the host's gaps every 1000 fall 40 gaps after one: 0.2 s, near none)
    est = m.estimate(end)
    assert est is not None
    assert est.frames == 240 and est.gaps == 12000
    assert est.gaps_near_frames == pytest.approx(240 * 31, rel=0.03)  # each start's 0.15 s window: ~31 gaps
    assert est.base_share == pytest.approx(12 / (12000 - est.gaps_near_frames))  # the host's, among gaps near none
    # Every start cost one gap (2 %), less what the host's share would have put near frames anyway.
    assert est.excess_share == pytest.approx((240 - est.base_share * est.gaps_near_frames) / 12000)
    assert est.frames_per_s == pytest.approx(4.0, rel=0.01)
    # ~1.8 % at 4/s; 0.7 % less the host's ~0.3 % leaves ~0.4 %: ~0.95 frames/s.
    assert est.rate_per_s == pytest.approx(4.0 * (0.007 - est.base_share) / est.excess_share, rel=1e-9)
    assert est.rate_per_s is not None and 0.85 < est.rate_per_s < 1.05


def test_no_estimate_before_the_window_holds_enough_frames_and_gaps() -> None:
    m = model(min_frames=30)
    end = feed(m, 5.0, frames_per_s=4.0, host_every=1000)  # 20 frames, 1000 gaps
    assert m.estimate(end) is None


def test_a_host_that_uses_the_target_up_sets_no_cap() -> None:
    """No start rate meets the objective when the host alone misses it that often: the model does not hold frames
    back for nothing (the rate is AIMD's), though it still reports what it measured."""
    m = model()
    end = feed(m, 60.0, frames_per_s=2.0, host_every=100)  # 1 % of gaps near no frame above: past the 0.7 % target
    est = m.estimate(end)
    assert est is not None and est.base_share > 0.007 and est.excess_share > 0.005
    assert est.rate_per_s is None


def test_frames_that_cost_nothing_measurable_do_not_limit_the_rate() -> None:
    m = model()
    steps = 12000
    for i in range(steps):
        now = (i + 1) * STEP_S
        if i % 50 == 0:
            m.observe_start(now)  # 4 frames a second whose steps stay within the objective
        m.observe_gap(now, 0.040 if i % 1000 == 40 else STEP_S)  # the host's misses only, near no frame
        if i % 50 == 49:
            m.observe_active(now, 50 * STEP_S)
    est = m.estimate(steps * STEP_S)
    assert est is not None and est.excess_share == 0.0 and est.rate_per_s is None


def test_old_measurements_leave_the_window() -> None:
    m = model(window_s=30.0)
    end = feed(m, 30.0, frames_per_s=4.0, host_every=1000)
    assert m.estimate(end) is not None
    # 31 s later with no chat: nothing is left to learn from.
    assert m.estimate(end + 31.0) is None


def test_the_controller_caps_its_rate_by_the_learnt_one_and_increases_never_pass_it() -> None:
    objectives = ObjectivesConfig(ttft_p99_ms=1000, itl_p99_ms=OBJECTIVE_S * 1000, window_s=10)
    controller = ControllerConfig(idle_after_s=1.0, increase_interval_s=0, interval_s=0.25)
    # An evidence margin out of reach: AIMD alone would never lower the rate here.
    pacing = PacingConfig(start_per_s=4.0, min_per_s=0.25, max_per_s=8.0, increase_per_s=0.5, evidence_z=50)
    ctl = AdmissionController(objectives, BackgroundConfig(), controller, pacing=pacing)
    assert ctl.miss_model is not None
    ctl.interactive_started(0.0)
    decisions = []
    steps = round(60 / STEP_S)
    spikes: set[int] = set()
    for i in range(steps):
        now = (i + 1) * STEP_S
        if i % 50 == 0:  # 4 starts a second, each costing one 40 ms gap 0.1 s later
            ctl.background_started(now)
            spikes.add(i + 20)
        ctl.observe_itl(now, 0.040 if i in spikes else STEP_S)
        if i % 50 == 49:
            decisions.append(ctl.tick(now, background_in_flight=1, background_waiting=1))
    learnt = ctl.last_decision.learnt if ctl.last_decision else None
    assert learnt is not None and learnt.rate_per_s is not None
    # 2 % of gaps above at 4/s, no host misses: 0.7 % allows 1.4/s, and that is where the rate stays.
    assert learnt.rate_per_s == pytest.approx(1.4, rel=0.05)
    assert ctl.starts_per_s == pytest.approx(learnt.rate_per_s)
    # Before the window held 30 starts and 2,000 gaps the rate stood; from the first estimate on it is capped.
    first = next(i for i, d in enumerate(decisions) if d.learnt is not None)
    assert all(d.starts_per_s == 4.0 for d in decisions[:first])
    assert decisions[first].action == "learnt" and decisions[first].starts_per_s < 4.0
    for d in decisions[first:]:
        assert d.learnt is not None and d.learnt.rate_per_s is not None
        assert d.starts_per_s is not None and d.starts_per_s <= d.learnt.rate_per_s + 1e-9


def test_the_learnt_rate_can_be_switched_off() -> None:
    objectives = ObjectivesConfig(ttft_p99_ms=1000, itl_p99_ms=20, window_s=10)
    ctl = AdmissionController(objectives, BackgroundConfig(), ControllerConfig(), pacing=PacingConfig(learn_rate=False))
    assert ctl.miss_model is None
