"""How much a frame and a chat prompt cost the chat user on a running vLLM, in decode steps, against a target.

What the scheduler and a chat user feel is dimensionless: how many decode steps' worth of time one frame's
vision encoder pass and its prompt's prefill take, and one chat prompt's prefill. The cost model
(`visioncap.serve.costmodel`) gives those for a real model on a GPU class; this module measures them on the
server at hand, so `bench mixed` and `tune` can say whether their stand-in behaves like the target before they
judge anything on it.

How (one method for all three figures):

- A *probe* streams a long answer alone, so every engine step also carries one decode (batch 1, like the
  target's figure). Its median inter-token time between injections, from vLLM's engine-stamped
  `vllm:inter_token_latency_seconds` (`_sum`, `_count` read from /metrics around quiet stretches), is the plain
  decode step `step_s`.
- One request at a time is *injected* beside it, `max_tokens` 1: a frame (caption prompt and image), a text
  prompt of the same number of tokens, a chat prompt, and a one-word prompt. vLLM's
  `vllm:request_prefill_time_seconds` gives each one's time from its first scheduling to its first token on the
  engine's clock (neither this client nor vLLM's API server process, which may be busy preprocessing the
  image, blurs it): the steps that carried its encoder pass and prefill chunks. Minus the one-word prompt's
  (a step with next to no prefill) and minus a plain step per extra chunk, that is its cost; divided by
  `step_s`, its cost in decode steps.
- Prefill of a frame = the same-length text prompt's cost; encoder of a frame = the frame's cost minus that
  (so it also holds the image's preprocessing where that takes the engine's CPU, as on a 2-core machine; on a
  GPU the processor runs on other cores). Each prompt kind's figure is its lower quartile over `repeats`
  injections; the encoder's is the median of the frame-minus-text differences within each round
  (`encoder_steps`). `warmup_rounds` are run first and not kept (see the comment on it).

The target is the cost model's batch-1 figure (one decoding request, like the probe); a measured figure within
`tolerance` (default +-25 %) of it is faithful.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import secrets
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import httpx

from visioncap.bench.common.client_priority import realtime_thread
from visioncap.bench.common.stats import percentile
from visioncap.bench.common.workload import WORDS, camera_frame, caption_body, filler_text
from visioncap.caption.encode import jpeg_data_uri
from visioncap.gateway.sse import StreamObserver

log = logging.getLogger(__name__)

DEFAULT_TOLERANCE = 0.25
STEADY_SPREAD = 1.0
FIGURES = ("frame_encoder_steps", "frame_prefill_steps", "chat_prefill_steps")
KINDS = ("tiny", "frame", "same_text", "chat")  # tiny: a one-word prompt, the step a prompt costs at least
# Dropped connections in a row that a measurement takes as a hiccup and tries again (beyond: the server is gone).
TRANSPORT_RETRIES = 3
COUNTED = ("vllm:inter_token_latency_seconds", "vllm:request_prefill_time_seconds")  # engine-stamped histograms


@dataclass(frozen=True)
class FidelityTarget:
    """What the stand-in should cost, in decode steps (batch 1), and where the figures come from."""

    frame_encoder_steps: float
    frame_prefill_steps: float
    chat_prefill_steps: float
    source: str  # e.g. "cost model: qwen2.5-vl-7b on h200"


@dataclass(frozen=True)
class FidelityProbe:
    """What to inject: the stand-in's frame and chat prompt sizes."""

    frame_width: int = 640
    frame_height: int = 480
    chat_prompt_tokens: int = 256
    frame_filler_words: int = 0  # text after the frame's image (about a token a word; visioncap.bench.standin.sizing)
    repeats: int = 15
    probe_tokens: int = 1500  # one probe stream's length; a new one starts when it ends
    settle_tokens: int = 6  # plain steps between injections, so their effects never overlap
    # Rounds run first and not kept. A new prompt length makes the CPU's matmul library build kernels for the new
    # shapes (tens of ms, once), which a GPU's CUDA graphs or warm caches would not show; and on a server that had
    # just captioned 48 frames, with one round dropped, the first kept round's frame still cost 12 decode steps, the
    # next three about 6 and the rest 3.5-4 (2026-12-02; its text prompts 3.8 falling to 2.7).
    warmup_rounds: int = 4
    budget: int | None = None  # the server's max_num_batched_tokens, for prompts that take several chunks
    seed: int = 0


class SizedWorkload(Protocol):
    """What a bench's options say of its workload (`MixedOptions`, `TuneOptions`)."""

    image_width: int
    image_height: int
    chat_prompt_tokens: tuple[int, int]  # shortest and longest
    frame_filler_words: int
    seed: int


def probe_for(workload: SizedWorkload, repeats: int = FidelityProbe.repeats) -> FidelityProbe:
    """The probe that measures a bench's workload: its frames and filler, and its longest chat prompt."""
    return FidelityProbe(
        frame_width=workload.image_width,
        frame_height=workload.image_height,
        chat_prompt_tokens=workload.chat_prompt_tokens[1],
        frame_filler_words=workload.frame_filler_words,
        repeats=repeats,
        seed=workload.seed,
    )


@dataclass
class Injection:
    kind: str
    prompt_tokens: int
    prefill_s: float  # vLLM's request_prefill_time: from its first scheduling to its first token, engine clock
    round: int = 0  # which round of KINDS it was injected in (a frame and its same-length text pair by round)
    extra_s: float = 0.0
    steps: float = 0.0


@dataclass
class FidelityResult:
    """Measured against target; `faithful` when every figure is within tolerance of its target."""

    target: FidelityTarget
    probe: FidelityProbe
    step_ms: float
    frame_prompt_tokens: int
    chat_prompt_tokens: int
    measured: dict[str, float]
    ratio: dict[str, float | None]  # measured / target
    within: dict[str, bool]
    tolerance: float
    faithful: bool
    # The quiet decode steps' spread ((p90 - p10) / median): above STEADY_SPREAD the machine was too busy for
    # the figures to mean anything, and they are not judged.
    step_spread: float = 0.0
    steady: bool = True
    injections: list[dict[str, Any]] = field(default_factory=list)
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def within_tolerance(measured: float, target: float, tolerance: float = DEFAULT_TOLERANCE) -> bool:
    """measured / target inside [1 - tolerance, 1 + tolerance]."""
    return target > 0 and abs(measured / target - 1) <= tolerance + 1e-12


def judge(
    measured: dict[str, float], target: FidelityTarget, tolerance: float = DEFAULT_TOLERANCE
) -> tuple[dict[str, float | None], dict[str, bool]]:
    """Each figure's measured/target ratio and whether it is within tolerance."""
    ratios: dict[str, float | None] = {}
    within: dict[str, bool] = {}
    for name in FIGURES:
        goal = getattr(target, name)
        ratios[name] = measured[name] / goal if goal > 0 else None
        within[name] = within_tolerance(measured[name], goal, tolerance)
    return ratios, within


def spread_of(values: Sequence[float]) -> float:
    """(p90 - p10) / median of `values`: how much the plain decode step moved during the measurement."""
    middle = statistics.median(values)
    high, low = percentile(values, 90), percentile(values, 10)
    if middle <= 0 or high is None or low is None:
        return float("inf")
    return (high - low) / middle


def _low(values: Sequence[float]) -> float:
    low = percentile(values, 25)
    if low is None:
        raise ValueError("no measurements")
    return low


def histogram_totals(metrics_text: str, name: str) -> tuple[float, float]:
    """(sum, count) of one of vLLM's histograms over all its label sets."""
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith(f"{name}_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(f"{name}_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


@dataclass(frozen=True)
class _Counters:
    itl: tuple[float, float]
    prefill: tuple[float, float]

    @classmethod
    def parse(cls, metrics_text: str) -> _Counters:
        itl, prefill = (histogram_totals(metrics_text, series) for series in COUNTED)
        return cls(itl, prefill)


def text_of_tokens(words: int, seed: int) -> str:
    """A prompt of `words` words of the tiny tokenizer's vocabulary (about a token each), unique per seed."""
    return filler_text(max(1, words), seed)


class _Probe:
    """The long decoding stream whose steps carry every injected request's work."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, model: str, tokens: int) -> None:
        self.client = client
        self.base_url = base_url
        self.model = model
        self.tokens = tokens
        self.count = 0  # output chunks received, over all streams
        self.streams = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> _Probe:
        self._task = asyncio.create_task(self._run())
        await self.wait_tokens(self.count + 4)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_tokens(self, count: int, timeout_s: float = 120.0) -> None:
        """Until `count` output chunks have arrived in all (raises what ended the probe, if it failed)."""
        deadline = time.perf_counter() + timeout_s
        while self.count < count:
            if self._task is not None and self._task.done():
                self._task.result()
                raise RuntimeError("the probe stream stopped")
            self._changed.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError(f"the probe stream stalled at {self.count} tokens")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    def _on_token(self, *_: float) -> None:
        self.count += 1
        self._changed.set()

    async def _run(self) -> None:
        failures = 0
        while True:  # a stream ends after `tokens`; the next one starts at once
            self.streams += 1
            try:
                await self._stream()
                failures = 0
            except httpx.TransportError as exc:
                # A connection the server dropped as the last stream ended (seen on the loaded CPU, rarely): a new
                # stream on a new one. Rounds the restart overlapped are discarded (`streams` changed). A server
                # that is gone fails again at once: then this is what ends the probe.
                failures += 1
                if failures > TRANSPORT_RETRIES:
                    raise
                log.info("fidelity: the probe stream failed (%s: %s); a new one", type(exc).__name__, exc)

    async def _stream(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": text_of_tokens(12, 10_000 + self.streams)}],
            "max_tokens": self.tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
        }
        started = time.perf_counter()
        async with self.client.stream("POST", f"{self.base_url}/chat/completions", json=body) as response:
            response.raise_for_status()
            observer = StreamObserver(started, time.perf_counter, self._on_token, self._on_token)
            async for chunk in response.aiter_raw():
                observer.feed(chunk)
            observer.close()


async def _prompt_tokens(client: httpx.AsyncClient, base_url: str, body: dict[str, Any]) -> int:
    answer = await client.post(f"{base_url}/chat/completions", json={**body, "max_tokens": 1})
    answer.raise_for_status()
    return int(answer.json()["usage"]["prompt_tokens"])


async def _text_body(
    client: httpx.AsyncClient, base_url: str, model: str, tokens: int, seed: int, first_word: str
) -> tuple[dict[str, Any], int]:
    """A chat body whose prompt is `tokens` tokens (to within a few), found by counting with vLLM; its first word
    is `first_word`, shaped like the unique first word each injection puts there."""
    words = tokens
    body: dict[str, Any] = {}
    counted = 0
    for _ in range(6):
        text = text_of_tokens(words, seed).split(" ")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": " ".join([first_word, *text[1:]])}],
            "temperature": 0,
        }
        counted = await _prompt_tokens(client, base_url, body)
        if abs(counted - tokens) <= 2:
            break
        words = max(1, words + (tokens - counted))
    return body, counted


def _frame_body(model: str, probe: FidelityProbe, index: int, salt: str) -> dict[str, Any]:
    """Frame number `index` of the measurement salted `salt`.

    Its image is drawn from the salt too: a refit (`Run.fit_stand_in`) measures again on the same server, with
    prefix caching on, often at the same frame size and with more filler. Frames drawn from the seed alone came
    back identical there, image and the old filler a prefix of the new, and vLLM's prefix cache skipped their
    encoder and most of their prefill (a tune run measured a frame at -1.1 encoder steps)."""
    import random

    jpeg = camera_frame(probe.frame_width, probe.frame_height, random.Random(f"{probe.seed}:{salt}:fidelity:{index}"))
    body = caption_body(model, jpeg_data_uri(jpeg), 1, "fidelity", filler=filler_text(probe.frame_filler_words, index))
    return {key: body[key] for key in ("model", "messages", "temperature")}


class _Metrics:
    """Reads the engine-stamped counters from vLLM's /metrics."""

    def __init__(self, client: httpx.AsyncClient, base_url: str) -> None:
        self.client = client
        metrics_url = base_url.removesuffix("/v1") + "/metrics"
        # Only the four series read (prometheus_client's filter on vLLM's /metrics/ mount): the whole page costs
        # vLLM's API server ~9 ms of CPU per read on 2 cores, beside the engine it is measuring; two reads per
        # injection.
        filtered_url = f"{metrics_url}/?" + "&".join(
            f"name[]={series}{suffix}" for series in COUNTED for suffix in ("_sum", "_count")
        )
        self.urls = [filtered_url, metrics_url]

    async def counters(self) -> _Counters:
        try:
            answer = await self.client.get(self.urls[0], headers={"accept-encoding": "identity"})
        except httpx.TransportError:
            # Seen twice in ~2,000 reads (RemoteProtocolError on a kept-alive connection, right after the
            # probe's stream ended): a read of counters is safe to repeat, once, on a new connection.
            answer = await self.client.get(self.urls[0], headers={"accept-encoding": "identity", "connection": "close"})
        answer.raise_for_status()
        if "_count" not in answer.text and len(self.urls) > 1:  # a registry the filter cannot serve: whole pages
            self.urls.pop(0)
            return await self.counters()
        return _Counters.parse(answer.text)


@dataclass
class _Bodies:
    """The injected requests' bodies, made before any timing; each text one unique, the prefix cache kept out."""

    frame_tokens: int
    chat_tokens: int
    salt: str
    same_text: dict[str, Any]
    chat: dict[str, Any]
    tiny: dict[str, Any]
    frames: list[dict[str, Any]]
    sent_frames: int = 0

    def next(self, kind: str, attempt: int) -> dict[str, Any]:
        """The body of injection number `attempt`, of `kind`."""
        if kind == "frame":
            body = self.frames[self.sent_frames % len(self.frames)]
            self.sent_frames += 1
            return body
        # Unique text each time, so vLLM's prefix cache cannot skip the prefill.
        base = {"same_text": self.same_text, "chat": self.chat, "tiny": self.tiny}[kind]
        words = base["messages"][0]["content"].split(" ")
        words[0] = f"{WORDS[attempt % len(WORDS)]}{self.salt}{attempt}"
        return {**base, "messages": [{"role": "user", "content": " ".join(words)}]}


async def _bodies(client: httpx.AsyncClient, base_url: str, model: str, probe: FidelityProbe) -> _Bodies:
    """Counts the frame's tokens (which warms the image path, processor and encoder, before anything is timed) and
    sizes a text prompt of as many tokens and the chat prompt."""
    # Every injected text starts with a unique word: a vocabulary word, this run's salt (so an earlier run's
    # texts on the same server, same seed and same words, are not found in the prefix cache) and a counter; the
    # salt draws the frames' images too.
    salt = secrets.token_hex(3)
    frame_tokens = await _prompt_tokens(client, base_url, _frame_body(model, probe, -1, salt))
    shape = f"{WORDS[0]}{salt}10"
    same_body, _ = await _text_body(client, base_url, model, frame_tokens, probe.seed + 1, shape)
    chat_body, chat_tokens = await _text_body(client, base_url, model, probe.chat_prompt_tokens, probe.seed + 2, shape)
    return _Bodies(
        frame_tokens=frame_tokens,
        chat_tokens=chat_tokens,
        salt=salt,
        same_text=same_body,
        chat=chat_body,
        # The shortest prompt there is (the chat template's tokens and one word): nothing to search for.
        tiny={"model": model, "messages": [{"role": "user", "content": "Hi"}], "temperature": 0},
        # One per frame injection and a spare per round for retries: a frame sent twice would find its prompt in
        # vLLM's prefix cache.
        frames=[_frame_body(model, probe, i, salt) for i in range((probe.repeats + probe.warmup_rounds) * 2)],
    )


async def _inject(
    client: httpx.AsyncClient, base_url: str, model: str, probe: FidelityProbe, bodies: _Bodies
) -> tuple[list[Injection], list[float]]:
    """Every kind injected `repeats` times beside the probe: the injections' prefill times, and the plain decode
    step of each quiet stretch before one."""
    metrics = _Metrics(client, base_url)
    injections: list[Injection] = []
    quiet: list[float] = []
    async with _Probe(client, base_url, model, probe.probe_tokens) as stream:
        await stream.wait_tokens(stream.count + probe.settle_tokens)
        attempt = 0
        for repeat in range(-probe.warmup_rounds, probe.repeats):  # negative: warm-up rounds, not kept
            for kind in KINDS:
                failures = 0
                while True:
                    attempt += 1
                    body = bodies.next(kind, attempt)
                    streams = stream.streams
                    try:
                        q0 = await metrics.counters()
                        await stream.wait_tokens(stream.count + probe.settle_tokens)
                        q1 = await metrics.counters()
                        answer = await client.post(f"{base_url}/chat/completions", json={**body, "max_tokens": 1})
                        answer.raise_for_status()
                        q2 = await metrics.counters()
                    except httpx.TransportError as exc:
                        # A dropped connection (see _Probe._run): this round again, on a new one; its counters
                        # are read anew, so a half-done injection is never counted.
                        failures += 1
                        if failures > TRANSPORT_RETRIES:
                            raise
                        log.info("fidelity: an injection failed (%s: %s); again", type(exc).__name__, exc)
                        continue
                    # vLLM records a request's prefill time when it finishes: exactly one did (the probe
                    # goes on), and no new probe stream started, whose first token is not a gap.
                    if stream.streams != streams or q2.prefill[1] - q1.prefill[1] != 1:
                        continue
                    if q1.itl[1] > q0.itl[1]:
                        quiet.append((q1.itl[0] - q0.itl[0]) / (q1.itl[1] - q0.itl[1]))
                    if repeat >= 0:
                        prompt = int(answer.json()["usage"]["prompt_tokens"])
                        injections.append(Injection(kind, prompt, q2.prefill[0] - q1.prefill[0], repeat))
                    break
    return injections, quiet


def _costs(injections: list[Injection], step_s: float, probe: FidelityProbe) -> dict[str, float]:
    """The three figures in decode steps; each injection's `extra_s` and `steps` are filled in on the way."""
    reference_s = _low([i.prefill_s for i in injections if i.kind == "tiny"])
    for item in injections:
        # Steps beyond the first that its prompt's chunks took (each one a whole step for the probe too).
        chunks = math.ceil(item.prompt_tokens / max(1, probe.budget - 1)) if probe.budget else 1
        item.extra_s = item.prefill_s - reference_s - (chunks - 1) * step_s
        item.steps = item.extra_s / step_s
    # The lower quartile, not the median: on a shared machine interference only ever adds time, and a step
    # that another process slowed down is not what the stand-in costs.
    by_kind = {kind: _low([i.steps for i in injections if i.kind == kind]) for kind in KINDS}
    return {
        "frame_encoder_steps": encoder_steps(injections),
        "frame_prefill_steps": by_kind["same_text"],
        "chat_prefill_steps": by_kind["chat"],
    }


def encoder_steps(injections: Sequence[Injection]) -> float:
    """A frame's cost beyond its same-length text's, in decode steps: the median of the differences within a round.

    The encoder is a small difference of two larger costs. Subtracting the two kinds' lower quartiles (as
    measured once) let the noise of each, about a decode step per injection on 2 shared cores, decide the
    figure: the same stand-in measured 1.23, 1.56 and -1.0 steps. A frame and its text run back to back, so
    their difference cancels whatever slowed the machine that second, and the median drops the rounds a stall
    hit one of them.
    """
    frames = {i.round: i.steps for i in injections if i.kind == "frame"}
    texts = {i.round: i.steps for i in injections if i.kind == "same_text"}
    paired = [frames[r] - texts[r] for r in sorted(frames.keys() & texts.keys())]
    if not paired:
        raise ValueError("no round with both a frame and its same-length text")
    return statistics.median(paired)


async def measure_async(
    base_url: str,
    model: str,
    target: FidelityTarget,
    probe: FidelityProbe = FidelityProbe(),
    tolerance: float = DEFAULT_TOLERANCE,
) -> FidelityResult:
    """Measure the three costs on the vLLM at `base_url` (its /v1) and judge them against `target`.

    The server must be otherwise idle: other traffic would be counted as the injections' cost.
    """
    started = time.perf_counter()
    async with httpx.AsyncClient(
        timeout=httpx.Timeout(300.0, connect=10.0),
        # Idle connections are closed before vLLM's 5 s keep-alive timeout would close them under a request.
        limits=httpx.Limits(keepalive_expiry=4),
    ) as client:
        bodies = await _bodies(client, base_url, model, probe)
        injections, quiet = await _inject(client, base_url, model, probe, bodies)
    if not quiet:
        raise RuntimeError("no quiet stretch to measure the decode step from")
    step_s = statistics.median(quiet)
    spread = spread_of(quiet)
    measured = _costs(injections, step_s, probe)
    ratios, within = judge(measured, target, tolerance)
    return FidelityResult(
        target=target,
        probe=probe,
        step_ms=step_s * 1000,
        frame_prompt_tokens=bodies.frame_tokens,
        chat_prompt_tokens=bodies.chat_tokens,
        measured=measured,
        ratio=ratios,
        within=within,
        tolerance=tolerance,
        faithful=all(within.values()) and spread <= STEADY_SPREAD,
        step_spread=spread,
        steady=spread <= STEADY_SPREAD,
        injections=[
            {
                "kind": i.kind,
                "prompt_tokens": i.prompt_tokens,
                "prefill_ms": round(i.prefill_s * 1000, 3),
                "extra_ms": round(i.extra_s * 1000, 3),
                "steps": round(i.steps, 3),
            }
            for i in injections
        ],
        wall_s=time.perf_counter() - started,
    )


def measure(
    base_url: str,
    model: str,
    target: FidelityTarget,
    probe: FidelityProbe = FidelityProbe(),
    tolerance: float = DEFAULT_TOLERANCE,
) -> FidelityResult:
    """`measure_async` from synchronous code, its thread real-time where allowed: the probe stream's gaps are the
    figures, and a fair-scheduled reader's own waits for a core would be in them (common.client_priority)."""
    with realtime_thread():
        return asyncio.run(measure_async(base_url, model, target, probe, tolerance))


def report_lines(result: FidelityResult) -> list[str]:
    """A small table: figure, target, measured, ratio, verdict."""
    lines = [
        f"stand-in fidelity against {result.target.source} (decode step {result.step_ms:.2f} ms here; "
        f"frame prompt {result.frame_prompt_tokens} tokens, chat prompt {result.chat_prompt_tokens} tokens; "
        f"tolerance +-{result.tolerance:.0%}; decode step spread {result.step_spread:.2f}"
        f"{'' if result.steady else ', TOO BUSY: not judged'})",
        f"{'figure (decode steps)':<24}{'target':>9}{'measured':>10}{'ratio':>8}  ok",
    ]
    for name in FIGURES:
        ratio = result.ratio[name]
        lines.append(
            f"{name:<24}{getattr(result.target, name):>9.2f}{result.measured[name]:>10.2f}"
            f"{'-' if ratio is None else f'{ratio:.2f}':>8}  {'yes' if result.within[name] else 'NO'}"
        )
    return lines


def to_json(result: FidelityResult) -> str:
    return json.dumps(result.to_dict(), indent=2)


def target_for(profile: str, gpu_class: str, models_dir: Any = None) -> FidelityTarget:
    """The cost model's batch-1 figures for `profile` (a models/ profile name) on `gpu_class`."""
    from pathlib import Path

    from visioncap.config.profiles import load_profile
    from visioncap.serve.costmodel import for_profile

    folder = Path(models_dir) if models_dir is not None else Path(__file__).resolve().parents[3] / "models"
    cost = for_profile(load_profile(profile, folder), gpu_class)
    if cost.frame_encoder_steps is None or cost.frame_prefill_steps is None:
        raise LookupError(f"{profile} has no vision encoder in the cost model: no frame figures to match")
    return FidelityTarget(
        frame_encoder_steps=cost.frame_encoder_steps[0],
        frame_prefill_steps=cost.frame_prefill_steps[0],
        chat_prefill_steps=cost.chat_prefill_steps[0],
        source=f"cost model: {profile} on {gpu_class}",
    )


def gate_goals(goals: dict[str, Any], fidelity: FidelityResult | None) -> dict[str, Any]:
    """Goals with the stand-in's fidelity added; when the stand-in is off target no other goal is judged.

    A goal met on a stand-in that does not cost what the target costs says nothing about the target, so its
    `met` becomes None and `not_judged` says why (the value stays, for the record).
    """
    if fidelity is None:
        return goals
    gated: dict[str, Any] = {}
    for name, figure in (("encoder", "frame_encoder_steps"), ("prefill", "frame_prefill_steps")):
        gated[f"stand_in_fidelity_{name}"] = {
            "value": fidelity.ratio[figure],
            "goal": f"measured/target within 1 +- {fidelity.tolerance:g} ({fidelity.target.source})",
            "met": fidelity.within[figure] and fidelity.steady,
        }
    reason = None
    if not fidelity.steady:
        reason = f"machine too busy while measuring the stand-in (step spread {fidelity.step_spread:.2f})"
    elif not fidelity.faithful:
        off = [name for name, ok in fidelity.within.items() if not ok]
        reason = f"stand-in off target ({', '.join(off)}) against {fidelity.target.source}"
    for name, goal in goals.items():
        gated[name] = goal if reason is None else {**goal, "met": None, "not_judged": reason}
    return gated


def attempt_record(result: FidelityResult) -> dict[str, Any]:
    """One fidelity measurement of a run's start, as results files keep each attempt (a refit makes several)."""
    return {
        "probe": asdict(result.probe),
        "frame_prompt_tokens": result.frame_prompt_tokens,
        "step_ms": result.step_ms,
        "ratio": result.ratio,
        "faithful": result.faithful,
        "steady": result.steady,
    }
