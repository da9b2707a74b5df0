"""Large request bodies are parsed and checked off the gateway's event loop: a chat streams on while 8 MiB bodies
arrive (issue 40, item 7: a 6 MB body held the loop 1.15 s, and every stream with it).

The real gateway (in a thread of this process) in front of the session's real vLLM. The large bodies are of the
costliest shape per byte that the gateway reads (some 280,000 small messages, or 4 million integers) and each ends
with a media URL the gateway refuses: every one is parsed, walked and validated whole, and none reaches vLLM, whose
own event loop would otherwise parse it beside the chat's stream (that would measure vLLM, not the gateway).
"""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gateway_calls import TIMEOUT, chat_body

from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import VllmServer

pytestmark = pytest.mark.vllm

KEY = "large-bodies-chat-key"
MIB = 1024 * 1024
ROUNDS = 2  # of the two bodies at once
STREAM_TOKENS = 64
MAX_GAP_S = 0.050  # the bound on the chat's inter-token gaps while the bodies arrive
PROBE_S = 0.005


def compact(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def dense_bodies() -> list[bytes]:
    """8 MiB bodies of many small values, each refused only at its end (a media URL that is not allowed)."""
    refused = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://10.0.0.1/x"}}]}
    message = {"role": "user", "content": "a"}
    messages = [message] * (8 * MIB // (len(compact(message)) + 1))
    many_messages = compact({"model": "m", "messages": [*messages, refused]})
    many_ints = compact({"model": "m", "tools": [0] * (4 * MIB), "messages": [refused]})
    bodies = [many_messages, many_ints]
    assert all(8 * MIB <= len(body) <= 9 * MIB for body in bodies), [len(body) for body in bodies]
    return bodies


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[GatewayThread]:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": vllm_server.base_url, "metrics_poll_s": 0.5}],
            "keys": [{"name": "chat", "sha256": hash_key(KEY), "traffic_class": "interactive"}],
        }
    )
    # As `visioncap gateway` does at its start (gateway/app.py): the heap so far out of the collector's sight. Here
    # that heap is the whole test session's (torch, Ultralytics, every module a test imported): a full collection of
    # it took 0.2-0.28 s on this machine, and one that fell in the loop's thread was counted as the loop's own work.
    gc.collect()
    gc.freeze()
    try:
        with GatewayThread(config) as gw:
            yield gw
    finally:
        gc.unfreeze()


def run_queue_wait_s() -> float:
    """Seconds the calling thread has spent runnable but waiting for a CPU (the kernel's schedstat)."""
    return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9


class LoopProbe:
    """How long the gateway's event loop could not run a timer due every PROBE_S: in all, less the time the kernel
    left its thread waiting for a CPU, and the CPU time its thread spent meanwhile (the loop's own work).

    Why not the lateness alone: on the shared 2-core test machine other processes keep the run queue long, and a
    thread that is ready may wait hundreds of milliseconds for a core. Measured with no large body at all, at a load
    average of 13: chat gaps up to 1.1 s (p99 0.5 s) at the client, the loop late by up to 0.3-0.9 s, nearly all
    of it in the run queue. The gateway cannot cure that; it can only not add to it."""

    def __init__(self, gw: GatewayThread) -> None:
        self.gw = gw
        self.blocked_s = 0.0  # the longest the loop was held, run-queue waits left out
        self.late_s = 0.0  # the longest it ran late, all causes
        self.cpu_s = 0.0  # the most CPU time the loop's thread spent between two of its timers: its own work
        self._stop = threading.Event()
        self._done = threading.Event()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._stop.is_set():
                due, waited, cpu = loop.time() + PROBE_S, run_queue_wait_s(), time.thread_time()
                await asyncio.sleep(PROBE_S)
                late = loop.time() - due
                self.late_s = max(self.late_s, late)
                self.blocked_s = max(self.blocked_s, late - (run_queue_wait_s() - waited))
                self.cpu_s = max(self.cpu_s, time.thread_time() - cpu)
        finally:
            self._done.set()

    def __enter__(self) -> LoopProbe:
        loop = self.gw.gateway.loop
        assert loop is not None
        asyncio.run_coroutine_threadsafe(self._run(), loop)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._done.wait(TIMEOUT)


# The clients run as processes of their own: a thread of this process that the kernel leaves waiting for a CPU while
# it holds the GIL would hold the gateway's loop (in a thread here) with it, and the probe would count that too.
SEND = """
import json, sys, httpx
body = open(sys.argv[2], "rb").read()
headers = {"authorization": "Bearer " + sys.argv[3], "content-type": "application/json"}
answer = httpx.post(sys.argv[1], content=body, headers=headers, timeout=float(sys.argv[4]))
print(json.dumps([answer.status_code, answer.json()["error"]["type"]]))
"""
STREAM = """
import json, sys, threading, time, httpx
url, key, timeout, body = sys.argv[1], sys.argv[2], float(sys.argv[3]), json.loads(sys.argv[4])
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
gaps, chats = [], 0
while not stop.is_set() or chats < 1:  # chats back to back until told to stop
    arrivals = []
    with httpx.stream("POST", url, json=body, headers={"authorization": "Bearer " + key}, timeout=timeout) as r:
        assert r.status_code == 200, r.status_code
        for line in r.iter_lines():
            if line.startswith("data: {"):
                arrivals.append(time.perf_counter())
    gaps += [b - a for a, b in zip(arrivals, arrivals[1:])]
    chats += 1
print(json.dumps({"gaps": gaps, "chats": chats}))
"""


def test_a_chat_streams_on_while_8_mib_bodies_arrive(gateway: GatewayThread, tmp_path: Path) -> None:
    files = []
    for index, body in enumerate(dense_bodies()):
        files.append(tmp_path / f"body-{index}.json")
        files[-1].write_bytes(body)
    url = f"{gateway.base_url}/chat/completions"
    chat = {**chat_body("count on and on", max_tokens=STREAM_TOKENS), "stream": True}
    stream_args = [sys.executable, "-c", STREAM, url, KEY, str(TIMEOUT), json.dumps(chat)]
    warm = subprocess.run(stream_args, input="", capture_output=True, text=True, timeout=TIMEOUT, check=True)
    assert json.loads(warm.stdout)["chats"] == 1  # vLLM and the route warm
    answers = []
    with (
        LoopProbe(gateway) as probe,
        subprocess.Popen(stream_args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as streamer,
    ):
        for _ in range(ROUNDS):  # as many at once as the gateway has workers
            senders = [
                subprocess.Popen(
                    [sys.executable, "-c", SEND, url, str(path), KEY, str(TIMEOUT)], stdout=subprocess.PIPE, text=True
                )
                for path in files
            ]
            answers += [json.loads(sender.communicate(timeout=TIMEOUT)[0]) for sender in senders]
        streamed = json.loads(streamer.communicate("", timeout=TIMEOUT)[0])
    assert answers == [[400, "media_url_not_allowed"]] * (ROUNDS * len(files))
    gaps, chats = sorted(streamed["gaps"]), streamed["chats"]
    assert len(gaps) > 20, streamed  # the chat streamed while the bodies arrived
    # The loop's own work between two timers, on its CPU: what held every stream when bodies were parsed on the
    # loop (1.15 s for 6 MB). The waits left out: the run queue (`blocked_s` is without them), and the GIL while
    # another thread of this process (pytest's, the vLLM fixture's) held it on a loaded machine: seen as 155 ms of
    # hold with 1 ms on the loop's CPU, which a gateway in its own process does not share.
    assert probe.cpu_s < MAX_GAP_S, (
        f"the gateway's event loop worked {1e3 * probe.cpu_s:.0f} ms without a break while {len(answers)} bodies of "
        f"8 MiB arrived (held {1e3 * probe.blocked_s:.0f} ms at most without run-queue waits, late by "
        f"{1e3 * probe.late_s:.0f} ms with them); the chat's gaps at the client: longest {1e3 * gaps[-1]:.0f} ms, "
        f"median {1e3 * gaps[len(gaps) // 2]:.0f} ms ({chats} chats)"
    )
