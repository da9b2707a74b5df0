"""The gateway's memory is bounded by its configuration, whatever callers send (the real `visioncap gateway`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import psutil

from visioncap.bench.common.gateway_proc import GatewayProcess
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key

KEY = "memory-camera-key"
MIB = 1024 * 1024
BUDGET = 128 * MIB
BODIES = 100
BODY_MIB = 10


def metric(text: str, name: str) -> float:
    """Sum of a series' samples over its labels (the queue depth is by upstream)."""
    lines = text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((f"{name} ", f"{name}{{")))


def test_a_hundred_10_mib_bodies_stay_within_the_body_budget(silent_vlm: str, tmp_path: Path) -> None:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [
                {
                    "name": "silent",
                    "base_url": silent_vlm,
                    "metrics_poll_s": 0,
                    "health_interval_s": 0,  # its listen backlog is for the requests under test
                    "read_timeout_s": 600,
                }
            ],
            "keys": [{"name": "cams", "sha256": hash_key(KEY), "traffic_class": "background"}],
            "background": {"max_concurrency": 1, "min_concurrency": 1, "queue_size": 256},
            "limits": {
                "max_background_body_bytes": 16 * MIB,
                "max_waiting_body_bytes": BUDGET,
                # A refused caller reads its 429 only if its upload ends within the drain, and here some 900 MiB
                # of refused uploads arrive at once: on a loaded 2-core CI machine that may take longer than the
                # default 5 s. Memory is what this test bounds, not the machine's upload speed.
                "refused_body_drain_s": 60,
            },
        }
    )
    text = "a person at the door " * (BODY_MIB * MIB // 21)
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 4}).encode()
    assert len(body) > 9 * MIB
    with GatewayProcess(config, tmp_path) as gateway:
        assert gateway.pid is not None
        process = psutil.Process(gateway.pid)
        baseline = process.memory_info().rss

        async def flood() -> tuple[list[httpx.Response], float, float]:
            limits = httpx.Limits(max_connections=BODIES)
            async with httpx.AsyncClient(timeout=httpx.Timeout(120, read=None), limits=limits) as client:
                headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
                url = f"{gateway.base_url}/chat/completions"
                sends = [asyncio.create_task(client.post(url, content=body, headers=headers)) for _ in range(BODIES)]
                peak_rss = peak_held = 0.0
                give_up = asyncio.get_running_loop().time() + 120  # a bound on a broken test only
                while True:  # until every body is refused or held (waiting or in flight): the most it holds
                    done = [task for task in sends if task.done()]
                    metrics = (await client.get(f"{gateway.root_url}/metrics")).text
                    peak_rss = max(peak_rss, process.memory_info().rss)
                    peak_held = max(peak_held, metric(metrics, "visioncap_gateway_waiting_body_bytes"))
                    held = metric(metrics, "visioncap_gateway_queue_depth") + 1  # one in flight at the silent vLLM
                    if len(done) + held >= BODIES and all(t.result().status_code == 429 for t in done):
                        break
                    assert asyncio.get_running_loop().time() < give_up, (
                        f"{len(done)} answered, {held:.0f} held, RSS {process.memory_info().rss / MIB:.0f} MiB"
                    )
                    await asyncio.wait(sends, timeout=0.2, return_when=asyncio.FIRST_COMPLETED)
                for task in sends:
                    task.cancel()
                return [t.result() for t in done], peak_rss, peak_held

        refused, peak_rss, peak_held = asyncio.run(flood())
    assert peak_held <= BUDGET
    assert refused and all(r.status_code == 429 and int(r.headers["retry-after"]) >= 1 for r in refused)
    assert {r.json()["error"]["type"] for r in refused} == {"body_budget_full"}
    # Budget + 300 MiB, as the issue sets it; the process itself takes ~100 MiB of that.
    assert peak_rss < BUDGET + 300 * MIB, f"RSS {peak_rss / MIB:.0f} MiB (baseline {baseline / MIB:.0f} MiB)"
