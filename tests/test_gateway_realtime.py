"""`process.realtime_priority`: the gateway's loop runs SCHED_FIFO where asked, and refuses to start where it cannot."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest
from pydantic import ValidationError
from realtime_rights import realtime_allowed, without_realtime_rights

from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.errors import ConfigError
from visioncap.gateway.in_thread import GatewayThread
from visioncap.gateway.realtime import run_realtime
from visioncap.serve import free_port


def config(**process: object) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1", "metrics_poll_s": 0}],
            "keys": [{"name": "chat", "sha256": hash_key("rt-chat-key"), "traffic_class": "interactive"}],
            "process": process,
        }
    )


def in_a_thread(action: Callable[[], object]) -> tuple[object, int]:
    """`action()`'s result in a fresh thread, and that thread's scheduling policy afterwards."""
    out: list[tuple[object, int]] = []

    def run() -> None:
        try:
            result: object = action()
        except ConfigError as exc:
            result = exc
        out.append((result, os.sched_getscheduler(0)))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out[0]


def test_the_loop_thread_runs_fifo_when_asked_and_as_it_was_when_not() -> None:
    assert in_a_thread(lambda: run_realtime(None)) == ("other", os.SCHED_OTHER)
    result, policy = in_a_thread(lambda: run_realtime(10))
    if realtime_allowed(10):
        assert (result, policy) == ("fifo", os.SCHED_FIFO)
    else:
        assert isinstance(result, ConfigError) and policy == os.SCHED_OTHER
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the caller's thread is not touched


def test_where_the_os_refuses_the_gateway_refuses_to_start_and_says_what_it_needs() -> None:
    def apply() -> str:
        try:
            run_realtime(10, "gateway file g.yaml")
        except ConfigError as exc:
            return str(exc)
        return "applied"

    message = without_realtime_rights(apply)
    assert message.startswith("gateway file g.yaml: process.realtime_priority: 10 cannot be applied here")
    assert "CAP_SYS_NICE" in message and "leave it unset" in message


@pytest.mark.parametrize("priority", [0, 50, 99])
def test_a_priority_outside_1_to_49_is_refused_by_the_config(priority: int) -> None:
    with pytest.raises(ValidationError, match="realtime_priority"):
        config(realtime_priority=priority)


def test_a_gateway_thread_serves_on_a_fifo_loop_when_its_config_asks() -> None:
    if not realtime_allowed(10):
        with pytest.raises(RuntimeError, match="realtime_priority"):
            GatewayThread(config(realtime_priority=10)).start()
        return
    with GatewayThread(config(realtime_priority=10)) as gw:
        assert gw._thread is not None and gw._thread.native_id is not None
        assert os.sched_getscheduler(gw._thread.native_id) == os.SCHED_FIFO
    with GatewayThread(config()) as gw:
        assert gw._thread is not None and gw._thread.native_id is not None
        assert os.sched_getscheduler(gw._thread.native_id) == os.SCHED_OTHER
