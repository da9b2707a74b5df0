"""The gateway's event loop ahead of the engine for a core, where the two share cores.

Why: on a host whose cores vLLM's engine keeps busy (the 2-core machine of the benchmarks), the kernel's fair
scheduler now and then leaves a runnable Python process waiting 50-330 ms for a core (measured for the benchmarks'
own client: benchmarks/client_stalls/). A chat whose first token passes through the gateway then waits with it.
The gateway's own work is about a millisecond per chat (benchmarks/overhead/gateway-hop.json), so running it first
takes little from the engine. SCHED_FIFO, not a lower nice value: at nice -10 the measured waits stayed.
On a host with cores to spare (a GPU box whose engine runs on the GPU) leave `process.realtime_priority` unset.
"""

from __future__ import annotations

import os

from visioncap.errors import ConfigError


def run_realtime(priority: int | None, source: str = "gateway config") -> str:
    """The calling thread (the gateway's event loop) under SCHED_FIFO at `priority`, inherited by the threads it
    starts afterwards; `fifo`, or `other` when `priority` is None. A ConfigError naming `source` where the OS
    refuses: a setting that silently did nothing would leave chat exposed to the waits it is there to remove."""
    if priority is None:
        return "other"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as exc:
        raise ConfigError(
            f"{source}: process.realtime_priority: {priority} cannot be applied here ({exc}); it needs "
            f"CAP_SYS_NICE or an RLIMIT_RTPRIO of at least {priority} (docker: cap_add SYS_NICE; systemd: "
            f"LimitRTPRIO={priority}; Kubernetes: securityContext.capabilities.add [SYS_NICE]), or leave it unset "
            "for ordinary scheduling"
        ) from exc
    return "fifo"
