"""Inter-token latency, one definition (`visioncap.gateway.sse`) for the gateway, `bench mixed` and `tune`.

Chunks that reach the reader in one network read share the gap before that read, so they are never timed as
0 ms apart. A scripted upstream writes several SSE events (HTTP chunks) with one `sendall` after the reader has
seen the first one, which is what a busy vLLM API server (or a busy client) produces.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from helpers import TINY_MODEL
from taps import AsgiThread, Tap

from visioncap.bench.common import load
from visioncap.bench.common.load import ChatResult, PhaseSpec, Target, _Phase, new_client
from visioncap.bench.common.stats import summarize
from visioncap.bench.common.workload import ChatTurn
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.in_thread import GatewayThread
from visioncap.gateway.sse import StreamObserver, inter_token_gaps, token_gaps
from visioncap.serve import VllmServer

TIMEOUT = 60  # seconds; only a bound on a broken test, never a measurement
DECODE_S = 0.02  # the scripted server's pause between its writes: a floor for the gap, never a wait for a state
KEY = "itl-test-key"


# -- the definition ---------------------------------------------------------------------------------------------


def test_merged_arrivals_share_their_gap() -> None:
    # (time, tokens): a token alone, then a read that brought 4 tokens at once, then one alone, then two reads
    # with the same time stamp (a gap that really is 0).
    arrivals = [(1.000, 1), (1.010, 1), (1.050, 4), (1.060, 1), (1.060, 1)]
    gaps = inter_token_gaps(arrivals)
    assert gaps == pytest.approx([0.010, 0.010, 0.010, 0.010, 0.010, 0.010, 0.0])
    assert len(gaps) == sum(tokens for _, tokens in arrivals[1:])  # one gap per token after the first arrival
    assert sum(gaps) == pytest.approx(arrivals[-1][0] - arrivals[0][0])
    assert 0.0 not in gaps[:-1]  # merged tokens are not 0 ms apart
    assert token_gaps(2.0, 2.3, 3) == pytest.approx([0.1, 0.1, 0.1])
    assert token_gaps(2.0, 2.3, 0) == []
    # The first arrival's tokens belong to the time to first token, whatever their number.
    assert inter_token_gaps([(0.5, 5), (0.6, 1)]) == pytest.approx([0.1])
    assert inter_token_gaps([(0.5, 5)]) == []


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def token(text: str, *ids: int) -> bytes:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    if ids:
        choice["token_ids"] = list(ids)
    return event({"choices": [choice]})


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}})
DONE = b"data: [DONE]\n\n"


def test_observer_stamps_once_per_network_read_and_spreads_the_gap() -> None:
    times = iter([10.0, 10.1, 10.4, 10.5])
    reads = iter([1, 1, 2, 2, 2, 3, 4])  # the read each feed below came from
    read_at = iter([50.0, 50.0, 60.0, 60.0, 60.0, 70.0, 80.0])  # when it returned, on the reads' own clock
    read_clock = iter([50.002, 50.003, 60.002, 60.003, 60.004, 70.002, 80.002])  # fed 2 ms after its read
    firsts: list[float] = []
    gaps: list[tuple[float, float]] = []
    observer = StreamObserver(
        9.9,
        lambda: next(times),
        lambda _at, seconds: firsts.append(seconds),
        lambda at, seconds: gaps.append((at, seconds)),
        reads=lambda: (next(reads), next(read_at)),
        read_clock=lambda: next(read_clock),
    )
    observer.feed(ROLE)  # read 1, t=10.0: no output
    observer.feed(token("a", 1))  # read 1: the first token (same time stamp as the role chunk)
    observer.feed(token("b", 2))  # read 2, t=10.1: one token
    observer.feed(token("cd", 3, 4) + b": keep-alive\n\n")  # read 2 again: httpx gives one piece per HTTP chunk
    observer.feed(token("e", 5))  # read 2 again
    observer.feed(token("f"))  # read 3, t=10.4: no token ids: one token
    observer.feed(USAGE + DONE)  # read 4, t=10.5: the end
    # A read's time is the clock's when its first bytes are fed, less their age then (2 ms): the later feeds of
    # the same read keep it.
    assert firsts == [pytest.approx(0.098)]
    assert [at for at, _ in gaps] == pytest.approx([10.098] * 4 + [10.398])
    assert [seconds for _, seconds in gaps] == pytest.approx([0.025] * 4 + [0.3])
    assert (observer.chunks, observer.tokens, observer.arrivals) == (5, 6, 3)
    assert observer.usage == {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}
    observer.close()  # the end was seen already: nothing more
    assert len(gaps) == 5


def test_tokens_come_from_token_ids_then_continuous_usage_then_one_per_chunk() -> None:
    gaps: list[float] = []
    observer = StreamObserver(0.0, iter([1.0, 2.0, 4.0]).__next__, lambda *_: None, lambda _at, s: gaps.append(s))
    with_usage = [
        {"choices": [{"index": 0, "delta": {"content": "a"}}], "usage": {"completion_tokens": 1}},
        {"choices": [{"index": 0, "delta": {"content": "bcd"}}], "usage": {"completion_tokens": 4}},  # 3 merged
        {"choices": [{"index": 0, "delta": {"content": "ef"}}]},  # no count at all: one token
    ]
    for payload in with_usage:
        observer.feed(event(payload))
    observer.close()
    assert gaps == pytest.approx([1 / 3] * 3 + [2.0])
    assert observer.tokens == 5


# -- the client side: bench mixed and tune -----------------------------------------------------------------------


class ScriptedUpstream:
    """An OpenAI-like streaming endpoint on a real socket: the first token, then (once `go` is set and a decode
    step later) four SSE events, five tokens, in one write, then usage and [DONE]. One request per connection."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.bodies: list[dict[str, Any]] = []
        self._socket = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._errors: list[BaseException] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}/v1"

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone would not)
        self._socket.close()
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive()
        assert not self._errors, self._errors

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._socket.accept()
            except OSError:
                return  # closed by __exit__
            try:
                with conn:
                    self._answer(conn)
            except BaseException as exc:  # reported by __exit__
                self._errors.append(exc)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += conn.recv(65536)
        self.bodies.append(json.loads(body))
        self.go.clear()
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
            b"connection: close\r\n\r\n" + chunk(ROLE) + chunk(token("a", 1))
        )
        assert self.go.wait(TIMEOUT), "the reader never saw the first token"
        time.sleep(DECODE_S)  # the engine's next steps
        conn.sendall(b"".join(chunk(e) for e in (token("b", 2), token("cd", 3, 4), token("e", 5), token("f", 6))))
        time.sleep(DECODE_S)
        conn.sendall(chunk(USAGE) + chunk(DONE) + b"0\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    with ScriptedUpstream() as server:
        yield server


def assert_merged_read_is_spread(gaps: list[float]) -> None:
    """The four events of one write: five tokens, five equal gaps (the old per-chunk timing gave g, 0, 0, 0)."""
    assert len(gaps) == 5, gaps
    assert gaps == pytest.approx([gaps[0]] * 5, rel=1e-9)
    assert sum(gaps) >= DECODE_S
    assert min(gaps) >= DECODE_S / 5


def test_bench_chat_times_a_merged_read_as_spread_gaps(
    upstream: ScriptedUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Signalling(StreamObserver):  # the upstream's cue that the client has read the first token
        def feed(self, data: bytes) -> None:
            super().feed(data)
            if self.arrivals:
                upstream.go.set()

    monkeypatch.setattr(load, "StreamObserver", Signalling)

    async def one_chat() -> ChatResult:
        async with new_client() as client:
            phase = _Phase(PhaseSpec("itl", 0, 0, chat=Target(upstream.base_url)), client)
            phase.t0 = time.perf_counter()
            await phase._chat(ChatTurn(0, 0.0, 4, 6), json.dumps({"stream": True}).encode())
            return phase.chats[0]

    result = asyncio.run(one_chat())
    assert result.status == 200 and result.error is None, result
    assert result.ttft_s is not None and result.ttft_s > 0
    assert_merged_read_is_spread(result.gaps_s)
    assert (result.chunks, result.tokens, result.arrivals) == (5, 6, 2)
    assert (result.prompt_tokens, result.completion_tokens) == (9, 6)
    # The summary's percentiles are those of the stats module over these gaps.
    assert summarize(result.gaps_s, 1000)["p50"] == pytest.approx(result.gaps_s[0] * 1000)


# -- the gateway --------------------------------------------------------------------------------------------------


def gateway_config(base_url: str) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": base_url, "metrics_poll_s": 0, "health_interval_s": 0}],
            "keys": [{"name": "chat", "sha256": hash_key(KEY), "traffic_class": "interactive"}],
        }
    )


def inter_token_histogram(gw: GatewayThread) -> dict[str, float]:
    """The interactive class's inter-token histogram: `count`, `sum` and the cumulative `le=...` buckets."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith("visioncap_gateway_inter_token_seconds") and 'traffic_class="interactive"' in line:
            series, value = line.rsplit(" ", 1)
            name = series.split("{", 1)[0].rsplit("_", 1)[1]
            if name == "bucket":
                name = "le=" + series.split('le="', 1)[1].split('"', 1)[0]
            found[name] = float(value)
    return found


def test_gateway_observes_a_merged_read_as_spread_gaps(upstream: ScriptedUpstream) -> None:
    with GatewayThread(gateway_config(upstream.base_url)) as gw:
        with httpx.stream(
            "POST",
            f"{gw.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=TIMEOUT,
        ) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if '"content":"a"' in line:
                    upstream.go.set()  # the gateway has read and forwarded the first token
        histogram = inter_token_histogram(gw)
    assert histogram["count"] == 5
    assert histogram["sum"] >= DECODE_S
    # Five equal gaps land in one bucket: none at 0-1 ms, where per-chunk timing put three of them.
    assert histogram["le=0.001"] == 0
    buckets = sorted((float(name.removeprefix("le=")), n) for name, n in histogram.items() if name.startswith("le="))
    assert 5 in [b - a for (_, a), (_, b) in itertools.pairwise([(0.0, 0.0), *buckets])]


# -- real vLLM ----------------------------------------------------------------------------------------------------


def test_real_vllm_stream_through_the_gateway_has_one_gap_per_token(vllm_server: VllmServer) -> None:
    """Every token is timed on both sides (return_token_ids), and no gap is 0 ms.

    A tap between the gateway and vLLM holds the answer after its first output token until the client has it, so
    both the gateway and the client read it in more than one piece. (Unpaced, a starved machine once let all 16
    tokens reach them in one read: one arrival and, by the definition, no gaps.)
    """
    body = {
        "model": TINY_MODEL,
        "messages": [{"role": "user", "content": "describe the scene"}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "return_token_ids": True,
        "user": "itl",
    }
    tap = Tap(vllm_server.root_url)

    async def one_chat(base_url: str) -> ChatResult:
        release = tap.pause_after_first_chunk("itl")
        async with new_client() as client:
            target = Target(base_url, {"Authorization": f"Bearer {KEY}"})
            phase = _Phase(PhaseSpec("itl", 0, 0, chat=target), client)
            phase.t0 = time.perf_counter()
            chat = asyncio.ensure_future(phase._chat(ChatTurn(0, 0.0, 3, 16), json.dumps(body).encode()))
            while not (phase.chats and phase.chats[0].ttft_s is not None) and not chat.done():
                await asyncio.sleep(0.005)  # until the client has the first token
            release.set()
            await chat
            return phase.chats[0]

    with AsgiThread(tap.app) as served, GatewayThread(gateway_config(served.root_url + "/v1")) as gw:
        tap.root_url = served.root_url
        before = inter_token_histogram(gw)
        started = time.perf_counter()
        result = asyncio.run(one_chat(gw.base_url))
        elapsed = time.perf_counter() - started
        after = inter_token_histogram(gw)
    assert result.status == 200 and result.error is None, result
    assert result.completion_tokens == 16 and result.tokens == 16
    # One gap per token after those of the first read, on the client's side and in the gateway's histogram.
    assert 1 <= len(result.gaps_s) <= 15
    assert min(result.gaps_s) > 0
    assert result.ttft_s is not None and result.ttft_s + sum(result.gaps_s) <= elapsed
    count = after.get("count", 0) - before.get("count", 0)
    assert 1 <= count <= 15
    assert 0 < after.get("sum", 0) - before.get("sum", 0) <= elapsed
