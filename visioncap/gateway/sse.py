"""Reads server-sent-event streams as they arrive, and the one definition of inter-token latency visioncap uses.

The gateway's proxy forwards the bytes untouched and feeds them to a `StreamObserver`; `visioncap bench mixed`
and `visioncap tune` time their chat streams with the same observer on the client's side. The observer looks
only at complete events (`data: ...` blocks ended by a blank line) and times the chunks that carry output
(text, reasoning, tool calls, or token ids).

Inter-token latency (ITL), everywhere it is measured here (the gateway's `visioncap_gateway_inter_token_seconds`
and its controller's window, `bench mixed`'s and `tune`'s `itl_ms`):

- An *arrival* is what one network read delivers. Every output chunk completed by bytes of the same read gets
  that read's time stamp, also when the HTTP client hands the read over in several pieces (httpx, which `bench
  mixed` and `tune` read with, yields one piece per HTTP chunk, i.e. per SSE event, even when one read held
  many: see `CountingTransport`; the gateway's aiohttp client hands over one piece per read, so it needs none).
- The first output arrival ends the time to first token. Its tokens have no gaps: they were produced somewhere
  inside that wait, and nothing tells where.
- The gap g between an arrival and the previous output arrival, when the arrival carries k tokens, counts as k
  gaps of g / k (`token_gaps`). A chunk's tokens: the length of its `token_ids` (vLLM's `return_token_ids`,
  exact), else the growth of `usage.completion_tokens` since the previous chunk that carried usage
  (`stream_options.continuous_usage_stats`), else 1 per output chunk (then a chunk vLLM merged from several
  engine steps counts once, and its gap is not split).

So chunks that reach the reader together share their gap instead of showing one long gap and k - 1 gaps of
0 ms; a gap is 0 only when two reads really had the same time stamp. For one stream the gaps add up to the last
output arrival minus the first, with one gap per token after the first arrival's tokens, so their mean is
(last - first) / (N - k_first).

vLLM's definitions (`vllm bench serve`, vllm/benchmarks/lib/endpoint_request_func.py and serve.py, 0.32): the
client reads with aiohttp's `iter_any()` (what has arrived), splits out the SSE events, and stamps each event
that has `choices` with `perf_counter()` as it parses it; TTFT ends at the first such event (the role chunk,
sent together with the first token), every later one appends one ITL entry (its time minus the previous
event's), and the request's latency ends at the last one. So its ITL is per event, not per token: events parsed
from one read are microseconds apart, and an event carrying k tokens gives one gap for all k. Its TPOT is
(latency - TTFT) / (N - 1) with N from `usage.completion_tokens`: the mean of our gaps when the first arrival
carries one token and the chunks' tokens are counted exactly (token ids or continuous usage). The server's own
`vllm:inter_token_latency_seconds` is one engine-step interval per request, stamped in the engine, before any
of this merging.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import ssl
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpcore
import httpx

# A chat delta's content/reasoning or a completion's text with at least one character, tool calls, or token ids
# (`return_token_ids` gives them for tokens without text too). `"token_ids"` never matches `"prompt_token_ids"`.
OUTPUT_FIELD = re.compile(
    rb'"(?:content|reasoning_content|reasoning|text)": ?"[^"]|"tool_calls": ?\[\s*\{|"token_ids": ?\[\s*\d'
)
# A Responses API event (/v1/responses): only its `*.delta` events (text, reasoning, tool arguments) carry new
# output; the others repeat what was said (`response.output_text.done`, `response.completed`) or none.
RESPONSES_EVENT = re.compile(rb'"type": ?"response\.([a-z_.]+)"')
TOKEN_IDS = re.compile(rb'"token_ids": ?\[([^\]]*)\]')
COMPLETION_TOKENS = re.compile(rb'"completion_tokens": ?(\d+)')
USAGE = re.compile(rb'"usage": ?\{')
DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)  # httpx's own default


def token_gaps(previous_at: float, arrival_at: float, tokens: int) -> list[float]:
    """The inter-token gaps of an arrival carrying `tokens` tokens: its gap, shared equally by its tokens."""
    if tokens <= 0:
        return []
    return [(arrival_at - previous_at) / tokens] * tokens


def inter_token_gaps(arrivals: Sequence[tuple[float, int]]) -> list[float]:
    """Every inter-token gap of one stream, from its output arrivals as (time, tokens carried), in order.

    The first arrival's tokens have none (they belong to the time to first token); see the module docstring.
    """
    gaps: list[float] = []
    for (previous_at, _), (arrival_at, tokens) in itertools.pairwise(arrivals):
        gaps.extend(token_gaps(previous_at, arrival_at, tokens))
    return gaps


@dataclass
class _Arrival:
    at: float
    tokens: int  # those with a gap before them: none for the first arrival
    read: int


class StreamObserver:
    """Feed it a stream's bytes as they come; it reports the first output arrival and every inter-token gap.

    `on_first(now, seconds since started_at)` runs once, at the first output chunk. `on_gap(arrival time,
    seconds)` runs once per token after the first arrival, when its arrival is complete: when an event of a
    later read completes, at `[DONE]`, or at `close()`. `reads` tells which network read the fed bytes came from
    and when it returned (`network_reads`) on `read_clock`; without it every `feed()` counts as one read, made
    when it is fed.
    """

    def __init__(
        self,
        started_at: float,
        clock: Callable[[], float],
        on_first: Callable[[float, float], None],
        on_gap: Callable[[float, float], None],
        reads: Callable[[], tuple[int, float]] | None = None,
        read_clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._started_at = started_at
        self._clock = clock
        self._on_first = on_first
        self._on_gap = on_gap
        self._reads = reads
        self._read_clock = read_clock
        self._buffer = b""
        self._feeds = 0
        self._read: int | None = None  # the read the time stamp below belongs to
        self._read_at = 0.0
        self._previous_at: float | None = None  # the output arrival before the current one
        self._current: _Arrival | None = None
        self._completion_tokens = 0
        self.first_at: float | None = None
        self.chunks = 0  # output chunks (SSE events)
        self.tokens = 0  # output tokens, counted as the module docstring says
        self.arrivals = 0  # output arrivals (network reads that completed at least one output chunk)
        self.usage: dict[str, typing.Any] | None = None  # the last `usage` object seen
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        self._feeds += 1
        self._buffer += data
        if b"\n\n" not in self._buffer and b"\r\n\r\n" not in self._buffer:
            return
        normalized = self._buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = normalized.split(b"\n\n")
        read, now = self._arrival_time()
        for event in events:
            self._event(event, read, now)

    def close(self) -> None:
        """The stream has ended: report the gaps of the last arrival (idempotent)."""
        self._flush()

    def _arrival_time(self) -> tuple[int, float]:
        """The read the fed bytes came from, and its time on `clock`."""
        if self._reads is None:
            read, age = self._feeds, 0.0
        else:
            read, read_at = self._reads()
            # Bytes are usually fed as soon as they are read, but not always: a response's first body bytes can
            # come with its head and wait until the body is streamed. The read's age puts it on our clock.
            age = max(0.0, self._read_clock() - read_at)
        if read != self._read:
            self._read, self._read_at = read, self._clock() - age
        return read, self._read_at

    def _event(self, block: bytes, read: int, now: float) -> None:
        payload = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )  # comments (": keep-alive") and other fields carry no output
        if not payload:
            return
        if payload == b"[DONE]":
            self._flush()
            return
        if payload.startswith(b'{"error"'):
            self._error(payload)
            return
        tokens = self._tokens(payload)
        # A byte test instead of a JSON parse per chunk: vLLM writes compact JSON, and an output field holds a
        # non-empty string (or a tool-call list, or token ids) exactly when the chunk carries output.
        responses = RESPONSES_EVENT.search(payload)
        if responses is not None:
            if not responses.group(1).endswith(b".delta") or b'"delta":""' in payload:
                return
        elif OUTPUT_FIELD.search(payload) is None:
            return
        tokens = max(1, tokens)  # output without token ids still took a step
        self.chunks += 1
        self.tokens += tokens
        if self._current is not None and self._current.read == read:
            if self.arrivals > 1:
                self._current.tokens += tokens
            return
        self._flush()
        self.arrivals += 1
        if self.first_at is None:
            self.first_at = now
            self._on_first(now, now - self._started_at)
            self._current = _Arrival(now, 0, read)  # the first arrival's tokens have no gaps
        else:
            self._current = _Arrival(now, tokens, read)

    def _tokens(self, payload: bytes) -> int:
        """Tokens in one chunk (see the module docstring); also keeps the usage counts."""
        counted = None
        if USAGE.search(payload) is not None:
            with_usage = COMPLETION_TOKENS.search(payload)
            if with_usage is not None:
                total = int(with_usage.group(1))
                counted, self._completion_tokens = total - self._completion_tokens, total
            with contextlib.suppress(ValueError, AttributeError):
                self.usage = json.loads(payload).get("usage") or self.usage
        ids = TOKEN_IDS.search(payload)
        if ids is not None:
            return ids.group(1).count(b",") + 1 if ids.group(1).strip() else 0
        return counted if counted is not None and counted > 0 else 1

    def _flush(self) -> None:
        current, self._current = self._current, None
        if current is None:
            return
        if self._previous_at is not None:
            for gap in token_gaps(self._previous_at, current.at, current.tokens):
                self._on_gap(current.at, gap)
        self._previous_at = current.at

    def _error(self, payload: bytes) -> None:
        try:
            error = json.loads(payload).get("error")
        except (ValueError, AttributeError):
            error = None
        self.error = str(error.get("message") if isinstance(error, dict) else error)


# -- network reads ------------------------------------------------------------------------------------------------
# httpx hands a response body over in pieces, one per HTTP chunk (an SSE event from vLLM), even when one socket
# read delivered many of them; only the network stream knows the reads. These wrappers count them, and
# `network_reads` reads the count from a response, so the observer can tell which pieces arrived together.


class _CountingStream(httpcore.AsyncNetworkStream):
    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self.reads = 0
        self.read_at = 0.0

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = await self._stream.read(max_bytes, timeout)
        self.reads, self.read_at = self.reads + 1, time.perf_counter()
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _CountingStream(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class _CountingBackend(httpcore.AsyncNetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        return _CountingStream(await self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Iterable[typing.Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        return _CountingStream(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _SyncCountingStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream
        self.reads = 0
        self.read_at = 0.0

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._stream.read(max_bytes, timeout)
        self.reads, self.read_at = self.reads + 1, time.perf_counter()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, timeout)

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _SyncCountingStream(self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._stream.get_extra_info(info)


class _SyncCountingBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _SyncCountingStream(self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: typing.Iterable[typing.Any] | None = None
    ) -> httpcore.NetworkStream:
        return _SyncCountingStream(self._backend.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class CountingTransport(httpx.AsyncHTTPTransport):
    """httpx's transport (HTTP/1.1, no proxy) over sockets that count their reads (`network_reads`)."""

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or DEFAULT_LIMITS
        super().__init__(limits=limits)
        # httpx has no option for httpcore's network backend: the pool is made again, as httpx makes it, with one.
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_CountingBackend(),
        )


class SyncCountingTransport(httpx.HTTPTransport):
    """`CountingTransport` for `httpx.Client`."""

    def __init__(self, limits: httpx.Limits | None = None) -> None:
        limits = limits or DEFAULT_LIMITS
        super().__init__(limits=limits)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_SyncCountingBackend(),
        )


def network_reads(response: httpx.Response) -> Callable[[], tuple[int, float]] | None:
    """(reads so far, `time.perf_counter()` at the last) of the response's connection, for `StreamObserver`.

    None unless the response came through a counting transport.
    """
    stream = response.extensions.get("network_stream")
    if isinstance(stream, _CountingStream | _SyncCountingStream):
        return lambda: (stream.reads, stream.read_at)
    return None
