"""Helpers for the real-time scheduling tests: whether this process may use SCHED_FIFO, and a child that may not."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Callable
from typing import Any


def realtime_allowed(priority: int) -> bool:
    """Root has CAP_SYS_NICE; anyone else needs an RLIMIT_RTPRIO that reaches `priority`."""
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_RTPRIO)[0] >= priority


def without_realtime_rights(action: Callable[[], Any]) -> Any:
    """`action()`'s JSON-able result, run in a forked child that gives the right up for real: no real-time
    rlimit, and no longer root where it was (so no CAP_SYS_NICE)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
            if os.geteuid() == 0:
                os.setuid(65534)
            os.write(write_end, json.dumps(action()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(text)
