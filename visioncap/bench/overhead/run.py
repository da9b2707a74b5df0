"""The gateway's own cost to chat users, measured with vLLM's own client (`vllm bench serve`).

One vLLM, one gateway process in front of it, and `vllm bench serve` run alternately against each in ABBA
order (direct, gateway, gateway, direct, ...). Both blocks of a pair replay the same prompts at the same Poisson
arrival times (same `--seed`), so the machine's drift between blocks cancels in the pair and the pooled samples
of each arm see the same workload. The gateway runs as its own process, as in production; on this 2-core machine
it also competes with vLLM and the client for CPU, which a GPU host (tens of cores beside the GPU) would not
make it do: a ratio measured here is an upper bound on the ratio there, for the same gateway code.

vLLM runs without its prefix cache here, so the second block of a pair does not find the first's prompts cached.
What is compared is what `vllm bench serve` saves with `--save-detailed`: each request's time to first token and
its inter-token gaps (vLLM's definitions), pooled over the blocks of each arm. Ratios gateway/direct of p50 and
p99 come with a bootstrap 95% interval (the blocks resampled within each arm), so a reader can see how much of a
difference one run can resolve.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from visioncap.bench.common.client_priority import policy_of, realtime_child
from visioncap.bench.common.gateway_proc import GatewayProcess, gateway_config, new_key
from visioncap.bench.common.machine import machine_facts
from visioncap.bench.common.servers import measured_vllm, without_prefix_cache
from visioncap.bench.common.stats import percentile
from visioncap.config.profiles import ModelProfile
from visioncap.serve.launcher import ENTRY, group_members

log = logging.getLogger(__name__)

# The exposed-surfaces issue's goals (gateway over direct).
GOALS = {"overhead_ttft_p50": 1.05, "overhead_ttft_p99": 1.15, "overhead_itl_p99": 1.10}
ARMS = ("direct", "gateway")


@dataclass(frozen=True, slots=True)
class OverheadOptions:
    """One overhead run; the defaults give >= 200 chats per arm (TTFT p99) and >= 5,000 gaps (ITL p99)."""

    profile: ModelProfile
    server_python: Path
    work_dir: Path
    request_rate: float = 4.0  # chats per second, Poisson arrivals
    prompts_per_block: int = 60
    pairs: int = 4  # ABBA: pairs x 2 blocks
    input_len: int = 128
    output_len: int = 32
    seed: int = 0
    bootstrap_rounds: int = 1000
    # The gateway's process.realtime_priority (None: fair-scheduled), as `bench mixed` runs it on this host.
    gateway_realtime_priority: int | None = 10


@dataclass(slots=True)
class Block:
    """One `vllm bench serve` run against one arm."""

    arm: str
    pair: int
    seed: int
    ttfts_s: list[float]
    itls_s: list[float]  # every gap of every request, flattened
    failed: int
    wall_s: float
    summary: dict[str, Any] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)  # CPU seconds used meanwhile: gateway, vllm
    client_policy: str = "other"  # how `vllm bench serve` was scheduled (visioncap.bench.common.client_priority)


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of live processes (Linux /proc), children that ended not included."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


def bench_command(options: OverheadOptions, base_url: str, seed: int, result_file: Path, key: str | None) -> list[str]:
    """The exact `vllm bench serve` command for one block (recorded in the results)."""
    command = [
        str(options.server_python),
        str(ENTRY),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        base_url,
        "--model",
        options.profile.served_model_name,
        "--tokenizer",
        options.profile.model_location(),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(options.input_len),
        "--random-output-len",
        str(options.output_len),
        "--ignore-eos",
        "--num-prompts",
        str(options.prompts_per_block),
        "--request-rate",
        str(options.request_rate),
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(result_file.parent),
        "--result-filename",
        result_file.name,
    ]
    if key is not None:
        command += ["--header", f"Authorization=Bearer {key}"]
    return command


def _run_block(
    options: OverheadOptions, arm: str, pair: int, base_url: str, key: str | None, processes: dict[str, list[int]]
) -> Block:
    seed = options.seed * 1000 + pair
    result_file = options.work_dir / "overhead" / f"{arm}-{pair}.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    result_file.unlink(missing_ok=True)
    command = bench_command(options, base_url, seed, result_file, key)
    log_file = options.work_dir / "logs" / f"bench-serve-{arm}-{pair}.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    cpu_before = {name: cpu_seconds(pids) for name, pids in processes.items()}
    with (
        log_file.open("wb") as out,
        subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, preexec_fn=realtime_child()) as process,
    ):
        client_policy = policy_of(process.pid)
        try:
            returncode = process.wait(timeout=1800)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        if returncode != 0:
            raise subprocess.CalledProcessError(returncode, command)
    wall_s = time.monotonic() - started
    cpu = {name: round(cpu_seconds(pids) - cpu_before[name], 2) for name, pids in processes.items()}
    data = json.loads(result_file.read_text())
    errors = [error for error in data.get("errors", []) if error]
    ttfts = [float(t) for t, e in zip(data["ttfts"], data["errors"], strict=True) if not e and t > 0]
    gaps = [float(g) for itl, e in zip(data["itls"], data["errors"], strict=True) if not e for g in itl]
    summary = {key: data[key] for key in sorted(data) if key.endswith("_ms") or key in {"completed", "duration"}}
    log.info(
        "%s block %d: %d ok, %d failed, TTFT p50 %.1f p99 %.1f ms, ITL p99 %.1f ms (%.0f s)",
        arm,
        pair,
        len(ttfts),
        len(errors),
        data.get("median_ttft_ms", 0.0),
        data.get("p99_ttft_ms", 0.0),
        data.get("p99_itl_ms", 0.0),
        wall_s,
    )
    return Block(arm, pair, seed, ttfts, gaps, len(errors), wall_s, summary, cpu, client_policy)


def _pooled(blocks: Sequence[Block], arm: str) -> tuple[list[float], list[float]]:
    ttfts = [t for b in blocks if b.arm == arm for t in b.ttfts_s]
    gaps = [g for b in blocks if b.arm == arm for g in b.itls_s]
    return ttfts, gaps


def _statistic(blocks: Sequence[Block], metric: str, q: float) -> float | None:
    """Gateway over direct for one metric ("ttft" or "itl") and percentile, over the given blocks."""
    values = {}
    for arm in ARMS:
        ttfts, gaps = _pooled(blocks, arm)
        values[arm] = percentile(ttfts if metric == "ttft" else gaps, q)
    if values["direct"] in (None, 0) or values["gateway"] is None:
        return None
    return values["gateway"] / values["direct"]


def bootstrap_interval(
    blocks: Sequence[Block], metric: str, q: float, rounds: int, seed: int
) -> tuple[float, float] | None:
    """95% interval of the ratio: whole pairs resampled with replacement, so each draw keeps the ABBA pairing."""
    pairs = sorted({b.pair for b in blocks})
    if len(pairs) < 2:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(rounds):
        drawn = [rng.choice(pairs) for _ in pairs]
        sample = [b for p in drawn for b in blocks if b.pair == p]
        value = _statistic(sample, metric, q)
        if value is not None:
            ratios.append(value)
    if not ratios:
        return None
    low, high = percentile(ratios, 2.5), percentile(ratios, 97.5)
    return (round(low, 3), round(high, 3)) if low is not None and high is not None else None


def summarize(blocks: Sequence[Block], options: OverheadOptions) -> dict[str, Any]:
    arms: dict[str, Any] = {}
    for arm in ARMS:
        ttfts, gaps = _pooled(blocks, arm)
        arms[arm] = {
            "chats": len(ttfts),
            "gaps": len(gaps),
            "failed": sum(b.failed for b in blocks if b.arm == arm),
            "ttft_ms": {f"p{q}": _ms(percentile(ttfts, q)) for q in (50, 90, 99)},
            "itl_ms": {f"p{q}": _ms(percentile(gaps, q)) for q in (50, 90, 99)},
            "client_policies": sorted({b.client_policy for b in blocks if b.arm == arm}),
        }
        # The gateway's CPU per chat in its own arm: what it takes from vLLM's cores on a machine this small.
        cpu = {name: sum(b.cpu_s.get(name, 0.0) for b in blocks if b.arm == arm) for name in ("gateway", "vllm")}
        arms[arm]["cpu_ms_per_chat"] = {
            name: round(1000 * value / len(ttfts), 2) if ttfts else None for name, value in cpu.items()
        }
    goals: dict[str, Any] = {}
    for name, metric, q in (
        ("overhead_ttft_p50", "ttft", 50),
        ("overhead_ttft_p99", "ttft", 99),
        ("overhead_itl_p99", "itl", 99),
    ):
        value = _statistic(blocks, metric, q)
        interval = bootstrap_interval(blocks, metric, q, options.bootstrap_rounds, options.seed)
        goal = GOALS[name]
        goals[name] = {
            "value": None if value is None else round(value, 3),
            "goal": goal,
            "met": value is not None and value <= goal,
            "interval_95": interval,
            "met_on_upper_bound": interval is not None and interval[1] <= goal,
        }
    per_pair = []
    for pair in sorted({b.pair for b in blocks}):
        pair_blocks = [b for b in blocks if b.pair == pair]
        per_pair.append(
            {
                "pair": pair,
                "order": [b.arm for b in pair_blocks],
                "ttft_p50": _round(_statistic(pair_blocks, "ttft", 50)),
                "ttft_p99": _round(_statistic(pair_blocks, "ttft", 99)),
                "itl_p99": _round(_statistic(pair_blocks, "itl", 99)),
            }
        )
    return {"arms": arms, "goals": goals, "pairs": per_pair}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_overhead(options: OverheadOptions) -> dict[str, Any]:
    """Start vLLM and a gateway, run the ABBA blocks, return the results (nothing written)."""
    started = time.monotonic()
    chat_key, caption_key = new_key(), new_key()
    blocks: list[Block] = []
    # Both blocks of a pair send the same prompts: with vLLM's prefix cache the second would find the first's
    # prompts cached (seen: TTFT p50 ~21 ms against ~37 ms for whichever arm went first), a difference of order,
    # not of arm. Off, each block pays for its prompts.
    profile = without_prefix_cache(options.profile)
    with measured_vllm(profile, options.server_python, options.work_dir, "overhead") as server:
        config = gateway_config(
            server.base_url,
            chat_key,
            caption_key,
            background_priority=10,
            objectives={"ttft_p99_ms": 1000, "itl_p99_ms": 1000},
            background={},
            controller={},
            max_tokens_per_image=16384,
            realtime_priority=options.gateway_realtime_priority,
        )
        with GatewayProcess(config, options.work_dir, name="gateway-overhead") as gateway:
            urls = {"direct": server.root_url, "gateway": gateway.root_url}
            assert server.pid is not None and gateway.pid is not None
            processes = {"gateway": [gateway.pid], "vllm": group_members(os.getpgid(server.pid))}
            keys = {"direct": None, "gateway": chat_key}
            # A warm-up block each way, not kept: first requests pay for connection pools and lazy imports.
            warm = replace(options, prompts_per_block=8, seed=options.seed + 7919)
            for arm in ARMS:
                _run_block(warm, arm, -1, urls[arm], keys[arm], processes)
            for pair in range(options.pairs):
                order = ARMS if pair % 2 == 0 else ARMS[::-1]
                for arm in order:
                    blocks.append(_run_block(options, arm, pair, urls[arm], keys[arm], processes))
    results = summarize(blocks, options)
    example = bench_command(options, "URL", options.seed * 1000, Path("RESULT.json"), None)
    results.update(
        {
            "what": "chat TTFT and inter-token gaps through the gateway against direct to vLLM, `vllm bench serve`",
            "profile": options.profile.name,
            "request_rate_per_s": options.request_rate,
            "prompts_per_block": options.prompts_per_block,
            "pairs": options.pairs,
            "input_len": options.input_len,
            "output_len": options.output_len,
            "vllm_bench_command": " ".join(example[1:]).replace(str(ENTRY), "vllm"),
            "blocks": [
                {k: v for k, v in asdict(b).items() if k not in {"ttfts_s", "itls_s"}} | {"chats": len(b.ttfts_s)}
                for b in blocks
            ],
            "machine": machine_facts(),
            "wall_s": round(time.monotonic() - started, 1),
        }
    )
    return results


def report_lines(results: dict[str, Any]) -> list[str]:
    lines = [
        f"gateway overhead, `vllm bench serve` at {results['request_rate_per_s']}/s, "
        f"{results['pairs']} ABBA pairs of {results['prompts_per_block']} chats",
        "",
        "| arm | chats | gaps | failed | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms "
        "| gateway CPU ms/chat | vLLM CPU ms/chat |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in ARMS:
        a = results["arms"][arm]
        lines.append(
            f"| {arm} | {a['chats']} | {a['gaps']} | {a['failed']} | {a['ttft_ms']['p50']} | {a['ttft_ms']['p99']} "
            f"| {a['itl_ms']['p50']} | {a['itl_ms']['p99']} | {a['cpu_ms_per_chat']['gateway']} "
            f"| {a['cpu_ms_per_chat']['vllm']} |"
        )
    lines += ["", "| goal | gateway / direct | 95% interval | goal | met |", "|---|---|---|---|---|"]
    for name, goal in results["goals"].items():
        met = "yes" if goal["met"] else "no"
        lines.append(f"| {name} | {goal['value']} | {goal['interval_95']} | <= {goal['goal']} | {met} |")
    return lines
