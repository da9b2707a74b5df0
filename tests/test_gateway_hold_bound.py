"""The first-token hold has a bound: steady chat cannot stop captions (issue #41 item 2).

While a streaming chat waits for its first token the gateway starts no caption, and every new chat renews that
hold. The pacing floor (`pacing.min_per_s`) still starts one caption per interval, at that rate however late the
gateway's timers fire; a non-streaming chat, whose caller sees no first token, holds nothing. The real-vLLM tests
go through the recording tap (tests/taps.py), which holds the chats so that they never see a first token.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from gateway_calls import TIMEOUT, chat_body, post_chat
from taps import Tap, serving

from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.admission import Caps
from visioncap.gateway.in_thread import GatewayThread
from visioncap.gateway.scheduler import BackgroundScheduler, Grant
from visioncap.serve import VllmServer

INTERACTIVE_KEY = "hold-bound-interactive-key"
BACKGROUND_KEY = "hold-bound-background-key"


class FakeClock:
    """The scheduler's clock, moved by the test: what is due is decided by it, never by how fast this host runs."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class HeldForEver:
    """Caps of a gateway whose chat never gets its first token: paced, held without end, with a floor."""

    def __init__(self, floor_per_s: float) -> None:
        self.caps = Caps(8, 10_000, True, starts_per_s=1000.0, hold_until=math.inf, min_starts_per_s=floor_per_s)

    def __call__(self) -> Caps:
        return self.caps


def test_late_timers_do_not_slow_the_floor_below_its_rate() -> None:
    """Each floor start counts from when it was due, not from when the (late) timer let it through: with starts
    due at 0.5 s intervals, one that runs 0.1 s late does not push the next one back, and none comes sooner than
    the interval after the previous one was due."""
    clock = FakeClock(100.0)

    async def scenario() -> list[float]:
        scheduler = BackgroundScheduler(HeldForEver(2.0), queue_size=10, clock=clock)
        waiting = [asyncio.create_task(scheduler.acquire(camera, 0, deadline_s=3600)) for camera in "abcd"]
        async with asyncio.timeout(10):
            await scheduler.wait_until(lambda state: state.waiting == 4, timeout=10)
        started: list[float] = []
        for due, late in ((100.5, 0.1), (101.0, 0.0), (101.5, 0.1), (102.0, 0.0)):
            clock.now = due - 0.01  # just before: still held
            scheduler.dispatch()
            await asyncio.sleep(0)
            assert sum(task.done() for task in waiting) == len(started)
            clock.now = due + late  # when the timer fired
            scheduler.dispatch()
            async with asyncio.timeout(10):
                while sum(task.done() for task in waiting) <= len(started):
                    await asyncio.sleep(0)
            started.append(clock.now)
        grants: list[Grant] = [task.result() for task in waiting]
        for grant in grants:
            grant.release()
        return started

    assert asyncio.run(scenario()) == [100.6, 101.0, 101.6, 102.0]


# -- through the real vLLM -------------------------------------------------------------------------------------


@pytest.fixture
def tap(vllm_server: VllmServer) -> Iterator[Tap]:
    with serving(Tap(vllm_server.root_url)) as tap:
        yield tap


@pytest.fixture
def held_gateway(tap: Tap) -> Iterator[Callable[..., GatewayThread]]:
    """Factory: a gateway in front of the tap, paced as soon as a chat arrives and held by it for an hour; the
    tap's held requests are let go before the gateway stops."""
    started: list[GatewayThread] = []

    def make(pacing: dict[str, Any], deadline_s: float) -> GatewayThread:
        config = GatewayConfig.model_validate(
            {
                "upstreams": [{"name": "vllm", "base_url": tap.root_url + "/v1", "metrics_poll_s": 0.5}],
                "keys": [
                    {"name": "chat", "sha256": hash_key(INTERACTIVE_KEY), "traffic_class": "interactive"},
                    {"name": "captions", "sha256": hash_key(BACKGROUND_KEY), "traffic_class": "background"},
                ],
                "controller": {"interval_s": 3600, "idle_after_s": 3600},
                "background": {"deadline_s": deadline_s},
                "pacing": {"first_token_hold_s": 3600, **pacing},
            }
        )
        gw = GatewayThread(config)
        gw.start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        for gate in tap.held.values():
            gate.set()
        gw.stop()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Asked for first by the tests, so that it closes last: after the tap's held requests are let go, or a failed
    test would wait out each held call's timeout."""
    with ThreadPoolExecutor(max_workers=10) as executor:
        yield executor


def test_captions_start_at_the_floor_rate_while_a_chat_waits_for_its_first_token(
    pool: ThreadPoolExecutor, held_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    """A streaming chat that never gets its first token holds captions back, as steady chat would for ever; six
    frames queued behind it still start at `min_per_s`: the k-th within one interval (a stalled loop's margin,
    which does not add up: each start counts from when it was due) of k intervals after the first, no two within
    half an interval (the floor is also a ceiling while the hold lasts), and all are answered while the chat
    waits."""
    floor = 2.0  # starts per second
    interval = 1 / floor
    gw = held_gateway({"min_per_s": floor, "start_per_s": floor, "max_per_s": floor}, deadline_s=30)
    release_chat = tap.hold("chat")
    chat = pool.submit(post_chat, gw, INTERACTIVE_KEY, {**chat_body(max_tokens=4, user="chat"), "stream": True})
    tap.wait_for_user("chat")
    frames = [pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user=f"frame-{i}")) for i in range(6)]
    answers = [frame.result(TIMEOUT) for frame in frames]
    assert [answer.status_code for answer in answers] == [200] * 6, [answer.text for answer in answers]
    assert not chat.done(), "the frames went ahead while the chat still waited for its first token"
    starts = list(gw.call_soon(lambda: gw.gateway.replicas[0].scheduler.recent_starts))[-6:]
    offsets = [start - starts[0] for start in starts]
    assert all(offset <= (k + 1) * interval for k, offset in enumerate(offsets)), offsets
    assert all(b - a >= interval / 2 for a, b in itertools.pairwise(starts)), offsets
    release_chat.set()
    assert chat.result(TIMEOUT).status_code == 200


def test_a_chat_that_waits_for_its_whole_answer_holds_no_caption(
    pool: ThreadPoolExecutor, held_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    """A non-streaming chat has no first token its caller could see sooner: with it in vLLM (held by the tap) and a
    floor too low to matter here, frames start at the pacer's rate and are answered while it is still running;
    before, they waited out the hold and expired."""
    gw = held_gateway({"min_per_s": 0.01, "start_per_s": 20.0, "max_per_s": 20.0}, deadline_s=20)
    release_whole = tap.hold("whole")
    whole = pool.submit(post_chat, gw, INTERACTIVE_KEY, chat_body(max_tokens=4, user="whole"))
    tap.wait_for_user("whole")
    frames = [pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user=f"frame-{i}")) for i in range(3)]
    answers = [frame.result(TIMEOUT) for frame in frames]
    assert [answer.status_code for answer in answers] == [200] * 3, [answer.text for answer in answers]
    assert not whole.done()
    release_whole.set()
    assert whole.result(TIMEOUT).status_code == 200
