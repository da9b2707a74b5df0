"""`python -m visioncap.bench.mixed.client_stalls`' parts: the stall watcher on a real loop, and a phase's record."""

from __future__ import annotations

import asyncio
import time

from visioncap.bench.common.load import ChatResult, PhaseResult, PhaseSpec
from visioncap.bench.mixed.client_stalls import phase_record, watched_phase


def test_the_watcher_sees_a_loop_held_up_and_whether_it_waited_for_a_core() -> None:
    async def hold_the_loop() -> tuple[PhaseResult, list[dict[str, float]]]:
        async def blocker() -> None:
            await asyncio.sleep(0.05)
            time.sleep(0.2)  # the loop blocked in a sleep: late, but not runnable meanwhile

        task = asyncio.create_task(blocker())
        result = await watched_phase(PhaseSpec("held", duration_s=0.4, warmup_s=0.0), stall_s=0.1)
        await task
        return result

    _, stalls = asyncio.run(hold_the_loop())
    # On a loaded machine the test's own process may also wait a tick or two; the hold is the one long stall.
    held = [stall for stall in stalls if stall["late_ms"] >= 190]
    assert len(held) == 1 and held[0]["late_ms"] < 400
    assert held[0]["waiting_ms"] < held[0]["late_ms"] / 2 and held[0]["on_cpu_ms"] < 50


def test_a_phase_record_counts_answers_that_came_whole_and_the_stalls_spent_waiting() -> None:
    def chat(index: int, ttft_s: float, tokens: int, arrivals: int) -> ChatResult:
        return ChatResult(index, 0.0, status=200, ttft_s=ttft_s, tokens=tokens, arrivals=arrivals)

    chats = [chat(0, 0.02, 40, 40), chat(1, 0.3, 40, 1), chat(2, 0.03, 9, 1), chat(3, 0.25, 12, 2)]
    result = PhaseResult("fair-0", 10.0, 1.0, chats, [], 0, 10.0, {}, client={"policy": "other", "cpu_s": 0.4})
    stalls = [
        {"at_s": 1.0, "late_ms": 100.0, "on_cpu_ms": 1.0, "waiting_ms": 90.0},
        {"at_s": 2.0, "late_ms": 300.0, "on_cpu_ms": 2.0, "waiting_ms": 290.0},
    ]
    record = phase_record(result, stalls)
    assert record["chats"] == 4 and record["whole_answers"] == 2  # the 9-token answer is too short to tell
    assert record["ttft_ms"]["max"] == 300.0
    assert record["stalls"] == 2 and record["longest_stall_ms"] == 300.0
    assert record["stall_share_waiting"] == 0.95
