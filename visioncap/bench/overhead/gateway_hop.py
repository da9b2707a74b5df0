"""The gateway's fixed cost per chat: its hop, with vLLM taken out of the picture.

`visioncap bench overhead` measures the gateway against vLLM itself, where a fraction of a millisecond hides in
vLLM's tens. This measures only the hop: sequential streamed chats (a 120-word prompt, four content chunks and
`[DONE]`) against an upstream that answers at once, straight to it and through a gateway process, interleaved
(ABBA); with `--baseline DIR`, through a second gateway run from another checkout too (`git worktree add DIR
COMMIT`), in the same interleaving, so that two versions of the gateway are compared side by side on one noisy
machine. Reported: the median added time to the first content chunk and to the answer's end, and the gateway's
CPU per chat (process user + system time over the run).

The upstream is an aiohttp server written here, not vLLM: the point is the hop's own cost, which a real vLLM's
time to first token (25 ms and more on this machine) would bury in its noise. It is a measuring instrument, not a
test double: nothing is asserted about vLLM through it.

    .venv/bin/python -m visioncap.bench.overhead.gateway_hop --chats 2000 [--baseline /tmp/base]
    # writes benchmarks/overhead/gateway-hop.json and .md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from aiohttp import web

from visioncap.bench.common.gateway_proc import GatewayProcess, gateway_config, new_key
from visioncap.bench.common.machine import REPO, machine_facts
from visioncap.bench.common.outputs import command_line, machine_line, write_results

OUT_DIR = REPO / "benchmarks" / "overhead"
WARMUP = 20  # chats per arm not kept: connection pools and lazy imports
_CHUNK = b'data: {"id":"h","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"%s"}}]}\n\n'
ANSWER = [_CHUNK % b"", *(_CHUNK % word for word in (b"a", b"b", b"c", b"d")), b"data: [DONE]\n\n"]


async def _chat(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for chunk in ANSWER:
        await response.write(chunk)
    await response.write_eof()
    return response


async def _empty(_request: web.Request) -> web.Response:
    return web.Response(text="")


@contextlib.asynccontextmanager
async def instant_upstream() -> Any:
    """An OpenAI-shaped server on a port of the kernel's choosing that streams `ANSWER` at once; yields its /v1
    URL."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _chat)
    for path in ("/metrics", "/health"):
        app.router.add_get(path, _empty)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # bound here: no window for another process to take the port
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def _checkout(directory: Path | None) -> Iterator[None]:
    """Start processes from `directory`'s code (python -m puts the working directory first on the path)."""
    if directory is None:
        yield
        return
    here, path = Path.cwd(), os.environ.get("PYTHONPATH")
    os.chdir(directory)
    os.environ["PYTHONPATH"] = str(directory)
    try:
        yield
    finally:
        os.chdir(here)
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]) -> tuple[float, float]:
    """Seconds to the first content chunk and to the end of one streamed chat."""
    started = time.perf_counter()
    first = None
    async with session.post(url, data=body, headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"{url} answered {response.status}: {await response.text()}")
        async for piece in response.content.iter_any():
            if first is None and b'"content":"a"' in piece:
                first = time.perf_counter()
    if first is None:
        raise RuntimeError(f"{url} streamed no content")
    return first - started, time.perf_counter() - started


async def measure(chats: int, baseline: Path | None, work_dir: Path) -> dict[str, Any]:
    """`chats` chats per arm after WARMUP, arms interleaved in ABBA order; the figures per arm."""
    key = new_key()
    body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hello " * 120}], "max_tokens": 32, "stream": True}
    ).encode()
    async with instant_upstream() as upstream:
        config = gateway_config(upstream, key, new_key(), 10, {"ttft_p99_ms": 1000, "itl_p99_ms": 1000}, {}, {}, 16384)
        gateways = {"gateway": GatewayProcess(config, work_dir, name="hop-gateway")}
        if baseline is not None:
            gateways["baseline"] = GatewayProcess(config, work_dir, name="hop-baseline")
        with contextlib.ExitStack() as stack:
            for name, gateway in gateways.items():
                with _checkout(baseline if name == "baseline" else None):
                    await asyncio.to_thread(gateway.start)
                stack.callback(gateway.stop)
            plain = {"content-type": "application/json"}
            keyed = {**plain, "authorization": f"Bearer {key}"}
            urls = {"direct": (f"{upstream}/chat/completions", plain)}
            urls |= {name: (f"{gateway.base_url}/chat/completions", keyed) for name, gateway in gateways.items()}
            processes = {name: psutil.Process(gateway.pid) for name, gateway in gateways.items()}
            code = {name: process.cwd() for name, process in processes.items()}  # whose visioncap each one runs
            times: dict[str, list[tuple[float, float]]] = {arm: [] for arm in urls}
            cpu_at_start: dict[str, float] = {}
            async with aiohttp.ClientSession() as session:
                for index in range(WARMUP + chats):
                    if index == WARMUP:
                        cpu_at_start = {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}
                    order = list(urls) if index % 2 == 0 else list(urls)[::-1]
                    for arm in order:
                        measured = await _one(session, urls[arm][0], body, urls[arm][1])
                        if index >= WARMUP:
                            times[arm].append(measured)
            cpu = {name: (sum(p.cpu_times()[:2]) - cpu_at_start[name]) / chats * 1000 for name, p in processes.items()}
    direct_first = statistics.median(t[0] for t in times["direct"])
    direct_end = statistics.median(t[1] for t in times["direct"])
    arms: dict[str, Any] = {}
    for arm, samples in times.items():
        first, end = statistics.median(t[0] for t in samples), statistics.median(t[1] for t in samples)
        arms[arm] = {
            "first_content_ms": round(first * 1000, 4),
            "answer_end_ms": round(end * 1000, 4),
            "added_first_content_ms": None if arm == "direct" else round((first - direct_first) * 1000, 4),
            "added_answer_end_ms": None if arm == "direct" else round((end - direct_end) * 1000, 4),
            "cpu_ms_per_chat": round(cpu[arm], 4) if arm in cpu else None,
            "code": code.get(arm),
        }
    return {"chats_per_arm": chats, "arms": arms}


def render(results: dict[str, Any]) -> str:
    lines = [
        "# The gateway's hop against an instant upstream",
        "",
        f"`{results['command']}`",
        "",
        machine_line(results["machine"], f"{results['chats_per_arm']} sequential streamed chats per arm, ABBA"),
        "",
        "| arm | first content p50 ms | added | answer end p50 ms | added | gateway CPU ms per chat |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for arm, figures in results["arms"].items():
        lines.append(
            f"| {arm} | {figures['first_content_ms']:.3f} | {_ms(figures['added_first_content_ms'])} | "
            f"{figures['answer_end_ms']:.3f} | {_ms(figures['added_answer_end_ms'])} | "
            f"{_ms(figures['cpu_ms_per_chat'])} |"
        )
    if results.get("baseline"):
        lines += ["", f"baseline: the gateway from {results['baseline']}"]
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=2000, help="Chats per arm (after 20 not kept).")
    parser.add_argument("--baseline", type=Path, help="A checkout of another commit whose gateway runs beside.")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="Where gateway-hop.json and .md go.")
    args = parser.parse_args(argv)
    machine = machine_facts()
    results = asyncio.run(measure(args.chats, args.baseline, REPO / "data" / "bench-gateway-hop"))
    if args.baseline is not None:
        from subprocess import run

        commit = run(["git", "-C", str(args.baseline), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        results["baseline"] = f"{args.baseline} (commit {commit.stdout.strip() or 'unknown'})"
    results = {
        "command": command_line("visioncap.bench.overhead.gateway_hop", sys.argv[1:] if argv is None else argv),
        "machine": machine,
        **results,
    }
    write_results("gateway-hop", results, render, args.out_dir)


if __name__ == "__main__":
    main()
