"""The load generator's thread is real-time during a phase where the OS allows it, and says so where it does not."""

from __future__ import annotations

import os
import subprocess
import sys

from realtime_rights import realtime_allowed, without_realtime_rights

from visioncap.bench.common.client_priority import REALTIME_PRIORITY, policy_of, realtime_child, realtime_thread
from visioncap.bench.common.load import PhaseSpec, run_phase_sync


def _allowed() -> bool:
    return realtime_allowed(REALTIME_PRIORITY)


def test_the_thread_is_fifo_inside_the_block_and_as_before_after_it() -> None:
    before = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    with realtime_thread() as scheduling:
        inside = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    after = os.sched_getscheduler(0), os.sched_getparam(0).sched_priority
    if _allowed():
        assert scheduling.policy == "fifo" and scheduling.reason is None
        assert inside == (os.SCHED_FIFO, REALTIME_PRIORITY)
    else:
        assert scheduling.policy == "other" and "not permitted" in (scheduling.reason or "")
        assert inside == before
    assert after == before


def test_without_the_right_it_runs_as_it_is_and_says_why() -> None:
    def inside_the_block() -> list[object]:
        with realtime_thread() as scheduling:
            return [scheduling.policy, scheduling.reason, os.sched_getscheduler(0)]

    policy, reason, inside = without_realtime_rights(inside_the_block)
    assert policy == "other"
    assert reason.startswith("SCHED_FIFO not permitted")
    assert inside == os.SCHED_OTHER


def test_a_phase_records_how_its_client_was_scheduled_and_the_cpu_it_used() -> None:
    summary = run_phase_sync(PhaseSpec("empty", duration_s=0.05, warmup_s=0.0)).summary()
    assert summary["client"]["policy"] == ("fifo" if _allowed() else "other")
    assert summary["client"]["cpu_s"] >= 0.0
    assert os.sched_getscheduler(0) == os.SCHED_OTHER


def test_a_measuring_client_started_as_a_process_runs_real_time_where_allowed() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, preexec_fn=realtime_child()
    ) as child:
        policy = policy_of(child.pid)
        child.communicate(b"")
    assert policy == ("fifo" if _allowed() else "other")
    assert policy_of(os.getpid()) == "other"


def test_a_phase_asked_to_stay_fair_scheduled_does_and_says_so() -> None:
    spec = PhaseSpec("fair", duration_s=0.05, warmup_s=0.0, realtime=False)
    summary = run_phase_sync(spec).summary()
    assert summary["client"]["policy"] == "other" and summary["client"]["reason"] == "not asked"
