"""Whose stall is a slow first token: the server's, or the load generator's own wait for a core?

One vLLM (the sized stand-in, priority policy) serves chat at 1/s beside a camera flood, direct; the load generator
is the benchmarks' own (`visioncap.bench.common.load`). Phases alternate (ABBA) between its thread fair-scheduled and
real-time (`visioncap.bench.common.client_priority`). Beside each phase a 10 ms tick on the load generator's loop reads
its thread's schedstat (time on a CPU, time runnable but waiting for one) and records every tick late by more than
`--stall-ms`. Per phase: chats, answers that arrived whole (>= 10 tokens in <= 2 network reads), TTFT p50 / p99 /
max, the stalls (how many, the longest, their share spent waiting to run) and the load generator's CPU seconds.

    .venv/bin/python -m visioncap.bench.mixed.client_stalls [--rate 3] [--duration 90] [--pairs 2]
    # writes benchmarks/client_stalls/client-stalls.json and .md

On a GPU host the engine runs on the GPU and the client on spare cores: neither kind of stall is expected there.
This measures whether the benchmarks on this 2-core host measure the server or themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

from visioncap.bench.common.load import PhaseResult, PhaseSpec, Target, run_phase
from visioncap.bench.common.machine import REPO, machine_facts
from visioncap.bench.common.outputs import command_line, machine_line, write_results
from visioncap.bench.common.stats import percentile

OUT_DIR = REPO / "benchmarks" / "client_stalls"
TICK_S = 0.01
WHOLE_ANSWER = (10, 2)  # an answer of at least this many tokens that came in at most this many network reads


def _schedstat(tid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable and waiting for one) of thread `tid` of this process."""
    fields = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
    return int(fields[0]), int(fields[1])


async def _watch(stall_s: float, stalls: list[dict[str, float]], t0: float) -> None:
    tid = threading.get_native_id()
    last, (ran, waited) = time.perf_counter(), _schedstat(tid)
    while True:
        await asyncio.sleep(TICK_S)
        now, (ran_now, waited_now) = time.perf_counter(), _schedstat(tid)
        if now - last > stall_s:
            stalls.append(
                {
                    "at_s": round(now - t0, 3),
                    "late_ms": round((now - last) * 1000, 1),
                    "on_cpu_ms": round((ran_now - ran) / 1e6, 1),
                    "waiting_ms": round((waited_now - waited) / 1e6, 1),
                }
            )
        last, ran, waited = now, ran_now, waited_now


async def watched_phase(spec: PhaseSpec, stall_s: float) -> tuple[PhaseResult, list[dict[str, float]]]:
    """The phase, and the load generator's stalls meanwhile (seconds from its start)."""
    stalls: list[dict[str, float]] = []
    watcher = asyncio.create_task(_watch(stall_s, stalls, time.perf_counter()))
    try:
        return await run_phase(spec), stalls
    finally:
        watcher.cancel()


def phase_record(result: PhaseResult, stalls: list[dict[str, float]]) -> dict[str, Any]:
    chats = result.ok_chats()
    ttfts = [c.ttft_s for c in chats if c.ttft_s is not None]
    tokens, reads = WHOLE_ANSWER
    whole = [c for c in chats if c.tokens >= tokens and c.arrivals <= reads]
    late = sum(s["late_ms"] for s in stalls)
    return {
        "name": result.name,
        "client": result.client,
        "chats": len(chats),
        "whole_answers": len(whole),
        "ttft_ms": {
            "p50": _ms(percentile(ttfts, 50)),
            "p99": _ms(percentile(ttfts, 99)),
            "max": _ms(max(ttfts, default=None)),
        },
        "stalls": len(stalls),
        "longest_stall_ms": max((s["late_ms"] for s in stalls), default=0.0),
        "stall_share_waiting": round(sum(s["waiting_ms"] for s in stalls) / late, 3) if late else None,
        "stall_list": stalls,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Whose stall: the load generator fair-scheduled against real-time",
        "",
        machine_line(results["machine"], results["what"]),
        "",
        "| phase | client | chats | whole answers | TTFT p50 / p99 / max ms | stalls > "
        f"{results['stall_ms']:.0f} ms | longest ms | waiting share | client CPU s |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for p in results["phases"]:
        t = p["ttft_ms"]
        lines.append(
            f"| {p['name']} | {p['client'].get('policy')} | {p['chats']} | {p['whole_answers']} | "
            f"{t['p50']} / {t['p99']} / {t['max']} | {p['stalls']} | {p['longest_stall_ms']} | "
            f"{p['stall_share_waiting']} | {p['client'].get('cpu_s')} |"
        )
    lines += ["", f"Command: `{results['command']}`", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from visioncap.bench.common.servers import measured_vllm
    from visioncap.bench.mixed.run import MixedOptions, Run, as_stand_in, drain, with_policy
    from visioncap.config.profiles import load_profile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=3.0, help="camera frames offered per second")
    parser.add_argument("--duration", type=float, default=90.0, help="seconds per phase")
    parser.add_argument("--pairs", type=int, default=2, help="ABBA pairs of phases (fair, real-time)")
    parser.add_argument("--stall-ms", type=float, default=60.0, help="a loop tick this late is a stall")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    options, profile = as_stand_in(MixedOptions(), load_profile("standin", Path("models")))
    run = Run(options, profile)
    phases = []
    with measured_vllm(with_policy(profile, "priority"), options.server_python, options.work_dir, "stalls") as server:
        run.warm(server)
        for index in range(2 * args.pairs):
            realtime = (index % 4) in (1, 2)  # fair, real-time, real-time, fair, ...
            spec = PhaseSpec(f"{'fifo' if realtime else 'fair'}-{index // 2}", args.duration, 6.0, realtime=realtime)
            spec.chat = spec.flood = Target(server.base_url)
            spec.chat_turns, spec.chat_bodies = run.chat(spec.chat, args.duration, 6.0, index // 2)
            spec.flood_rate_per_s = args.rate
            _, spec.flood_bodies, spec.flood_cameras = run.flood(args.duration + 30, options.background_priority)
            result, stalls = asyncio.run(watched_phase(spec, args.stall_ms / 1000))
            drain(server.root_url)
            phases.append(phase_record(result, stalls))
            print({k: v for k, v in phases[-1].items() if k != "stall_list"}, flush=True)
    results = {
        "what": f"vLLM alone, chat 1/s beside {args.rate:g} frames/s, load generator fair against real-time (ABBA)",
        "stall_ms": args.stall_ms,
        "frame": [options.image_width, options.image_height, options.frame_filler_words],
        "phases": phases,
        "machine": machine_facts(),
        "command": command_line("visioncap.bench.mixed.client_stalls", sys.argv[1:] if argv is None else argv),
    }
    write_results("client-stalls", results, render, args.out_dir)


if __name__ == "__main__":
    main()
