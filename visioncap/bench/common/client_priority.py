"""The load generator reads its sockets when the server writes to them: real-time scheduling for the measuring thread.

Why (measured 2026-12-03, vLLM alone, chat at 1/s beside 3 frames/s on this 2-core host; the runs are in
benchmarks/mixed/README.md, "Whose stall"): with the server saturating both cores, the kernel's fair scheduler
left the load generator's event loop runnable but unscheduled for 50-330 ms at a time (the wait column of its
/proc/self/task/TID/schedstat), about 20 times in 150 s, with no garbage collection. `tcpdump` on vLLM's port showed
the server writing each such chat's first token 13-34 ms after the request and the rest over 60-275 ms; the
client read the whole answer at once, 87-325 ms after sending it. So the TTFT p99 of a bench phase measured
the client's wait for a core, in every set-up alike (0-2 of 222 chats alone, 5-9 of S3's 215). `nice -10` did not
help (the waits stayed). SCHED_FIFO for the loop thread did: no wait over 60 ms, no one-read answer, TTFT max
61 ms where the fair-scheduled phase before it had 334 ms.

A chat user's client does not share the server's cores; a real-time loop thread is the nearest this host gets.
The thread only sends pre-built bodies, reads and stamps times (its CPU seconds are recorded beside each phase),
and the kernel keeps `sched_rt_runtime_us` (95 % by default) as the most real-time threads may take in any case.
vLLM, the system measured, keeps its ordinary scheduling, and the gateway runs as its config says
(`process.realtime_priority`, which `bench mixed` and `bench overhead` set): their own waits are part of what is
measured. The camera flood shares the loop, so it is sent on time too; it is a few HTTP posts a second.
`bench overhead` starts `vllm bench serve`, its measuring client, the same way (`realtime_child`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

log = logging.getLogger(__name__)

REALTIME_PRIORITY = 10  # SCHED_FIFO 1-99: above every fair-scheduled thread, below the kernel's own (50 for IRQs)


@dataclass(frozen=True)
class ClientScheduling:
    """How the measuring thread was scheduled during a phase: `fifo` or `other` (with why it was not real-time)."""

    policy: str
    priority: int = 0
    reason: str | None = None


@contextmanager
def realtime_thread(priority: int = REALTIME_PRIORITY) -> Iterator[ClientScheduling]:
    """The calling thread under SCHED_FIFO at `priority` for the block, then as it was before.

    Where the OS does not allow it (no CAP_SYS_NICE and RLIMIT_RTPRIO below `priority`, or not Linux) the block
    runs as it is and the result says why, so that a run can show which kind of client measured it.
    """
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        yield ClientScheduling("other", reason="this OS has no sched_setscheduler")
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        setter(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:  # PermissionError without the capability or rlimit
        log.warning("load generator stays fair-scheduled (%s): its own waits for a core will show in latencies", exc)
        yield ClientScheduling("other", reason=f"SCHED_FIFO not permitted: {exc}")
        return
    try:
        yield ClientScheduling("fifo", priority)
    finally:
        setter(0, policy, param)


@contextmanager
def fair_thread() -> Iterator[ClientScheduling]:
    """The block as it is (ordinary scheduling), reported the way `realtime_thread` reports: for comparisons."""
    yield ClientScheduling("other", reason="not asked")


def realtime_child(priority: int = REALTIME_PRIORITY) -> Callable[[], None]:
    """A `preexec_fn` for a measuring client started as a process (`vllm bench serve`): it starts under SCHED_FIFO
    where the OS allows it, as it is where not; `policy_of(pid)` reads back which."""

    def preexec() -> None:
        with suppress(OSError, AttributeError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))

    return preexec


def policy_of(pid: int) -> str:
    """`fifo` or `other`: how the process `pid` (its main thread) is scheduled."""
    return "fifo" if os.sched_getscheduler(pid) == os.SCHED_FIFO else "other"
