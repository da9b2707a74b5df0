"""The load generator: streaming chat users, a caption flood and watch rules' questions (alert verifications), timed
from the client's side.

One asyncio loop sends every kind of traffic; every request body is made before the phase starts, so the loop only
sends, reads and stamps times. The loop's thread runs real-time during a phase where the OS allows it
(common.client_priority: fair-scheduled, it waited up to 330 ms for a core beside a saturating server, and
its TTFT p99 measured that wait); each phase records how it ran and the CPU it used. Chat latency is what a user
sees: time to the first network read that brings output, then inter-token gaps as `visioncap.gateway.sse` defines
them (the gateway's own definition: chunks read together share their gap). Captions are timed from send to the whole
answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from visioncap.alerts.verify import wait_allowed_s
from visioncap.bench.common.client_priority import fair_thread, realtime_thread
from visioncap.bench.common.stats import percentile, summarize
from visioncap.bench.common.workload import ChatTurn
from visioncap.caption.client import CAMERA_HEADER, DEADLINE_HEADER
from visioncap.gateway.sse import CountingTransport, StreamObserver, network_reads

READ_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Target:
    """Where one kind of traffic goes: a base URL (…/v1) and the headers (a gateway key) it needs."""

    base_url: str
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class ChatResult:
    index: int
    sent_at: float  # seconds from the phase start
    status: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)  # one per output token after the first arrival's
    chunks: int = 0  # output chunks (SSE events)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finished_at: float | None = None
    error: str | None = None
    tokens: int = 0  # output tokens counted from the chunks (token ids with return_token_ids)
    arrivals: int = 0  # network reads that brought output


@dataclass
class CaptionResult:
    index: int
    camera: str
    sent_at: float
    status: int = 0
    done_at: float | None = None
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at


@dataclass
class VerifyResult:
    """One watch rule's question (an alert verification) of `frames` frames: answered 200 in time, refused, or late
    (`deadline_s` passed before its answer, whoever kept it waiting)."""

    index: int
    camera: str
    frames: int
    sent_at: float
    deadline_s: float
    status: int = 0
    done_at: float | None = None
    error: str | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.done_at is None else self.done_at - self.sent_at

    @property
    def late(self) -> bool:
        """Not answered within its deadline: refused for it (408) or answered after it."""
        latency = self.latency_s
        return self.status == 408 or (latency is not None and latency > self.deadline_s)


@dataclass
class PhaseSpec:
    """One measured set-up: chat turns (arrivals after `warmup_s`), a flood (from 0), for `duration_s`."""

    name: str
    duration_s: float
    warmup_s: float
    chat: Target | None = None
    chat_turns: list[ChatTurn] = field(default_factory=list)
    chat_bodies: list[bytes] = field(default_factory=list)
    flood: Target | None = None
    flood_rate_per_s: float = 0.0
    flood_bodies: list[bytes] = field(default_factory=list)
    flood_cameras: list[str] = field(default_factory=list)
    flood_max_outstanding: int = 16
    # Watch rules' questions (a third class): evenly spaced from `interval / 2`, sent until `duration_s`, each
    # request's frames in `verify_frames`, at most `verify_max_outstanding` at once (more are dropped and counted).
    verify: Target | None = None
    verify_rate_per_s: float = 0.0
    verify_bodies: list[bytes] = field(default_factory=list)
    verify_cameras: list[str] = field(default_factory=list)
    verify_frames: list[int] = field(default_factory=list)
    verify_deadline_s: float = 20.0
    verify_max_outstanding: int = 4
    chat_grace_s: float = 120.0
    probe_urls: dict[str, str] = field(default_factory=dict)  # name -> URL sampled every probe_interval_s
    probe_interval_s: float = 1.0
    realtime: bool = True  # the load generator's thread real-time where allowed; False: fair-scheduled (a comparison)


@dataclass
class PhaseResult:
    name: str
    duration_s: float
    warmup_s: float
    chats: list[ChatResult]
    captions: list[CaptionResult]
    flood_dropped_at_client: int
    wall_s: float
    probes: dict[str, list[tuple[float, Any]]]
    unsent_flood: list[int] = field(default_factory=list)  # indices of flood bodies never sent
    # How the load generator's thread was scheduled and the CPU seconds it used (common.client_priority).
    client: dict[str, Any] = field(default_factory=dict)
    verifications: list[VerifyResult] = field(default_factory=list)
    verify_dropped_at_client: int = 0

    def ok_chats(self) -> list[ChatResult]:
        """Chats answered 200 with a first token and no error: the ones every latency figure is taken over."""
        return [c for c in self.chats if c.status == 200 and c.ttft_s is not None and c.error is None]

    def summary(self) -> dict[str, Any]:
        window = self.duration_s - self.warmup_s
        ok_chats = self.ok_chats()
        # Answered, but not one chunk carried text (a random-weight model can emit only invisible tokens).
        no_text = [c for c in self.chats if c.status == 200 and c.ttft_s is None and c.error is None]
        gaps = [gap for c in ok_chats for gap in c.gaps_s]
        in_window = [
            c
            for c in self.captions
            if c.status == 200 and c.done_at is not None and self.warmup_s <= c.done_at <= self.duration_s
        ]
        statuses: dict[str, int] = {}
        for caption in self.captions:
            key = str(caption.status) if caption.status else (caption.error or "unknown")
            statuses[key] = statuses.get(key, 0) + 1
        chat = None
        if self.chats:
            chat = {
                "requests": len(self.chats),
                "ok": len(ok_chats),
                "failed": len(self.chats) - len(ok_chats) - len(no_text),
                "no_text": len(no_text),
                "ttft_ms": summarize([c.ttft_s for c in ok_chats if c.ttft_s is not None], 1000),
                "itl_ms": summarize(gaps, 1000),
                "prompt_tokens_mean": _mean([c.prompt_tokens for c in ok_chats]),
                "completion_tokens_mean": _mean([c.completion_tokens for c in ok_chats]),
                "chunks_per_token": _ratio_sum(
                    [c.chunks for c in ok_chats], [c.completion_tokens or 0 for c in ok_chats]
                ),
                # Above 1: tokens reached the client together (one read) and shared their gap.
                "tokens_per_arrival": _ratio_sum([c.tokens for c in ok_chats], [c.arrivals for c in ok_chats]),
            }
        captions = None
        if self.captions:
            captions = {
                "sent": len(self.captions),
                "dropped_at_client": self.flood_dropped_at_client,
                "completed_in_window": len(in_window),
                "throughput_per_s": len(in_window) / window if window > 0 else None,
                "latency_ms": summarize([c.latency_s for c in in_window if c.latency_s is not None], 1000),
                "outcomes": statuses,
            }
        return {
            "name": self.name,
            "duration_s": self.duration_s,
            "warmup_s": self.warmup_s,
            "wall_s": self.wall_s,
            "chat": chat,
            "captions": captions,
            "verifications": self._verify_summary(),
            "client": self.client,
        }

    def _verify_summary(self) -> dict[str, Any] | None:
        """The questions sent in the measured window (after `warmup_s`): each is followed to its answer, so a slow
        one counts as slow, not as missing."""
        if not self.verifications and not self.verify_dropped_at_client:
            return None
        measured = [v for v in self.verifications if v.sent_at >= self.warmup_s]
        answered = [v for v in measured if v.status == 200 and v.latency_s is not None]
        statuses: dict[str, int] = {}
        for question in measured:
            key = str(question.status) if question.status else (question.error or "unknown")
            statuses[key] = statuses.get(key, 0) + 1
        window = self.duration_s - self.warmup_s
        return {
            "sent": len(measured),
            "dropped_at_client": self.verify_dropped_at_client,
            "answered": len(answered),
            "answered_per_s": len(answered) / window if window > 0 else None,
            "frames_mean": _mean([v.frames for v in measured]),
            "latency_ms": summarize([v.latency_s for v in answered if v.latency_s is not None], 1000),
            "late": sum(1 for v in measured if v.late),
            "deadline_s": measured[0].deadline_s if measured else None,
            "outcomes": statuses,
        }

    def raw(self) -> dict[str, Any]:
        return {
            "chats": [asdict(c) for c in self.chats],
            "captions": [{**asdict(c), "latency_s": c.latency_s} for c in self.captions],
            "verifications": [{**asdict(v), "latency_s": v.latency_s, "late": v.late} for v in self.verifications],
            "probes": self.probes,
        }


def _mean(values: list[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _ratio_sum(numerators: list[int], denominators: list[int]) -> float | None:
    total = sum(denominators)
    return sum(numerators) / total if total else None


class _Phase:
    def __init__(self, spec: PhaseSpec, client: httpx.AsyncClient) -> None:
        self.spec = spec
        self.client = client
        self.t0 = 0.0
        self.chats: list[ChatResult] = []
        self.captions: list[CaptionResult] = []
        self.outstanding = 0
        self.dropped = 0
        self.offered = 0  # flood bodies whose turn came (sent or dropped)
        self.dropped_indices: list[int] = []
        self.verifications: list[VerifyResult] = []
        self.verify_outstanding = 0
        self.verify_dropped = 0
        self.probes: dict[str, list[tuple[float, Any]]] = {name: [] for name in spec.probe_urls}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    async def run(self) -> PhaseResult:
        spec = self.spec
        self.t0 = time.perf_counter()
        chat_tasks: list[asyncio.Task[None]] = []
        flood_tasks: set[asyncio.Task[None]] = set()
        verify_tasks: list[asyncio.Task[None]] = []
        flooder = asyncio.create_task(self._flood(flood_tasks)) if spec.flood is not None else None
        verifier = asyncio.create_task(self._verify(verify_tasks)) if spec.verify is not None else None
        prober = asyncio.create_task(self._probe()) if spec.probe_urls else None
        try:
            if spec.chat is not None:
                for turn, body in zip(spec.chat_turns, spec.chat_bodies, strict=True):
                    delay = spec.warmup_s + turn.at - self.now()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    chat_tasks.append(asyncio.create_task(self._chat(turn, body)))
            remaining = spec.duration_s - self.now()
            if remaining > 0:
                await asyncio.sleep(remaining)
            if verifier is not None:
                await verifier  # sends nothing after duration_s
            # The flood keeps running until the last measured chat and question have their answers.
            if measured := chat_tasks + verify_tasks:
                _, pending = await asyncio.wait(measured, timeout=spec.chat_grace_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            for background in (flooder, prober, verifier):
                if background is not None:
                    background.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await background
            for task in list(flood_tasks):
                task.cancel()
            await asyncio.gather(*flood_tasks, return_exceptions=True)
        return PhaseResult(
            spec.name,
            spec.duration_s,
            spec.warmup_s,
            sorted(self.chats, key=lambda c: c.index),
            sorted(self.captions, key=lambda c: c.index),
            self.dropped,
            self.now(),
            self.probes,
            self.dropped_indices + list(range(self.offered, len(spec.flood_bodies))),
            verifications=sorted(self.verifications, key=lambda v: v.index),
            verify_dropped_at_client=self.verify_dropped,
        )

    async def _chat(self, turn: ChatTurn, body: bytes) -> None:
        spec = self.spec
        assert spec.chat is not None
        result = ChatResult(turn.index, self.now())
        self.chats.append(result)
        started = time.perf_counter()
        # Raw bytes, not lines: the observer needs them as read, and vLLM does not compress event streams.
        headers = {**spec.chat.headers, "content-type": "application/json", "accept-encoding": "identity"}
        observer: StreamObserver | None = None
        try:
            async with self.client.stream(
                "POST", f"{spec.chat.base_url}/chat/completions", content=body, headers=headers
            ) as response:
                result.status = response.status_code
                if response.status_code != 200:
                    result.error = (await response.aread()).decode("utf-8", "replace")[:300]
                    return
                observer = StreamObserver(
                    started,
                    time.perf_counter,
                    on_first=lambda _at, seconds: setattr(result, "ttft_s", seconds),
                    on_gap=lambda _at, seconds: result.gaps_s.append(seconds),
                    reads=network_reads(response),
                )
                async for data in response.aiter_raw():
                    observer.feed(data)
                observer.close()
        except asyncio.CancelledError:
            result.error = "cancelled (still streaming after the grace period)"
            raise
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        finally:
            result.finished_at = self.now()
            if observer is not None:
                result.chunks, result.tokens, result.arrivals = observer.chunks, observer.tokens, observer.arrivals
                usage = observer.usage or {}
                result.prompt_tokens = usage.get("prompt_tokens")
                result.completion_tokens = usage.get("completion_tokens")
                if observer.error is not None and result.error is None:
                    result.error = observer.error[:300]

    async def _flood(self, tasks: set[asyncio.Task[None]]) -> None:
        spec = self.spec
        interval = 1.0 / spec.flood_rate_per_s
        for index, body in enumerate(spec.flood_bodies):
            delay = index * interval - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            self.offered = index + 1
            if self.outstanding >= spec.flood_max_outstanding:
                self.dropped_indices.append(index)
                self.dropped += 1  # a camera pipeline with all its slots busy skips the frame
                continue
            camera = spec.flood_cameras[index] if index < len(spec.flood_cameras) else "cam"
            task = asyncio.create_task(self._caption(index, camera, body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _caption(self, index: int, camera: str, body: bytes) -> None:
        spec = self.spec
        assert spec.flood is not None
        result = CaptionResult(index, camera, self.now())
        self.captions.append(result)
        self.outstanding += 1
        headers = {**spec.flood.headers, "content-type": "application/json", "x-visioncap-camera": camera}
        try:
            response = await self.client.post(f"{spec.flood.base_url}/chat/completions", content=body, headers=headers)
            result.status = response.status_code
            if response.status_code == 200:
                result.done_at = self.now()
                result.completion_tokens = (response.json().get("usage") or {}).get("completion_tokens")
            else:
                result.error = response.text[:200]
        except asyncio.CancelledError:
            result.error = "cancelled at phase end"
            raise
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}"
        finally:
            self.outstanding -= 1

    async def _verify(self, tasks: list[asyncio.Task[None]]) -> None:
        spec = self.spec
        interval = 1.0 / spec.verify_rate_per_s
        for index, body in enumerate(spec.verify_bodies):
            at = (index + 0.5) * interval
            if at >= spec.duration_s:
                return
            delay = at - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.verify_outstanding >= spec.verify_max_outstanding:
                self.verify_dropped += 1  # the alerts engine still waits for its earlier questions
                continue
            tasks.append(asyncio.create_task(self._question(index, body)))

    async def _question(self, index: int, body: bytes) -> None:
        spec = self.spec
        assert spec.verify is not None
        camera = spec.verify_cameras[index] if index < len(spec.verify_cameras) else "cam"
        frames = spec.verify_frames[index] if index < len(spec.verify_frames) else 1
        result = VerifyResult(index, camera, frames, self.now(), spec.verify_deadline_s)
        self.verifications.append(result)
        self.verify_outstanding += 1
        # As the alerts engine's verifier sends it: its camera, and how long the gateway may keep it waiting.
        headers = {
            **spec.verify.headers,
            "content-type": "application/json",
            CAMERA_HEADER: camera,
            DEADLINE_HEADER: str(int(wait_allowed_s(spec.verify_deadline_s) * 1000)),
        }
        try:
            response = await self.client.post(f"{spec.verify.base_url}/chat/completions", content=body, headers=headers)
            result.status = response.status_code
            result.done_at = self.now()
            if response.status_code != 200:
                result.error = response.text[:200]
        except asyncio.CancelledError:
            result.error = "cancelled (still waiting after the grace period)"
            raise
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}"
        finally:
            self.verify_outstanding -= 1

    async def _probe(self) -> None:
        while True:
            for name, url in self.spec.probe_urls.items():
                at = self.now()
                try:
                    response = await self.client.get(url, timeout=5)
                    value: Any = probe_value(url, response.text)
                except httpx.HTTPError as exc:
                    value = {"error": type(exc).__name__}
                self.probes[name].append((round(at, 3), value))
            await asyncio.sleep(self.spec.probe_interval_s)


def probe_value(url: str, text: str) -> Any:
    if "/metrics" in url:
        values: dict[str, float] = {}
        for line in text.splitlines():
            for series, short in (("vllm:num_requests_running", "running"), ("vllm:num_requests_waiting", "waiting")):
                if line.startswith(series):
                    with contextlib.suppress(ValueError, IndexError):
                        values[short] = values.get(short, 0.0) + float(line.rsplit(" ", 1)[1])
        return values
    try:
        health = json.loads(text)
    except ValueError:
        return {"error": "not json"}
    states = upstream_states(health)
    if not states:
        return {"error": "no upstream"}
    # The benchmarks run one vLLM behind the gateway: its replica's state is the gateway's.
    background, interactive = states[0].get("background") or {}, states[0].get("interactive") or {}
    return {
        "in_flight": background.get("in_flight"),
        "waiting": background.get("waiting"),
        "cap": background.get("concurrency_cap"),
        "limit": background.get("limit"),
        "starts_per_s": background.get("starts_per_s"),
        "interactive_active": interactive.get("active"),
        "learnt": background.get("learnt"),  # the learnt rate's model (None: off, or too little evidence)
    }


def upstream_states(health: Any) -> list[dict[str, Any]]:
    """Each replica's state from the gateway's /healthz (`upstreams`: name -> state), in its order."""
    upstreams = health.get("upstreams") if isinstance(health, dict) else None
    return [state for state in (upstreams or {}).values() if isinstance(state, dict)]


def background_held(health: Any) -> float:
    """Background requests the gateway holds, waiting or in flight, over all its replicas."""
    total = 0.0
    for state in upstream_states(health):
        background = state.get("background") or {}
        total += (background.get("in_flight") or 0) + (background.get("waiting") or 0)
    return total


def new_client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        timeout=httpx.Timeout(READ_TIMEOUT_S, connect=10.0, pool=None),
        # Idle connections are closed before vLLM's 5 s keep-alive timeout would close them under a request.
        # Counted reads: chat gaps are measured per network read (visioncap.gateway.sse).
        transport=CountingTransport(
            httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=4)
        ),
    )


async def run_phase(spec: PhaseSpec) -> PhaseResult:
    with realtime_thread() if spec.realtime else fair_thread() as scheduling:
        cpu_before = time.thread_time()
        async with new_client() as client:
            result = await _Phase(spec, client).run()
        result.client = {**asdict(scheduling), "cpu_s": round(time.thread_time() - cpu_before, 2)}
    return result


def run_phase_sync(spec: PhaseSpec) -> PhaseResult:
    return asyncio.run(run_phase(spec))


async def _one_stream(client: httpx.AsyncClient, target: Target, body: bytes) -> tuple[float, float]:
    """(TTFT s, median gap s) of one streamed chat request sent alone."""
    spec = PhaseSpec("pair", 0, 0, chat=target)
    phase = _Phase(spec, client)
    phase.t0 = time.perf_counter()
    await phase._chat(ChatTurn(0, 0.0, 0, 0), body)
    result = phase.chats[0]
    if result.error or result.ttft_s is None:
        raise RuntimeError(f"paired overhead request failed: {result.status} {result.error}")
    return result.ttft_s, percentile(result.gaps_s, 50) or 0.0


async def paired_streams(direct: Target, gateway: Target, pairs: list[tuple[bytes, bytes]]) -> list[dict[str, float]]:
    """One request at a time, direct and through the gateway in ABBA order.

    The two requests of a pair have prompts and outputs of the same lengths but different text, so the
    second never finds the first's prompt in vLLM's prefix cache.
    """
    measured_pairs = []
    with realtime_thread():
        async with new_client() as client:
            for index, (first, second) in enumerate(pairs):
                order = [("direct", direct, first), ("gateway", gateway, second)]
                if index % 2:
                    order = [("gateway", gateway, first), ("direct", direct, second)]
                measured: dict[str, float] = {}
                for name, target, body in order:
                    ttft, itl = await _one_stream(client, target, body)
                    measured[f"{name}_ttft_s"] = ttft
                    measured[f"{name}_itl_s"] = itl
                measured_pairs.append(measured)
    return measured_pairs
