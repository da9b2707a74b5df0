"""The tuning run: one vLLM start per candidate, the mixed workload against each, the choice.

Each candidate gets a fresh server started from the profile with the candidate's values, a warm-up, and
one measured phase of interactive streaming chat (Poisson arrivals) beside a camera caption flood, the
workload of `visioncap bench mixed` (its code is reused, not copied). The flood is sent direct to vLLM with
a worse priority than chat when the profile runs `--scheduling-policy priority` (what the pipeline's
background class gets), and it offers more frames than the server absorbs, so captions per second is the
server's capacity beside chat. Every candidate replays the same chat arrivals and lengths.

With a stand-in (`StandInTarget`), the candidates are a GPU profile's budgets in its own tokens; each is served
on the CPU stand-in scaled by the stand-in's token ratio, with the stand-in's workload for that GPU class (frames,
filler text, chat prompts that cost what the target's cost there, in decode steps), and the choice is written in
the target's tokens into the target profile, with the cost model's figures for each budget beside the measurement.
Its fidelity is measured first, on the first candidate's server, and an off-target workload is resized and measured
again (`Run.fit_stand_in`, as `bench mixed` does); the budgets follow the frame prompt. A stand-in still off target
after that writes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple, cast

import httpx

from visioncap.bench.common.load import Target
from visioncap.bench.common.machine import hardware, machine_facts
from visioncap.bench.common.servers import measured_vllm
from visioncap.bench.common.stats import bootstrap_interval
from visioncap.bench.mixed.run import MixedOptions, Run, gap_clusters
from visioncap.bench.standin.fidelity import FidelityResult, attempt_record
from visioncap.bench.standin.fidelity import report_lines as fidelity_lines
from visioncap.bench.standin.sizing import stand_in_tokens, workload_for, workload_options
from visioncap.bench.tune.candidates import Candidate, candidate_profile
from visioncap.bench.tune.progress import TuneProgress
from visioncap.config.profiles import ModelProfile, load_profile
from visioncap.config.tuned import TunedMeasurement, TunedObjectives
from visioncap.errors import VisioncapError
from visioncap.serve import VllmServer
from visioncap.serve.launcher import ServerError

log = logging.getLogger(__name__)

# Default objectives, relative to the best candidate of the same run (the gateway goals): the
# highest throughput whose chat tail latency stays within these factors of the best the budgets give.
ITL_FACTOR = 1.25
TTFT_FACTOR = 1.5
BACKGROUND_PRIORITY = 10


class TuneError(VisioncapError):
    """The tuning run could not measure what it needs (e.g. no candidate's server started)."""


@dataclass(frozen=True)
class StandInTarget:
    """A GPU profile tuned on a CPU stand-in: the candidates are in the target's tokens."""

    profile: ModelProfile  # the target, whose gpus.<gpu_class> is written
    gpu_class: str
    token_scale: float  # stand-in tokens per target token (the stand-in's workload for gpu_class)

    def served(self, candidate: Candidate) -> Candidate:
        """The candidate in the stand-in's tokens; a threshold it leaves open is the target's for the class, as
        the target would serve it (the cost model's figures use it too)."""
        threshold = candidate.long_prefill_token_threshold
        if threshold is None:
            threshold = self.profile.serving_for(self.gpu_class).long_prefill_token_threshold
        return Candidate(
            stand_in_tokens(candidate.max_num_batched_tokens, self.token_scale),
            None if threshold is None else stand_in_tokens(threshold, self.token_scale),
        )

    def estimate(self, candidate: Candidate) -> dict[str, float | int | None]:
        """The cost model's figures for the candidate on the target GPU class (rounded for the record)."""
        from visioncap.serve.costmodel import for_profile

        values: dict[str, int] = {"max_num_batched_tokens": candidate.max_num_batched_tokens}
        if candidate.long_prefill_token_threshold is not None:
            values["long_prefill_token_threshold"] = candidate.long_prefill_token_threshold
        cost = for_profile(self.profile.with_serving(self.gpu_class, **values), self.gpu_class)
        decode = cost.decode_ms[cost.workload.typical_batch]
        with_frame, worst = cost.step_with_frame_ms, cost.budget.worst_step_ms
        return {
            "decode_step_ms": round(decode, 2),
            "step_with_frame_ms": None if with_frame is None else round(with_frame, 2),
            "stall_steps": None if with_frame is None else round(with_frame / decode, 2),
            "frames_encoded_per_step": cost.budget.frames_encoded_per_step,
            "worst_step_ms": None if worst is None else round(worst, 2),
            "frame_prefill_steps": cost.budget.frame_prefill_steps,
        }


@dataclass
class TuneOptions:
    """Everything a tuning run needs; `quick_defaults()` for a short one (tests)."""

    profile: str
    gpu_class: str
    candidates: list[Candidate]
    models_dir: Path = Path("models")
    server_python: Path = Path(".venv-vllm/bin/python")
    out_dir: Path = Path("benchmarks/tune")
    work_dir: Path = Path("data/tune")
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    duration_s: float = 40.0
    warmup_s: float = 5.0
    reference_s: float = 20.0
    chat_rate_per_s: float = 1.0
    chat_prompt_tokens: tuple[int, int] = (64, 256)
    chat_output_tokens: tuple[int, int] = (16, 64)
    flood_rate_per_s: float = 12.0
    flood_concurrency: int = 8
    caption_max_tokens: int = 24
    image_width: int = 640
    image_height: int = 480
    frame_filler_words: int = 0  # text after each frame's image (a sized stand-in's; visioncap.bench.standin.sizing)
    seed: int = 0
    write: bool = True
    quick: bool = False
    command: str = ""
    # The model and GPU class the served profile stands in for (visioncap.bench.standin.fidelity): measured on the first
    # candidate's server; when the stand-in is off target nothing is judged and the profile is not written.
    fidelity_target: str | None = None
    fidelity_gpu: str = "h200"
    # An off-target workload is resized toward the target and measured again at most this many times (the load of
    # this shared machine moves its decode step, the unit of every figure, since the stand-in was sized).
    fidelity_refits: int = 2
    # Tune a GPU profile on this (the served) stand-in; the fidelity target is then that profile on its class.
    stand_in_for: StandInTarget | None = None
    # Objectives as `level` x chat alone's inter-token p99 and TTFT_FACTOR x its TTFT p99 (the frontier objective
    # of `bench mixed`), instead of factors of the best candidate; needs the chat-alone reference phase.
    objective_level: float | None = None

    @classmethod
    def quick_defaults(cls) -> dict[str, Any]:
        """About a minute per candidate on 2 CPU cores: short phases."""
        return {"duration_s": 14.0, "warmup_s": 2.0, "reference_s": 8.0, "fidelity_refits": 1, "quick": True}

    def workload_line(self) -> str:
        return (
            f"chat {self.chat_rate_per_s:g}/s (prompts {self.chat_prompt_tokens[0]}-{self.chat_prompt_tokens[1]}, "
            f"outputs {self.chat_output_tokens[0]}-{self.chat_output_tokens[1]} tokens) beside {self.image_width}x"
            f"{self.image_height} frames offered at {self.flood_rate_per_s:g}/s, at most {self.flood_concurrency} "
            f"in flight, {self.caption_max_tokens} tokens each; {self.duration_s:g} s per candidate "
            f"({self.warmup_s:g} s warm-up)"
        )


@dataclass
class CandidateRun:
    candidate: Candidate
    profile_args: list[str]
    summary: dict[str, Any] | None = None
    error: str | None = None
    startup_s: float | None = None
    measurement: TunedMeasurement | None = field(default=None)


class _Steps:
    """One candidate's steps on the progress bar."""

    def __init__(self, report: TuneProgress, total: int) -> None:
        self.report = report
        self.total = total
        self.done = -1  # the first next() starts the first step

    def next(self, description: str) -> None:
        if self.done >= 0:
            self.report.advance()
        self.done += 1
        self.report.step(description)

    def finish(self) -> None:
        for _ in range(self.total - max(self.done, 0)):
            self.report.advance()
        self.done = self.total


def steps_per_candidate() -> int:
    return 3  # start, warm-up, measure (the stop is part of measure)


def first_server_steps(options: TuneOptions) -> int:
    """The first candidate's server also fits the stand-in and measures chat alone, when asked to."""
    return (options.fidelity_target is not None or options.stand_in_for is not None) + (options.reference_s > 0)


def total_steps(options: TuneOptions) -> int:
    return len(options.candidates) * steps_per_candidate() + first_server_steps(options)


def mixed_options(options: TuneOptions) -> MixedOptions:
    """The bench's options carrying the tuning workload, so its Run can build and send it."""
    return MixedOptions(
        profile=options.profile,
        models_dir=options.models_dir,
        server_python=options.server_python,
        out_dir=options.out_dir,
        work_dir=options.work_dir,
        name="tune",
        seed=options.seed,
        duration_s=options.duration_s,
        warmup_s=options.warmup_s,
        chat_rate_per_s=options.chat_rate_per_s,
        chat_prompt_tokens=options.chat_prompt_tokens,
        chat_output_tokens=options.chat_output_tokens,
        flood_rate_per_s=options.flood_rate_per_s,
        flood_max_outstanding=options.flood_concurrency,
        caption_max_tokens=options.caption_max_tokens,
        image_width=options.image_width,
        image_height=options.image_height,
        frame_filler_words=options.frame_filler_words,
    )


def _uses_priority(profile: ModelProfile, gpu_class: str) -> bool:
    return profile.serving_for(gpu_class).scheduling_policy == "priority"


def frame_size(width: int, height: int, max_pixels: int | None) -> tuple[int, int]:
    """The camera frame shrunk (aspect kept) to the profile's largest image, as the pipeline would send it."""
    if max_pixels is None or width * height <= max_pixels:
        return width, height
    scale = (max_pixels / (width * height)) ** 0.5
    return max(28, int(width * scale)), max(28, int(height * scale))


@contextlib.contextmanager
def candidate_server(profile: ModelProfile, options: TuneOptions, label: str) -> Iterator[VllmServer]:
    """vLLM for one candidate, planned for the GPU class as `visioncap serve --gpu CLASS` would."""
    with measured_vllm(profile, options.server_python, options.work_dir, label, options.gpu_class) as server:
        yield server


def measurement(candidate: Candidate, summary: dict[str, Any]) -> TunedMeasurement:
    chat = summary.get("chat") or {}
    captions = summary.get("captions") or {}
    ttft, itl = chat.get("ttft_ms") or {}, chat.get("itl_ms") or {}
    return TunedMeasurement(
        max_num_batched_tokens=candidate.max_num_batched_tokens,
        long_prefill_token_threshold=candidate.long_prefill_token_threshold,
        ttft_p50_ms=_r(ttft.get("p50")),
        ttft_p99_ms=_r(ttft.get("p99")),
        itl_p50_ms=_r(itl.get("p50")),
        itl_p99_ms=_r(itl.get("p99")),
        captions_per_s=_r(captions.get("throughput_per_s"), 3),
        chat_requests=int(chat.get("ok") or 0),
        meets_objectives=False,
    )


def _r(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _clean(summary: dict[str, Any]) -> bool:
    """Every chat answered and no caption refused: numbers from a phase with failures are not comparable."""
    chat = summary.get("chat") or {}
    captions = summary.get("captions") or {}
    outcomes = captions.get("outcomes") or {}
    refused = sum(count for key, count in outcomes.items() if key not in ("200", "cancelled at phase end"))
    return bool(chat.get("ok")) and not chat.get("failed") and refused == 0


def reference_objectives(
    reference: dict[str, Any] | None, level: float, missing_because: str | None = None
) -> TunedObjectives:
    """The frontier objective of `bench mixed`: inter-token p99 at most `level` x chat alone's, TTFT p99 at most
    TTFT_FACTOR x chat alone's. `missing_because`: why there is no reference (None: it was measured)."""
    if reference is None:
        # Not measured at all (the first server failed before its reference phase): say so, not "no latency".
        raise TuneError(
            f"no chat-alone reference was measured ({missing_because or 'no server reached it'}); "
            "the objectives cannot be derived"
        )
    chat = reference.get("chat") or {}
    itl, ttft = (chat.get("itl_ms") or {}).get("p99"), (chat.get("ttft_ms") or {}).get("p99")
    if itl is None or ttft is None:
        counts = ", ".join(f"{key} {chat.get(key)}" for key in ("requests", "ok", "failed", "no_text"))
        raise TuneError(
            f"the chat-alone reference measured no chat latency ({counts or 'no chats'}); "
            "the objectives cannot be derived"
        )
    return TunedObjectives(
        ttft_p99_ms=round(TTFT_FACTOR * ttft, 1),
        itl_p99_ms=round(level * itl, 1),
        ttft_source=f"{TTFT_FACTOR} x chat alone's TTFT p99 ({ttft:.1f} ms)",
        itl_source=f"{level:g} x chat alone's inter-token p99 ({itl:.1f} ms)",
    )


def objectives(measured: list[TunedMeasurement], ttft_ms: float | None, itl_ms: float | None) -> TunedObjectives:
    """Given objectives as they are; missing ones from the best candidate of this run times the factors."""
    itl_values = [m.itl_p99_ms for m in measured if m.itl_p99_ms is not None]
    ttft_values = [m.ttft_p99_ms for m in measured if m.ttft_p99_ms is not None]
    if (itl_ms is None and not itl_values) or (ttft_ms is None and not ttft_values):
        raise TuneError("no candidate measured any chat latency; nothing to derive objectives from")
    return TunedObjectives(
        ttft_p99_ms=ttft_ms if ttft_ms is not None else round(TTFT_FACTOR * min(ttft_values), 1),
        itl_p99_ms=itl_ms if itl_ms is not None else round(ITL_FACTOR * min(itl_values), 1),
        ttft_source="given" if ttft_ms is not None else f"{TTFT_FACTOR} x the lowest TTFT p99 of the candidates",
        itl_source="given" if itl_ms is not None else f"{ITL_FACTOR} x the lowest inter-token p99 of the candidates",
    )


# Caption throughputs closer than this share of the best one's are a tie: frames are offered at a fixed rate, so
# candidates that keep up differ by a frame or two over a phase.
THROUGHPUT_TIE = 0.01


class Chosen(NamedTuple):
    """The candidates marked against the objectives, the index chosen, whether it met them, and the indices the
    measurement could not tell from the best (the chosen one among them)."""

    marked: list[TunedMeasurement]
    chosen: int
    met: bool
    tied: list[int]


def choose(measured: list[TunedMeasurement], clean: list[bool], target: TunedObjectives) -> Chosen:
    """Mark which candidates meet the objectives; pick the highest caption throughput among them. When none does,
    pick the lowest inter-token p99 and say so (False). Either way the measurement may not tell the best from
    others (`tied_with`); the tie goes to `_preferred`."""
    marked = [
        m.model_copy(
            update={
                "meets_objectives": ok
                and m.itl_p99_ms is not None
                and m.ttft_p99_ms is not None
                and m.captions_per_s is not None
                and m.itl_p99_ms <= target.itl_p99_ms
                and m.ttft_p99_ms <= target.ttft_p99_ms
            }
        )
        for m, ok in zip(measured, clean, strict=True)
    ]
    pool, met = _choice_pool(marked)
    tied = tied_with(marked, pool, met)
    return Chosen(marked, min(tied, key=lambda i: _preferred(marked[i])), met, tied)


def _choice_pool(marked: list[TunedMeasurement]) -> tuple[list[int], bool]:
    """The candidates to choose among: those meeting the objectives (True), else every one that measured chat
    inter-token latency (False)."""
    meeting = [i for i, m in enumerate(marked) if m.meets_objectives]
    if meeting:
        return meeting, True
    usable = [i for i, m in enumerate(marked) if m.itl_p99_ms is not None]
    if not usable:
        raise TuneError("no candidate measured chat inter-token latency")
    return usable, False


def tied_with(marked: list[TunedMeasurement], pool: list[int], by_throughput: bool) -> list[int]:
    """The candidates of `pool` the measurement cannot tell from its best: by throughput, those within
    THROUGHPUT_TIE of the highest captions/s and, among them, the inter-token p99s tied as below; by inter-token
    p99, those whose 95 % interval overlaps the lowest one's (without intervals, the lowest alone)."""
    if by_throughput:
        top = max(marked[i].captions_per_s or 0.0 for i in pool)
        pool = [i for i in pool if (marked[i].captions_per_s or 0.0) >= top * (1 - THROUGHPUT_TIE)]
    best = min(pool, key=lambda i: marked[i].itl_p99_ms or 0.0)
    best_interval = marked[best].itl_p99_interval_ms
    if best_interval is None:
        return [best]
    return [
        i
        for i in pool
        if i == best or ((interval := marked[i].itl_p99_interval_ms) is not None and interval[0] <= best_interval[1])
    ]


def _preferred(m: TunedMeasurement) -> tuple[float, float]:
    """Among tied candidates: on a stand-in, the cost model's shortest worst step on the target (the budget that
    lets fewest frames' encoders, never split, share one step when frames arrive together: what evenly offered
    frames do not exercise and a draining backlog does); then the lower inter-token p99."""
    worst_step = (m.estimate or {}).get("worst_step_ms")
    return (float(worst_step) if worst_step is not None else 0.0, m.itl_p99_ms or 0.0)


def margins(marked: list[TunedMeasurement], chosen: int) -> dict[str, Any]:
    """How the choice compares with the worst candidates: the lowest throughput and the highest ITL p99."""
    with_tput = [i for i, m in enumerate(marked) if m.captions_per_s is not None]
    with_itl = [i for i, m in enumerate(marked) if m.itl_p99_ms is not None]
    c = marked[chosen]
    out: dict[str, Any] = {}
    if with_tput:
        worst = min(with_tput, key=lambda i: marked[i].captions_per_s or 0.0)
        w = marked[worst]
        out["lowest_throughput"] = {
            "candidate": _label(w),
            "captions_per_s": w.captions_per_s,
            "chosen_captions_per_s": c.captions_per_s,
            "throughput_gain_pct": _pct(c.captions_per_s, w.captions_per_s),
        }
    if with_itl:
        worst = max(with_itl, key=lambda i: marked[i].itl_p99_ms or 0.0)
        w = marked[worst]
        out["highest_itl_p99"] = {
            "candidate": _label(w),
            "itl_p99_ms": w.itl_p99_ms,
            "chosen_itl_p99_ms": c.itl_p99_ms,
            "itl_p99_reduction_pct": None if not w.itl_p99_ms else _pct(w.itl_p99_ms, c.itl_p99_ms, reduction=True),
        }
    return out


def warnings(runs: list[CandidateRun], offered_rate: bool = False) -> list[str]:
    """What makes a candidate's numbers weaker than they look (`offered_rate`: the flood is offered at a set rate
    on purpose, the frontier's way, so a server that keeps up is the point, not a weakness)."""
    found = []
    for r in runs:
        captions = (r.summary or {}).get("captions") or {}
        if r.summary is not None and not captions.get("dropped_at_client") and not offered_rate:
            # No frame found every slot busy: the server kept up, so captions/s is the offer, not its capacity.
            found.append(
                f"{r.candidate.label}: the flood never filled its slots; captions/s is the offered rate, not the "
                "server's capacity (raise --flood-rate / --flood-concurrency)"
            )
        if r.summary is not None and not _clean(r.summary):
            found.append(f"{r.candidate.label}: requests failed during the phase; it cannot be chosen")
    return found


def _pct(a: float | None, b: float | None, reduction: bool = False) -> float | None:
    if a is None or b is None or (a if reduction else b) <= 0:
        return None
    return round(100 * (a - b) / (a if reduction else b), 1)


def _label(m: TunedMeasurement) -> str:
    return Candidate(m.max_num_batched_tokens, m.long_prefill_token_threshold).label


def run_tune(options: TuneOptions, progress: TuneProgress | None = None) -> dict[str, Any]:
    """Measure every candidate, choose, write the results files (and the profile unless `write` is off)."""
    report = progress or TuneProgress()
    started = time.monotonic()
    started_at = datetime.now(UTC)
    profile = load_profile(options.profile, options.models_dir)
    options = _with_workload(options, profile)
    # Said here, once the workload is what will be sent (a stand-in's replaces the frames and chat prompts).
    report.note(f"workload: {options.workload_line()}")
    options.work_dir.mkdir(parents=True, exist_ok=True)
    measured = _Candidates(options, profile, Run(mixed_options(options), profile), report)
    measured.measure()
    options = measured.options  # with the workload the stand-in's fit settled on
    choice = _judge(options, measured)
    finished_at = datetime.now(UTC)
    results = _results(options, profile, measured, choice, started_at, finished_at, time.monotonic() - started)
    _write(results, options, profile, measured.fidelity, choice, finished_at)
    return results


def _with_workload(options: TuneOptions, profile: ModelProfile) -> TuneOptions:
    """The options with what a stand-in is measured for: its target as the fidelity target, and its sized
    workload (frames, filler, chat prompts; the budgets are swept) as the one sent."""
    target_of = options.stand_in_for
    if target_of is not None:
        options = replace(options, fidelity_target=target_of.profile.name, fidelity_gpu=target_of.gpu_class)
    workload = workload_for(profile, options.fidelity_target, options.fidelity_gpu)
    if workload is not None:
        options = replace(options, **workload_options(workload, options.chat_prompt_tokens))
    elif target_of is not None:
        raise TuneError(
            f"{profile.name} has no stand-in workload for {target_of.profile.name} on {target_of.gpu_class} "
            "(visioncap bench standin --write sizes one)"
        )
    if options.objective_level is not None and options.reference_s <= 0:
        raise TuneError("objectives relative to chat alone need its reference phase (reference_s > 0)")
    return options


class _Candidates:
    """Each candidate measured on a vLLM of its own; the first server also measures the stand-in's fidelity and
    the chat-alone reference."""

    def __init__(self, options: TuneOptions, profile: ModelProfile, run: Run, report: TuneProgress) -> None:
        self.options = options
        self.profile = profile
        self.run = run
        self.report = report
        self.runs: list[CandidateRun] = []
        self.reference: dict[str, Any] | None = None
        self.reference_missing: str | None = None  # why the reference was not measured, when it was not
        self.fidelity: FidelityResult | None = None  # the last of fidelity_attempts, which decides
        self.fidelity_attempts: list[FidelityResult] = []

    def measure(self) -> None:
        for index, candidate in enumerate(self.options.candidates):
            self.runs.append(self._measure(candidate, first=index == 0))

    def _served(self, candidate: Candidate) -> ModelProfile:
        target_of = self.options.stand_in_for
        return candidate_profile(
            self.profile, self.options.gpu_class, target_of.served(candidate) if target_of is not None else candidate
        )

    def _measure(self, candidate: Candidate, first: bool) -> CandidateRun:
        options = self.options
        served = self._served(candidate)
        current = CandidateRun(candidate, served.command_args(options.gpu_class))
        flood_priority = BACKGROUND_PRIORITY if _uses_priority(served, options.gpu_class) else None
        steps = _Steps(self.report, steps_per_candidate() + (first_server_steps(options) if first else 0))
        steps.next(f"{candidate.label}: starting vLLM")
        rescaled = False
        try:
            t0 = time.monotonic()
            with candidate_server(served, options, candidate.label.replace("/", "-")) as server:
                current.startup_s = round(time.monotonic() - t0, 1)
                steps.next(f"{candidate.label}: warm-up")
                self.run.warm(server)
                if first:
                    self._on_first_server(server, candidate, steps)
                    # The fit may move the stand-in's token scale, and with it the candidate's budget in the
                    # stand-in's tokens: this server would no longer serve the candidate.
                    rescaled = self._served(candidate).command_args(options.gpu_class) != current.profile_args
                if not rescaled:
                    steps.next(f"{candidate.label}: chat + camera flood, {options.duration_s:g} s")
                    current.summary = self.run.phase(
                        f"mixed-{candidate.label}",
                        server.root_url,
                        chat=Target(server.base_url),
                        flood=Target(server.base_url),
                        flood_priority=flood_priority,
                    )
        except (ServerError, httpx.HTTPError) as exc:
            current.error = f"{type(exc).__name__}: {str(exc)[:500]}"
            self.report.note(f"[red]{candidate.label}: failed: {current.error.splitlines()[0]}[/]")
            log.debug("candidate %s failed: %s", candidate.label, current.error)
            if first and self.reference is None:
                self.reference_missing = f"{candidate.label}'s server failed before it: {current.error}"
        steps.finish()  # steps a failed candidate did not reach count too, so the bar ends full
        if rescaled:
            self.report.note(f"{candidate.label}: its budget moved with the resized workload; served again")
            self.report.more(steps_per_candidate())
            return self._measure(candidate, first=False)
        if current.summary is not None:
            current.measurement = self._measurement(candidate, current.summary)
            m = current.measurement
            self.report.note(
                f"{candidate.label}: {m.captions_per_s} captions/s, chat ITL p50/p99 {m.itl_p50_ms}/{m.itl_p99_ms} ms,"
                f" TTFT p50/p99 {m.ttft_p50_ms}/{m.ttft_p99_ms} ms"
            )
        return current

    def _on_first_server(self, server: VllmServer, candidate: Candidate, steps: _Steps) -> None:
        options = self.options
        if options.fidelity_target is not None:
            steps.next(f"{candidate.label}: stand-in fidelity against {options.fidelity_target}")
            self.fidelity_attempts = self.run.fit_stand_in(
                server, options.fidelity_target, options.fidelity_gpu, options.fidelity_refits
            )
            self.fidelity = self.fidelity_attempts[-1]
            for line in fidelity_lines(self.fidelity):
                self.report.note(line)
            if len(self.fidelity_attempts) > 1:
                self._settle_workload()
        if options.reference_s > 0:
            steps.next(f"{candidate.label}: chat alone (reference), {options.reference_s:g} s")
            self.reference = self.run.phase(
                "chat-alone",
                server.root_url,
                chat=Target(server.base_url),
                flood=None,
                duration_s=options.reference_s,
                warmup_s=0.5,
                schedule_seed=options.seed + 1,
            )

    def _settle_workload(self) -> None:
        """The options take the workload the fit settled on. A stand-in's budgets follow its frame prompt: they are
        the target's scaled by the frame prompts' ratio (`StandInTarget.token_scale`), so that a frame takes the
        same share of a step's budget on both."""
        sent, first, last = self.run.options, self.fidelity_attempts[0], self.fidelity_attempts[-1]
        self.options = replace(
            self.options,
            image_width=sent.image_width,
            image_height=sent.image_height,
            frame_filler_words=sent.frame_filler_words,
            chat_prompt_tokens=sent.chat_prompt_tokens,
        )
        target_of = self.options.stand_in_for
        if target_of is not None and first.frame_prompt_tokens > 0:
            scale = target_of.token_scale * last.frame_prompt_tokens / first.frame_prompt_tokens
            self.options = replace(self.options, stand_in_for=replace(target_of, token_scale=round(scale, 4)))
        self.report.note(f"workload resized to fit the target: {self.options.workload_line()}")

    def _measurement(self, candidate: Candidate, summary: dict[str, Any]) -> TunedMeasurement:
        """The phase's figures; on a stand-in, with the budget it served and the cost model's on the target."""
        found = measurement(candidate, summary)
        clusters = gap_clusters(self.run.phases[f"mixed-{candidate.label}"])
        interval = bootstrap_interval(clusters, 99, seed=self.options.seed)
        if interval is not None:
            found = found.model_copy(update={"itl_p99_interval_ms": [round(v * 1000, 1) for v in interval]})
        target_of = self.options.stand_in_for
        if target_of is None:
            return found
        return found.model_copy(
            update={
                "served_max_num_batched_tokens": target_of.served(candidate).max_num_batched_tokens,
                "estimate": target_of.estimate(candidate),
            }
        )


@dataclass(frozen=True)
class _Choice:
    """The measured candidates judged against the objectives."""

    measured_runs: list[CandidateRun]
    objectives: TunedObjectives
    marked: list[TunedMeasurement]
    chosen: int
    met: bool | None  # None: not judged
    not_judged: str | None  # why, when the stand-in was off target
    tied: list[str]  # the candidates the measurement could not tell from the best (the chosen one among them)


def _judge(options: TuneOptions, measured: _Candidates) -> _Choice:
    """The objectives (given, from chat alone, or from the best candidate) and the candidate chosen under them;
    each measured run's measurement is marked with whether it met them."""
    measured_runs = [r for r in measured.runs if r.measurement is not None]
    if not measured_runs:
        raise TuneError(
            "no candidate could be measured: " + "; ".join(f"{r.candidate.label}: {r.error}" for r in measured.runs)
        )
    found = [r.measurement for r in measured_runs if r.measurement is not None]
    if options.objective_level is not None:
        target = reference_objectives(measured.reference, options.objective_level, measured.reference_missing)
    else:
        target = objectives(found, options.ttft_p99_ms, options.itl_p99_ms)
    clean = [_clean(r.summary or {}) for r in measured_runs]
    marked, chosen, met, tied_at = choose(found, clean, target)
    tied = [_label(marked[i]) for i in tied_at]
    not_judged = None
    fidelity = measured.fidelity
    if fidelity is not None and not fidelity.faithful:
        # A budget chosen on a stand-in that does not cost what the target costs would be carried to the target.
        not_judged = "stand-in off target or machine too busy: " + "; ".join(fidelity_lines(fidelity)[2:])
    for r, m in zip(measured_runs, marked, strict=True):
        r.measurement = m
    return _Choice(measured_runs, target, marked, chosen, None if not_judged else met, not_judged, tied)


def _results(
    options: TuneOptions,
    profile: ModelProfile,
    measured: _Candidates,
    choice: _Choice,
    started_at: datetime,
    finished_at: datetime,
    wall_s: float,
) -> dict[str, Any]:
    """The results file's content (the files written are added by `_write`)."""
    fidelity, marked, target_of = measured.fidelity, choice.marked, options.stand_in_for
    results: dict[str, Any] = {
        "command": options.command,
        "profile": profile.name,
        "profile_file": str(profile.path) if profile.path else None,
        "gpu_class": options.gpu_class,
        "hardware": hardware(),
        "started_at": started_at.isoformat(timespec="seconds"),
        "finished_at": finished_at.isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "machine": machine_facts(),
        "workload": {
            "line": options.workload_line(),
            "tokens_per_word": measured.run.tokens_per_word,
            "flood_priority": BACKGROUND_PRIORITY if _uses_priority(profile, options.gpu_class) else None,
            **{k: v for k, v in asdict(options).items() if k not in ("candidates", "command", "stand_in_for")},
        },
        "objectives": choice.objectives.model_dump(),
        "objective_level": options.objective_level,
        "stand_in_for": None if target_of is None else _stand_in_record(target_of),
        "reference_chat_alone": measured.reference,
        "candidates": [_candidate_record(r) for r in measured.runs],
        "chosen": marked[choice.chosen].model_dump() | {"label": _label(marked[choice.chosen])},
        # Tied: inter-token p99 intervals overlapping the best one's (and, when candidates met the objectives,
        # captions/s within THROUGHPUT_TIE); the chosen one is the cost model's shortest worst step among them.
        "tied": choice.tied,
        "objectives_met": choice.met,
        "fidelity": fidelity.to_dict() if fidelity is not None else None,
        "fidelity_attempts": [attempt_record(result) for result in measured.fidelity_attempts],
        "not_judged": choice.not_judged,
        "margins": margins(marked, choice.chosen),
        "warnings": warnings(measured.runs, offered_rate=options.objective_level is not None),
    }
    return cast(dict[str, Any], _jsonable(results))


def _stand_in_record(target_of: StandInTarget) -> dict[str, Any]:
    return {
        "profile": target_of.profile.name,
        "profile_file": str(target_of.profile.path) if target_of.profile.path else None,
        "gpu_class": target_of.gpu_class,
        "token_scale": target_of.token_scale,
    }


def _candidate_record(r: CandidateRun) -> dict[str, Any]:
    return {
        "label": r.candidate.label,
        "max_num_batched_tokens": r.candidate.max_num_batched_tokens,
        "long_prefill_token_threshold": r.candidate.long_prefill_token_threshold,
        "vllm_args": r.profile_args,
        "startup_s": r.startup_s,
        "error": r.error,
        "clean": _clean(r.summary) if r.summary else None,
        "measurement": r.measurement.model_dump() if r.measurement else None,
        "summary": r.summary,
    }


def _write(
    results: dict[str, Any],
    options: TuneOptions,
    profile: ModelProfile,
    fidelity: FidelityResult | None,
    choice: _Choice,
    finished_at: datetime,
) -> None:
    """The results JSON and plot, then the tuned profile (the target's, on a stand-in) unless `write` is off,
    fewer than two candidates were measured or the stand-in was off target; `results` says what was written."""
    from visioncap.bench.tune.plot import plot
    from visioncap.bench.tune.write import write_results, write_tuned

    target_of = options.stand_in_for
    stem = f"{profile.name}-{options.gpu_class}"
    if target_of is not None:
        stem = f"{target_of.profile.name}-{target_of.gpu_class}-on-{profile.name}"
    files = {"json": options.out_dir / f"{stem}.json", "png": options.out_dir / f"{stem}.png"}
    options.out_dir.mkdir(parents=True, exist_ok=True)
    results["files"] = {k: str(v) for k, v in files.items()}
    results["profile_written"] = None
    results["complete"] = len(choice.measured_runs) >= 2
    # Results first: a profile that cannot be written must not cost the measurements.
    write_results(results, files["json"])
    plot(results, files["png"])
    # A choice needs a comparison: with one candidate left there is nothing to tune from.
    written, written_class, measured_on = profile.path, options.gpu_class, None
    if target_of is not None:
        written, written_class = target_of.profile.path, target_of.gpu_class
        measured_on = _measured_on(options, profile, target_of, fidelity)
    if options.write and written is not None and results["complete"] and choice.not_judged is None:
        assert choice.met is not None  # judged
        write_tuned(
            written,
            written_class,
            results,
            choice.marked,
            choice.objectives,
            choice.met,
            finished_at,
            options.workload_line(),
            measured_on,
        )
        results["profile_written"] = str(written)
        write_results(results, files["json"])


def _measured_on(
    options: TuneOptions, profile: ModelProfile, target_of: StandInTarget, fidelity: FidelityResult | None
) -> str:
    """How the target's choice was measured: on which stand-in and machine, and how faithfully."""
    scale = target_of.token_scale
    measured_on = f"stand-in {profile.name} on {options.gpu_class} ({hardware()}); its tokens = {scale:g} x these"
    if fidelity is not None:
        ratios = ", ".join(f"{k} {v:.2f}" for k, v in fidelity.ratio.items() if v is not None)
        measured_on += f"; fidelity (measured / target, decode steps): {ratios}"
    return measured_on


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
