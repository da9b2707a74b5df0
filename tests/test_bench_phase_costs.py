"""What a benchmark phase cost the host: vLLM's own inter-token latency and CPU seconds per process group."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from helpers import TINY_MODEL

from visioncap.bench.common.load import probe_value
from visioncap.bench.mixed.phase_costs import (
    VLLM_API,
    CostSnapshot,
    EngineItl,
    cpu_by_group,
    engine_itl,
    phase_costs,
    snapshot,
    vllm_group,
    vllm_pids,
)
from visioncap.bench.mixed.run import block_pair_ratios, pooled_costs
from visioncap.gateway.upstream_metrics import gauges_url
from visioncap.serve import VllmServer

PAGE = """# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 9.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.05
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 30.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.15
vllm:inter_token_latency_seconds_created{engine="1",model_name="m"} 1.7e9
"""

# What a process is asked to burn, and how far below that a reading of it may fall: the kernel counts CPU time
# in clock ticks (10 ms at the usual 100 Hz) and psutil sums two counters (user, system), each cut down to a whole
# tick at both readings, so a difference can fall short by up to two ticks; floating point adds an ulp. Four ticks
# below what was burnt can never be missed by the resolution, and still fails a reader that lost the burn.
CLOCK_TICK_S = 1 / os.sysconf("SC_CLK_TCK")
CPU_READ_MARGIN_S = 4 * CLOCK_TICK_S
BURN_S = 0.3


def test_the_engine_histogram_is_summed_over_its_label_sets() -> None:
    assert engine_itl(PAGE) == EngineItl(0.2, 40.0)
    assert engine_itl(PAGE.replace("_sum", "_total")) is None  # half a histogram is no mean
    assert engine_itl("vllm:num_requests_running 1.0\n") is None


def test_phase_costs_are_the_differences_between_two_snapshots() -> None:
    before = CostSnapshot(EngineItl(1.0, 100.0), {"gateway": 2.0, "vllm_worker": 10.0})
    after = CostSnapshot(EngineItl(1.5, 200.0), {"gateway": 2.5, "vllm_worker": 30.0, "new": 1.0})
    assert phase_costs(before, after) == {
        "vllm_itl_mean_ms": 5.0,
        "vllm_itl_count": 100.0,
        "cpu_s": {"gateway": 0.5, "vllm_worker": 20.0},  # a group that was not there before is not a cost
    }
    idle = phase_costs(before, CostSnapshot(EngineItl(1.0, 100.0), {}))
    assert idle["vllm_itl_mean_ms"] is None and idle["vllm_itl_count"] == 0
    assert phase_costs(CostSnapshot(None, {}), after)["vllm_itl_mean_ms"] is None


def test_pooled_blocks_weigh_vllms_mean_by_its_counts_and_add_cpu() -> None:
    pooled = pooled_costs(
        [
            {"vllm_itl_mean_ms": 4.0, "vllm_itl_count": 300, "cpu_s": {"gateway": 0.5}},
            {"vllm_itl_mean_ms": 8.0, "vllm_itl_count": 100, "cpu_s": {"gateway": 0.25, "vllm_worker": 3.0}},
            {},  # a block whose counters could not be read
        ]
    )
    assert pooled == {"vllm_itl_mean_ms": 5.0, "vllm_itl_count": 400, "cpu_s": {"gateway": 0.75, "vllm_worker": 3.0}}


def test_block_pairs_carry_vllms_own_inter_token_ratio() -> None:
    summaries = {
        "S0-direct-1": {"chat": {"ttft_ms": {"p50": 10.0}, "itl_ms": {"p50": 4.0}}, "host": {"vllm_itl_mean_ms": 4.0}},
        "S0-gateway-2": {"chat": {"ttft_ms": {"p50": 11.0}, "itl_ms": {"p50": 5.0}}, "host": {"vllm_itl_mean_ms": 5.0}},
    }
    (pair,) = block_pair_ratios(summaries, {"direct": ["S0-direct-1"], "gateway": ["S0-gateway-2"]})
    assert pair["itl_p50_ratio"] == pytest.approx(1.25)
    assert pair["vllm_itl_mean_ratio"] == pytest.approx(1.25)


def test_cpu_is_counted_per_process_and_this_process_apart() -> None:
    # It burns BURN_S of CPU only once told to, after the first reading.
    burn = "import time, sys\nsys.stdin.readline()\nstart = time.process_time()\n"
    burn += f"while time.process_time() - start < {BURN_S}: pass\nprint('burnt', flush=True)\nsys.stdin.read()\n"
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        before = cpu_by_group([], {"burner": child.pid})
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "burnt\n"
        start = time.process_time()
        while time.process_time() - start < BURN_S:
            pass
        after = cpu_by_group([], {"burner": child.pid})
    finally:
        child.kill()
        child.wait()
    # Each burnt BURN_S by its own fine clock; read back in whole ticks, less the margin of that resolution.
    assert after["burner"] - before["burner"] >= BURN_S - CPU_READ_MARGIN_S
    assert after["load_generator"] - before["load_generator"] >= BURN_S - CPU_READ_MARGIN_S
    assert vllm_group("VLLM::EngineCore") == "vllm_engine_core" and vllm_group("python3") == VLLM_API


@pytest.mark.vllm
def test_a_real_vllm_counts_one_gap_per_token_after_the_first(vllm_server: VllmServer) -> None:
    pids = vllm_pids(vllm_server.root_url)
    assert pids, "nothing found listening on vLLM's port"
    body = {
        "model": TINY_MODEL,
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0,
    }
    with httpx.Client(timeout=60) as client:
        before = snapshot(client, vllm_server.root_url, pids, {})
        assert client.post(f"{vllm_server.base_url}/chat/completions", json=body).status_code == 200
        after = snapshot(client, vllm_server.root_url, pids, {})
        url = gauges_url(f"{vllm_server.root_url}/metrics")
        gauges = probe_value(url, client.get(url).text)
    costs = phase_costs(before, after)
    assert costs["vllm_itl_count"] == 7
    assert costs["vllm_itl_mean_ms"] is not None and costs["vllm_itl_mean_ms"] > 0
    assert {VLLM_API, "vllm_engine_core"} <= set(costs["cpu_s"])
    assert sum(costs["cpu_s"].values()) > 0
    assert set(gauges) == {"running", "waiting"}  # the probes' two-gauge page serves what they read
