"""`visioncap bench mixed`: interactive chat beside a camera caption flood, four set-ups in one run.

- S0: chat alone, straight to vLLM (the reference every latency ratio is taken against).
- S1: chat + flood, vLLM first-come-first-served (no priorities).
- S2: chat + flood, vLLM `--scheduling-policy priority`, the flood sent with a worse priority.
- S3: chat + flood through the visioncap gateway (its own process): chat on an interactive key, the flood on a
  background key.
- S3-steady: as S3 with the cameras offering 0.75x what S3 served: no frame may expire (408).
- S1-idle / S3-idle: the flood alone (chat idle), direct and through the gateway: caption throughput.
- The frontier (visioncap.bench.mixed.frontier): vLLM alone at other chunk budgets and long-prefill thresholds (one
  server each, `F-priority-*`; the gateway runs on the `gw_long_prefill_threshold` one), the gateway at other
  objective levels (`F-gateway-*`), and for reference vLLM with the cameras throttled by hand (`R-priority-*`).
  The cost model's frame-rate ceilings (visioncap.serve.ceiling) and bootstrap intervals on every p99 ratio go
  with them.
- Gateway overhead: chat alone through the gateway against direct, in alternating blocks (S0 is the direct
  blocks pooled), and single requests one at a time in ABBA pairs.
- A third class (#46), watch rules' questions of one to three frames at `verify_rate_per_s`: V-alone-priority and
  V-alone, the questions alone, one at a time, on S2's and on the gateway's server (their latency alone); S2-alerts,
  S2 with the questions at vLLM priority `alert_priority` (between chat's and the flood's); S3-alerts, S3 with the
  questions on the gateway's alert key, on a gateway of its own (as cold as S3's).

The machine is shared and noisy, so only ratios between set-ups measured in the same run are claims; the
absolute numbers are context. vLLM is started twice (FCFS, then priority), or once with `fcfs_restart=False`
(S1 then runs on the priority server with every request at the same priority, which vLLM orders by arrival).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import random
import time
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from visioncap.bench.common.gateway_proc import GatewayProcess, gateway_config, new_key
from visioncap.bench.common.load import PhaseResult, PhaseSpec, Target, background_held, paired_streams, run_phase_sync
from visioncap.bench.common.machine import machine_facts
from visioncap.bench.common.servers import measured_vllm
from visioncap.bench.common.stats import bootstrap_ratio_interval, percentile, ratio
from visioncap.bench.common.workload import (
    ChatTurn,
    FramePool,
    caption_bodies,
    chat_body,
    chat_schedule,
    filler_text,
    verification_bodies,
)
from visioncap.bench.mixed import consistency
from visioncap.bench.mixed.calibrate import calibrate, tokens_per_word
from visioncap.bench.mixed.frontier import FrontierPoint, frontier
from visioncap.bench.mixed.misses import run_miss_sources
from visioncap.bench.mixed.phase_costs import phase_costs, vllm_pids
from visioncap.bench.mixed.phase_costs import snapshot as cost_snapshot
from visioncap.bench.standin.fidelity import FidelityResult, attempt_record, gate_goals, probe_for, target_for
from visioncap.bench.standin.fidelity import measure as measure_fidelity
from visioncap.bench.standin.fidelity import report_lines as fidelity_lines
from visioncap.bench.standin.sizing import Resized, refit, with_vllm_flag, workload_for, workload_options
from visioncap.config.profiles import ModelProfile, load_profile
from visioncap.gateway.upstream_metrics import gauges_url
from visioncap.serve import VllmServer
from visioncap.serve.ceiling import ceiling, step_of

log = logging.getLogger(__name__)

# The chat issue's goals (#12 item 5), as ratios measured in one run. A p99 ratio is judged on its value where both
# of its phases rest on enough samples (JUDGED_SAMPLES, #12 item 3), else on the upper end of its bootstrap 95 %
# interval.
GOALS = {
    "itl_p99_at_1_25": 1.25,  # S3 chat inter-token p99 / S0
    "ttft_p99_at_1_25": 1.5,  # S3 chat TTFT p99 / S0
    "ceiling_fraction_at_1_25": 0.6,  # S3 captions/s during chat / the deterministic cost-model ceiling
    "idle_throughput": 0.95,  # S3-idle captions/s / S1-idle (work-conserving)
    "frontier_dominance": 1.5,  # the gateway's captions/s / the best vLLM-only configuration at each level
    # #46 item 3, with the third class: chat's objectives as without it, the questions at most twice as slow as
    # alone on the same server, at least this share of the two-class run's captions/s, no question past its deadline.
    "alerts_itl_p99_at_1_25": 1.25,  # S3-alerts chat inter-token p99 / S0
    "alerts_ttft_p99_at_1_25": 1.5,  # S3-alerts chat TTFT p99 / S0
    "verify_p99_over_alone": 2.0,  # S3-alerts question latency p99 / V-alone's
    "alerts_captions_over_two_class": 0.6,  # S3-alerts captions/s / S3's
}
# #12 item 3: "every reported p99 rests on >= 200 chats (TTFT) and >= 5,000 gaps (ITL), or bootstrap 95 %
# intervals with goals judged on the upper bound".
JUDGED_SAMPLES = {"ttft": 200, "itl": 5000}
LEVELS = (1.25, 1.5, 2.0, 3.0)  # chat objectives: inter-token p99 as a multiple of chat alone
OVERHEAD_RESULTS = Path("benchmarks/overhead/overhead.json")
PROBE_INTERVAL_S = 0.5  # every phase's probes (S3's gateway timeline reads them at this pace)


@dataclass
class MixedOptions:
    """Everything `run_mixed` needs; the defaults are the committed run (`quick()` for a short one)."""

    profile: str = "standin"
    models_dir: Path = Path("models")
    server_python: Path = Path(".venv-vllm/bin/python")
    out_dir: Path = Path("benchmarks/mixed")
    work_dir: Path = Path("data/bench-mixed")
    name: str = "mixed"
    seed: int = 0
    duration_s: float = 40.0
    idle_duration_s: float = 35.0
    warmup_s: float = 6.0
    chat_rate_per_s: float = 1.0
    chat_prompt_tokens: tuple[int, int] = (64, 256)
    chat_output_tokens: tuple[int, int] = (16, 64)
    # More than any configuration serves while chat is active, so each shows what it sustains rather than what
    # was offered: at 4/s (the runs up to 2026-12-01) vLLM alone with a long-prefill threshold served all there was.
    flood_rate_per_s: float = 16.0
    flood_max_outstanding: int = 8  # 4 cameras x the caption pipeline's default concurrency (2)
    caption_max_tokens: int = 24
    image_width: int = 640
    image_height: int = 480
    frame_filler_words: int = 0  # text after each frame's image (a sized stand-in's; visioncap.bench.standin.sizing)
    # Frames a caption request carries (an event described from several frames, `VlmCaptioner.describe`); the
    # flood offers flood_rate_per_s requests, each of this many frames; the gateway paces them as that many frames.
    frames_per_caption: int = 1
    cameras: int = 4
    background_priority: int = 10
    # Watch rules' questions (the third class; 0: no phase carries them): this many a second, the n-th of
    # verify_frames[n % len] frames, its answer forced to a fixed one (guided decoding, as the product's verifier
    # asks), within verify_deadline_s (the gateway's alert class's default); at vLLM priority alert_priority where no
    # gateway sets it. An alerts engine waits for its questions: more than verify_max_outstanding at once are dropped.
    verify_rate_per_s: float = 0.5
    verify_frames: tuple[int, ...] = (1, 2, 3)
    verify_max_tokens: int = 64
    verify_deadline_s: float = 20.0
    verify_max_outstanding: int = 4
    alert_priority: int = 5
    verify_alone_rate_per_s: float = 1.0  # V-alone: one question at a time, at most this many a second
    fcfs_restart: bool = True
    # S0 is the direct blocks pooled: the denominator of every judged ratio. Four ABBA pairs of 62 s give each arm
    # 222 chats at 1/s (the seeded arrivals), S3's 230 s 215: both past JUDGED_SAMPLES with some to spare.
    overhead_blocks: int = 8
    overhead_block_s: float = 62.0
    s3_duration_s: float = 230.0
    overhead_pairs: int = 16
    calibration_repeats: int = 5
    gw_max_concurrency: int = 8
    gw_min_concurrency: int = 0
    gw_max_image_tokens: int = 4096
    gw_idle_after_s: float = 5.0
    gw_preempt_window_s: float = 1.5
    # S3-downscale: background images above this many tokens are shrunk by the gateway while chat is active.
    gw_active_max_image_tokens: int | None = 64
    gw_deadline_s: float = 30.0
    gw_interval_s: float = 0.25
    # S3's gateway paces background starts while chat is active (visioncap.config.gateway.PacingConfig);
    # False: the older policy, an adaptive concurrency limit down to gw_min_concurrency.
    gw_pacing: bool = True
    gw_start_per_s: float | None = None  # None: this run's deterministic cost-model ceiling at the 1.25x objective
    gw_min_per_s_fraction: float = 0.25  # the pacing floor, as a fraction of the start rate
    gw_first_token_hold_s: float = 0.25
    # The gateway's process.realtime_priority: on this host vLLM keeps both cores busy, and a fair-scheduled
    # gateway waited for one (chat alone through it: TTFT p99 2.1x direct in the 16:26 run of 2026-12-03).
    gw_realtime_priority: int | None = 10
    # S3-steady: the cameras offer this fraction of what S3 served during chat; no frame may expire.
    steady_fraction: float = 0.75
    bootstrap_resamples: int = 1000
    # The frontier (mixed.frontier). vLLM alone under the full flood, one server each: priority policy at
    # these chunk budgets (besides the profile's, S2), and with --long-prefill-token-threshold at these values
    # (vLLM 0.32 has no encoder-budget flag: it is max_num_batched_tokens). The gateway at these objective
    # levels (besides S3 at 1.25x). For reference, not judged: vLLM priority with the cameras throttled by hand to
    # these offered rates (the flood client spaces frames evenly: pacing by a rate someone has to know).
    frontier_budgets: tuple[int, ...] = (1024, 600)
    frontier_long_prefill_thresholds: tuple[int, ...] = (128,)
    frontier_levels: tuple[float, ...] = (1.5, 2.0, 3.0)
    frontier_rates: tuple[float, ...] = (2.0, 4.0, 8.0)
    # The gateway's frontier phases run this long (None: duration_s): its learnt rate needs model_min_gaps (1,000)
    # inter-token gaps of chat, some 25 s at one chat a second, before the rate may grow in proportion, and the
    # phase should show what the gateway sustains at the level, not only its start.
    frontier_gateway_duration_s: float | None = 100.0
    # The gateway's vLLM: with --long-prefill-token-threshold at this value (the best vLLM-only configuration of
    # the run before, which the gateway should build on, not stand beside), on its own server that also measures
    # vLLM alone with it under the flood. None: the gateway on S2's server (the profile's flags).
    gw_long_prefill_threshold: int | None = 128
    ttft_objective_ms: float | None = None  # None: S0's TTFT p99 x the goal (1.5)
    itl_objective_ms: float | None = None  # None: S0's inter-token p99 x the goal (1.25)
    objective_window_s: float = 10.0
    keep_raw: bool = True
    # The target the stand-in must cost like (visioncap.bench.standin.fidelity), measured at the start of the run;
    # goals are not judged when it is off. None: not measured (and nothing gated).
    fidelity_target: str | None = "qwen2.5-vl-7b"
    fidelity_gpu: str = "h200"
    fidelity_repeats: int = 15
    # Off target at the start: resize the frames and prompts toward it on the server at hand and measure again,
    # at most this many times (visioncap.bench.standin.sizing.refit); the last measurement gates the goals.
    fidelity_refits: int = 2
    warm_frames: int = 48  # frames each new server captions before anything is measured on it

    @classmethod
    def quick(cls, **overrides: Any) -> MixedOptions:
        """About 2-3 minutes: short phases, one vLLM start."""
        values: dict[str, Any] = {
            "name": "mixed-quick",
            "duration_s": 15.0,
            "idle_duration_s": 10.0,
            "warmup_s": 3.0,
            "fcfs_restart": False,
            "overhead_blocks": 2,
            "overhead_block_s": 8.0,
            "s3_duration_s": 15.0,
            "overhead_pairs": 6,
            "calibration_repeats": 3,
            "frontier_budgets": (600,),
            "frontier_long_prefill_thresholds": (),
            "frontier_levels": (2.0,),
            "frontier_rates": (2.0,),
            "frontier_gateway_duration_s": None,
            "gw_long_prefill_threshold": None,
        }
        values.update(overrides)
        return cls(**values)


# -- helpers ----------------------------------------------------------------------------------------------


def with_policy(profile: ModelProfile, policy: str) -> ModelProfile:
    """The profile with vLLM's --scheduling-policy set to `policy`."""
    return with_vllm_flag(profile, "--scheduling-policy", policy)


def as_stand_in(options: MixedOptions, profile: ModelProfile) -> tuple[MixedOptions, ModelProfile]:
    """Options and profile sized for the fidelity target when the profile is a sized stand-in for it: its frame
    size and filler, its chat prompts (the range scaled), its chunk budget. Unchanged otherwise."""
    workload = workload_for(profile, options.fidelity_target, options.fidelity_gpu)
    if workload is None:
        return options, profile
    sized = replace(options, **workload_options(workload, options.chat_prompt_tokens))
    return sized, with_vllm_flag(profile, "--max-num-batched-tokens", str(workload.max_num_batched_tokens))


def max_model_pixels_tokens(profile: ModelProfile) -> int:
    """The profile's largest image in tokens (the builder's --max-pixels / 28^2), for the gateway's estimate."""
    args = profile.build.args if profile.build else []
    if "--max-pixels" in args:
        return max(1, int(args[args.index("--max-pixels") + 1]) // (28 * 28))
    return 1280


def drain(root_url: str, gateway_root: str | None = None, timeout_s: float = 90.0) -> float:
    """Wait until vLLM (and the gateway) hold no request; returns the seconds waited."""
    started = time.monotonic()
    with httpx.Client(timeout=5) as client:
        while time.monotonic() - started < timeout_s:
            busy = 0.0
            with contextlib.suppress(httpx.HTTPError, ValueError):
                for line in client.get(f"{root_url}/metrics").text.splitlines():
                    if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")):
                        busy += float(line.rsplit(" ", 1)[1])
                if gateway_root is not None:
                    busy += background_held(client.get(f"{gateway_root}/healthz").json())
            if busy == 0:
                return time.monotonic() - started
            time.sleep(0.25)
    log.warning("server still busy after %.0f s of draining", timeout_s)
    return time.monotonic() - started


class Run:
    """The state of one benchmark run: options, workload makers, results so far."""

    def __init__(self, options: MixedOptions, profile: ModelProfile) -> None:
        self.options = options
        self.profile = profile
        self.model = profile.served_model_name
        self.frames = FramePool(options.image_width, options.image_height, options.seed)
        self.filler = filler_text(options.frame_filler_words, options.seed)
        self.tokens_per_word = 1.0
        self.phases: dict[str, PhaseResult] = {}
        self.summaries: dict[str, dict[str, Any]] = {}
        self.extra: dict[str, Any] = {}
        self.timeline: list[tuple[str, float]] = []
        self._t0 = time.monotonic()
        self._text_seed = 0
        self.alert_key = new_key()  # the gateways' alert-class key (S3-alerts' questions)

    def resize(self, resized: Resized) -> None:
        """New frame size, filler and chat prompt lengths for every set-up from here on (before any is measured)."""
        low, high = self.options.chat_prompt_tokens
        self.options = replace(
            self.options,
            image_width=resized.frame_width,
            image_height=resized.frame_height,
            frame_filler_words=resized.frame_filler_words,
            chat_prompt_tokens=(max(8, round(low * resized.chat_scale)), max(8, round(high * resized.chat_scale))),
        )
        self.frames = FramePool(self.options.image_width, self.options.image_height, self.options.seed)
        self.filler = filler_text(self.options.frame_filler_words, self.options.seed)

    def fit_stand_in(self, server: VllmServer, target_name: str, gpu: str, refits: int) -> list[FidelityResult]:
        """Does this stand-in cost what the target costs on `server`? When it does not (and the machine was steady
        enough to tell), the workload is resized toward the target (visioncap.bench.standin.sizing.refit) and measured
        again, up to `refits` times. Every measurement, printed and returned; the last one decides."""
        target = target_for(target_name, gpu, self.options.models_dir)
        attempts: list[FidelityResult] = []
        while True:
            o = self.options
            self.mark(
                f"stand-in fidelity against {target_name} on {gpu}: {o.image_width}x{o.image_height} frames, "
                f"{o.frame_filler_words} filler words, chat prompts {o.chat_prompt_tokens}"
            )
            result = measure_fidelity(server.base_url, self.model, target, probe_for(o, o.fidelity_repeats))
            for line in fidelity_lines(result):
                log.info("%s", line)
            earlier = list(attempts)
            attempts.append(result)
            if result.faithful or not result.steady or len(attempts) > refits:
                return attempts
            resized = refit(result, earlier)
            self.mark(f"stand-in off target ({', '.join(resized.changed)}): resized to {asdict(resized)}")
            self.resize(resized)

    def mark(self, what: str) -> None:
        self.timeline.append((what, round(time.monotonic() - self._t0, 1)))
        log.info("[%6.1f s] %s", time.monotonic() - self._t0, what)

    def warm(self, server: VllmServer) -> None:
        """One-off costs of a fresh server (first image, first prompt) out of the measurements; a server that
        cannot answer them fails the run here, before anything is measured."""
        with httpx.Client(timeout=120) as client:
            self.tokens_per_word = tokens_per_word(client, server.root_url, self.model, self.options.seed)
            # Many frames, one at a time, so that no set-up meets a cold image path. (They do not make the fidelity
            # probe's first rounds cheap: it keeps warm-up rounds of its own, FidelityProbe.warmup_rounds.)
            frames = self.frames.take(self.options.warm_frames)
            bodies, _ = caption_bodies(frames, self.model, 4, 1, None, self.filler)
            for body in bodies:
                client.post(
                    f"{server.base_url}/chat/completions", content=body, headers={"content-type": "application/json"}
                ).raise_for_status()
            client.post(
                f"{server.base_url}/chat/completions",
                json={"model": self.model, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 8},
            ).raise_for_status()

    def chat(
        self, target: Target, duration_s: float, warmup_s: float, schedule_seed: int
    ) -> tuple[list[ChatTurn], list[bytes]]:
        o = self.options
        turns = chat_schedule(
            o.chat_rate_per_s,
            duration_s - warmup_s,
            o.chat_prompt_tokens,
            o.chat_output_tokens,
            self.tokens_per_word,
            seed=schedule_seed,
        )
        self._text_seed += 1  # new prompt texts for every phase: nothing is found in the prefix cache
        text_seed = o.seed * 1000 + self._text_seed
        bodies = [json.dumps(chat_body(self.model, t, text_seed)).encode() for t in turns]
        return turns, bodies

    def flood(self, duration_s: float, priority: int | None) -> tuple[list[list[str]], list[bytes], list[str]]:
        """Requests for a phase: their frames (one group a request), encoded bodies and cameras."""
        o = self.options
        per = o.frames_per_caption
        uris = self.frames.take((int(duration_s * o.flood_rate_per_s) + 1) * per)
        bodies, cameras = caption_bodies(
            uris, self.model, o.caption_max_tokens, o.cameras, priority, self.filler, per_request=per
        )
        return [uris[at : at + per] for at in range(0, len(bodies) * per, per)], bodies, cameras

    def questions(self, spec: PhaseSpec, target: Target, rate_per_s: float, priority: int | None) -> list[list[str]]:
        """Watch rules' questions for `spec`'s phase into its verify fields; their frames, one group a request."""
        o = self.options
        count = int(spec.duration_s * rate_per_s) + 1
        frames = list(o.verify_frames)
        uris = self.frames.take(sum(frames[index % len(frames)] for index in range(count)))
        spec.verify_bodies, spec.verify_cameras, spec.verify_frames, groups = verification_bodies(
            uris, self.model, o.verify_max_tokens, o.cameras, priority, frames, self.filler
        )
        spec.verify, spec.verify_rate_per_s, spec.verify_deadline_s = target, rate_per_s, o.verify_deadline_s
        return groups

    def phase(
        self,
        name: str,
        root_url: str,
        chat: Target | None,
        flood: Target | None,
        flood_priority: int | None = None,
        duration_s: float | None = None,
        warmup_s: float | None = None,
        schedule_seed: int | None = None,
        gateway: GatewayProcess | None = None,
        flood_rate_per_s: float | None = None,
        verify: Target | None = None,
        verify_priority: int | None = None,
        verify_alone: bool = False,
    ) -> dict[str, Any]:
        """One measured set-up. `verify`: where watch rules' questions go (at `verify_priority` in their bodies);
        `verify_alone`: one at a time (their latency alone) at verify_alone_rate_per_s."""
        o = self.options
        duration = duration_s if duration_s is not None else o.duration_s
        warmup = warmup_s if warmup_s is not None else o.warmup_s
        spec = PhaseSpec(name, duration, warmup, flood_max_outstanding=o.flood_max_outstanding)
        if chat is not None:
            spec.chat = chat
            seed = schedule_seed if schedule_seed is not None else o.seed
            spec.chat_turns, spec.chat_bodies = self.chat(chat, duration, warmup, seed)
        uris: list[list[str]] = []
        if flood is not None:
            spec.flood = flood
            spec.flood_rate_per_s = flood_rate_per_s if flood_rate_per_s is not None else o.flood_rate_per_s
            uris, spec.flood_bodies, spec.flood_cameras = self.flood(duration + 30, flood_priority)
        questions: list[list[str]] = []
        if verify is not None:
            rate = o.verify_alone_rate_per_s if verify_alone else o.verify_rate_per_s
            questions = self.questions(spec, verify, rate, verify_priority)
            spec.verify_max_outstanding = 1 if verify_alone else o.verify_max_outstanding
        # The same probes at the same pace in every phase, so that no set-up carries more of the benchmark's own
        # load than another: vLLM's two load gauges (its whole page costs its API server ~9 ms a read, the
        # gauges ~2 ms) and, where a gateway runs, its /healthz.
        spec.probe_urls = {"vllm": gauges_url(f"{root_url}/metrics")}
        if gateway is not None:
            spec.probe_urls["gateway"] = f"{gateway.root_url}/healthz"
        spec.probe_interval_s = PROBE_INTERVAL_S
        self.mark(f"{name}: start ({duration:.0f} s)")
        load_before = os.getloadavg()[0]
        vllm = vllm_pids(root_url)
        others = {"gateway": gateway.pid} if gateway is not None and gateway.pid is not None else {}
        with httpx.Client() as client:
            costs_before = cost_snapshot(client, root_url, vllm, others)
            result = run_phase_sync(spec)
            self.frames.give_back([uri for i in result.unsent_flood for uri in uris[i]])
            sent = {question.index for question in result.verifications}
            self.frames.give_back([uri for i, group in enumerate(questions) if i not in sent for uri in group])
            load_after = os.getloadavg()[0]
            drained = drain(root_url, gateway.root_url if gateway is not None else None)
            costs = phase_costs(costs_before, cost_snapshot(client, root_url, vllm, others))
        summary = result.summary()
        summary["loadavg_1m"] = [round(load_before, 2), round(load_after, 2)]
        summary["drain_s"] = round(drained, 1)
        summary["host"] = costs
        summary["offered_per_s"] = round(spec.flood_rate_per_s, 3) if flood is not None else None
        self.phases[name] = result
        self.summaries[name] = summary
        self.mark(f"{name}: done ({_line(summary)})")
        return summary


def _line(summary: dict[str, Any]) -> str:
    parts = []
    chat = summary.get("chat")
    if chat:
        parts.append(
            f"chat n={chat['ok']} ttft p50/p99 {_f(chat['ttft_ms']['p50'])}/{_f(chat['ttft_ms']['p99'])} ms, "
            f"itl p50/p99 {_f(chat['itl_ms']['p50'])}/{_f(chat['itl_ms']['p99'])} ms"
        )
    captions = summary.get("captions")
    if captions:
        parts.append(
            f"captions {_f(captions['throughput_per_s'], 2)}/s, latency p50/p99 "
            f"{_f(captions['latency_ms']['p50'])}/{_f(captions['latency_ms']['p99'])} ms"
        )
    questions = summary.get("verifications")
    if questions:
        parts.append(
            f"questions n={questions['answered']}, latency p50/p99 {_f(questions['latency_ms']['p50'])}/"
            f"{_f(questions['latency_ms']['p99'])} ms, {questions['late']} late"
        )
    return "; ".join(parts)


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# -- the run ----------------------------------------------------------------------------------------------


def measure(options: MixedOptions) -> tuple[dict[str, Any], Run, MixedOptions]:
    """Run every set-up; the results, the run they came from and the options it started with (a stand-in's, when
    the profile serves one); `main.run_mixed` writes them."""
    started = time.monotonic()
    started_at = datetime.now(UTC)
    options, profile = as_stand_in(options, load_profile(options.profile, options.models_dir))
    images = max(options.frames_per_caption, max(options.verify_frames, default=1) if options.verify_rate_per_s else 1)
    if images > 1:
        # The stand-in's own flags take one image a prompt.
        limit = json.dumps({"image": images, "video": 0})
        profile = with_vllm_flag(profile, "--limit-mm-per-prompt", limit)
    options.work_dir.mkdir(parents=True, exist_ok=True)
    run = Run(options, profile)
    _run_setups(run)
    return assemble(run, started_at, time.monotonic() - started), run, options


def _run_setups(run: Run) -> None:
    """Every set-up, each on the server it needs: S1 on an FCFS server when asked for, the rest on a priority
    server, then the budget frontier on a server per budget."""
    if run.options.fcfs_restart:
        _fcfs_setups(run)
    keys = _priority_setups(run)
    if run.options.gw_long_prefill_threshold is not None:
        _threshold_setups(run, keys, run.options.gw_long_prefill_threshold)
    _budget_frontier(run)


def _fcfs_setups(run: Run) -> None:
    """S1 and the flood alone on a first-come-first-served server."""
    o = run.options
    run.mark("starting vLLM, FCFS policy")
    with measured_vllm(with_policy(run.profile, "fcfs"), o.server_python, o.work_dir, "fcfs") as server:
        run.warm(server)
        if o.fidelity_target is not None:  # first, so that every set-up sends the workload it settles on
            run.extra["fidelity"] = _fidelity(run, server)
        direct = Target(server.base_url)
        run.phase("S1", server.root_url, chat=direct, flood=direct)
        run.phase("S1-idle", server.root_url, chat=None, flood=direct, duration_s=o.idle_duration_s)


def _priority_setups(run: Run) -> tuple[str, str]:
    """Calibration, fidelity, then S1 (without an FCFS restart), the overhead pairs, S2, the throttled flood and
    (without `gw_long_prefill_threshold`) everything through the gateway, on one priority-policy server; returns
    the gateway's keys (chat, captions)."""
    o = run.options
    run.mark("starting vLLM, priority policy")
    with measured_vllm(with_policy(run.profile, "priority"), o.server_python, o.work_dir, "priority") as server:
        direct = Target(server.base_url)
        run.warm(server)
        run.mark("calibration: decode step, text prefill, image prefill, each alone")
        run.extra["calibration"] = calibrate(server.base_url, run.model, o.calibration_repeats, o.seed)
        run.mark(f"calibration: {json.dumps(run.extra['calibration'])}")
        if o.fidelity_target is not None and not o.fcfs_restart:
            run.extra["fidelity"] = _fidelity(run, server)
        if not o.fcfs_restart:  # equal priorities on a priority server: vLLM orders them by arrival
            run.phase("S1", server.root_url, chat=direct, flood=direct)
            run.phase("S1-idle", server.root_url, chat=None, flood=direct, duration_s=o.idle_duration_s)
        keys = new_key(), new_key()
        _overhead(run, server, *keys)
        run.phase("S2", server.root_url, chat=direct, flood=direct, flood_priority=o.background_priority)
        if o.verify_rate_per_s > 0:
            _alerts_direct(run, server, "V-alone-priority", "S2-alerts")
        _throttled(run, server, o.background_priority)
        run.extra["gateway_objectives"] = _objectives(run)
        run.extra["ceilings"] = _ceilings(run)
        if o.gw_long_prefill_threshold is None:
            _gateway_setups(run, server, keys)
    return keys


def _gateway_setups(run: Run, server: VllmServer, keys: tuple[str, str]) -> None:
    """Everything through the gateway on `server`, then the flood alone direct (S3-idle's same-server reference)."""
    o = run.options
    objectives = run.extra["gateway_objectives"]
    _gateway_s3(run, server, keys, objectives)
    if o.verify_rate_per_s > 0:
        _gateway_alerts(run, server, keys, objectives)
    _gateway_frontier(run, server, keys)
    if o.gw_active_max_image_tokens is not None:
        _gateway_downscale(run, server, keys, objectives, o.gw_active_max_image_tokens)
    if o.fcfs_restart or o.gw_long_prefill_threshold is not None:
        direct = Target(server.base_url)
        run.phase("direct-idle-priority", server.root_url, chat=None, flood=direct, duration_s=o.idle_duration_s)


def _threshold_setups(run: Run, keys: tuple[str, str], threshold: int) -> None:
    """vLLM alone with --long-prefill-token-threshold under the flood, then the gateway on that same server."""
    o = run.options
    name = f"F-priority-lpt{threshold}"
    run.mark(f"starting vLLM, priority policy, --long-prefill-token-threshold {threshold} (the gateway's)")
    profile = with_vllm_flag(with_policy(run.profile, "priority"), "--long-prefill-token-threshold", str(threshold))
    with measured_vllm(profile, o.server_python, o.work_dir, name.lower()) as server:
        run.warm(server)
        direct = Target(server.base_url)
        run.phase(name, server.root_url, chat=direct, flood=direct, flood_priority=o.background_priority)
        _gateway_setups(run, server, keys)


def _through(gateway: GatewayProcess, keys: tuple[str, str]) -> tuple[Target, Target]:
    """Chat and captions sent through the gateway, each with its own key."""
    chat_key, caption_key = keys
    return (
        Target(gateway.base_url, {"authorization": f"Bearer {chat_key}"}),
        Target(gateway.base_url, {"authorization": f"Bearer {caption_key}"}),
    )


def _gateway_s3(run: Run, server: VllmServer, keys: tuple[str, str], objectives: dict[str, Any]) -> None:
    """S3 through the gateway at the objectives, then at a steady share of what S3 served, then the flood alone."""
    o = run.options
    config = _gateway_config(run, server.base_url, *keys, objectives)
    with GatewayProcess(config, o.work_dir, name="gateway-s3") as gateway:
        run.extra["gateway_config"] = config.model_dump(mode="json", exclude={"keys"})
        chat, captions = _through(gateway, keys)
        run.phase("S3", server.root_url, chat=chat, flood=captions, gateway=gateway, duration_s=o.s3_duration_s)
        run.extra["gateway_metrics_after_s3"] = _gateway_metrics(gateway.metrics_text())
        served = _p(run.summaries["S3"], "captions", "throughput_per_s", "") or 0.0
        run.phase(
            "S3-steady",
            server.root_url,
            chat=chat,
            flood=captions,
            gateway=gateway,
            flood_rate_per_s=max(0.1, o.steady_fraction * served),
        )
        run.phase("S3-idle", server.root_url, chat=None, flood=captions, duration_s=o.idle_duration_s, gateway=gateway)


def _alerts_direct(run: Run, server: VllmServer, alone: str, name: str | None) -> None:
    """The questions alone on `server`, one at a time (their latency alone), then, when `name` is given, S2's load
    with the questions at the alert priority, straight to vLLM."""
    o = run.options
    direct = Target(server.base_url)
    run.phase(
        alone,
        server.root_url,
        chat=None,
        flood=None,
        duration_s=o.idle_duration_s,
        verify=direct,
        verify_priority=o.alert_priority,
        verify_alone=True,
    )
    if name is not None:
        run.phase(
            name,
            server.root_url,
            chat=direct,
            flood=direct,
            flood_priority=o.background_priority,
            verify=direct,
            verify_priority=o.alert_priority,
        )


def _gateway_alerts(run: Run, server: VllmServer, keys: tuple[str, str], objectives: dict[str, Any]) -> None:
    """S3 with the third class, on a gateway of its own (as cold as S3's), after the questions alone on its server."""
    o = run.options
    _alerts_direct(run, server, "V-alone", None)
    config = _gateway_config(run, server.base_url, *keys, objectives)
    with GatewayProcess(config, o.work_dir, name="gateway-s3-alerts") as gateway:
        chat, captions = _through(gateway, keys)
        questions = Target(gateway.base_url, {"authorization": f"Bearer {run.alert_key}"})
        run.phase(
            "S3-alerts",
            server.root_url,
            chat=chat,
            flood=captions,
            gateway=gateway,
            duration_s=o.s3_duration_s,
            verify=questions,
        )
        run.extra["gateway_metrics_after_s3_alerts"] = _gateway_metrics(gateway.metrics_text())


def _gateway_frontier(run: Run, server: VllmServer, keys: tuple[str, str]) -> None:
    """The gateway's frontier: one phase per objective level, each with its own gateway."""
    for level in run.options.frontier_levels:
        at_level = _objectives(run, level)
        levelled = _gateway_config(run, server.base_url, *keys, at_level, level=level)
        with GatewayProcess(levelled, run.options.work_dir, name=f"gateway-{level:g}x") as gateway:
            chat, captions = _through(gateway, keys)
            run.phase(
                f"F-gateway-{level:g}x",
                server.root_url,
                chat=chat,
                flood=captions,
                gateway=gateway,
                duration_s=run.options.frontier_gateway_duration_s,
            )
            frontier_metrics = run.extra.setdefault("gateway_metrics_frontier", {})
            frontier_metrics[f"F-gateway-{level:g}x"] = _gateway_metrics(gateway.metrics_text())


def _gateway_downscale(
    run: Run, server: VllmServer, keys: tuple[str, str], objectives: dict[str, Any], max_image_tokens: int
) -> None:
    """S3 again with the gateway shrinking images while chat is active."""
    small = _gateway_config(run, server.base_url, *keys, objectives, max_image_tokens)
    with GatewayProcess(small, run.options.work_dir, name="gateway-s3-downscale") as gateway:
        chat, captions = _through(gateway, keys)
        run.phase("S3-downscale", server.root_url, chat=chat, flood=captions, gateway=gateway)
        run.extra["gateway_metrics_after_s3_downscale"] = _gateway_metrics(gateway.metrics_text())


def _budget_frontier(run: Run) -> None:
    """S2's workload on a priority server per step budget and per long-prefill threshold."""
    o = run.options
    for flag, values, label in (
        ("--max-num-batched-tokens", o.frontier_budgets, "b"),
        ("--long-prefill-token-threshold", o.frontier_long_prefill_thresholds, "lpt"),
    ):
        for value in values:
            if label == "lpt" and value == o.gw_long_prefill_threshold:
                continue  # measured on the gateway's server
            name = f"F-priority-{label}{value}"
            run.mark(f"starting vLLM, priority policy, {flag} {value}")
            profile = with_vllm_flag(with_policy(run.profile, "priority"), flag, str(value))
            with measured_vllm(profile, o.server_python, o.work_dir, name.lower()) as server:
                run.warm(server)
                direct = Target(server.base_url)
                run.phase(name, server.root_url, chat=direct, flood=direct, flood_priority=o.background_priority)


def _fidelity(run: Run, server: VllmServer) -> FidelityResult:
    """The stand-in fitted on this server (`Run.fit_stand_in`); every attempt kept (`fidelity_attempts`)."""
    o = run.options
    assert o.fidelity_target is not None
    attempts = run.fit_stand_in(server, o.fidelity_target, o.fidelity_gpu, o.fidelity_refits)
    run.extra["fidelity_attempts"] = attempts
    return attempts[-1]


def _overhead(run: Run, server: VllmServer, chat_key: str, caption_key: str) -> None:
    """S0 and the gateway's overhead: chat alone, direct and through a gateway, in ABBA blocks."""
    o = run.options
    config = _gateway_config(run, server.base_url, chat_key, caption_key, {"ttft_p99_ms": 1000, "itl_p99_ms": 1000})
    direct = Target(server.base_url)
    with GatewayProcess(config, o.work_dir, name="gateway-overhead") as gateway:
        through = Target(gateway.base_url, {"authorization": f"Bearer {chat_key}"})
        names: dict[str, list[str]] = {"direct": [], "gateway": []}
        for block in range(o.overhead_blocks):
            pair = block // 2
            order = ("direct", "gateway") if pair % 2 == 0 else ("gateway", "direct")
            arm = order[block % 2]
            name = f"S0-{arm}-{block + 1}"
            target = direct if arm == "direct" else through
            # Both blocks of a pair replay the same arrivals and lengths (different texts).
            run.phase(
                name,
                server.root_url,
                chat=target,
                flood=None,
                duration_s=o.overhead_block_s,
                warmup_s=0.5,
                schedule_seed=o.seed * 100 + 50 + pair,
                # Both arms probe (and count the CPU of) the running gateway, so they carry the same load.
                gateway=gateway,
            )
            names[arm].append(name)
        run.extra["overhead_blocks"] = names
        pool_phases(run, "S0", names["direct"])
        pool_phases(run, "S0-gateway", names["gateway"])
        run.mark(f"overhead: {o.overhead_pairs} single requests each way, ABBA")
        rng = random.Random(f"{o.seed}:pairs")
        pairs: list[tuple[bytes, bytes]] = []
        for index in range(o.overhead_pairs):
            turn = ChatTurn(index, 0.0, max(1, round(128 / run.tokens_per_word)), 32)
            seeds = (rng.randrange(1 << 30), rng.randrange(1 << 30))
            bodies = [json.dumps(chat_body(run.model, turn, s)).encode() for s in seeds]
            pairs.append((bodies[0], bodies[1]))
        measured = asyncio.run(paired_streams(direct, through, pairs))
        drain(server.root_url, gateway.root_url)
        run.extra["overhead_pairs"] = measured
        run.mark("overhead: done")


def pool_phases(run: Run, name: str, parts: list[str]) -> None:
    """A set-up made of several blocks: their samples pooled into one phase result."""
    results = [run.phases[part] for part in parts]
    chats, offset = [], 0
    for result in results:
        for chat in result.chats:
            chats.append(replace(chat, index=chat.index + offset))
        offset += len(result.chats)
    pooled = PhaseResult(
        name,
        sum(r.duration_s - r.warmup_s for r in results),
        0.0,
        chats,
        [],
        0,
        sum(r.wall_s for r in results),
        {},
    )
    summary = pooled.summary()
    summary["blocks"] = parts
    summary["loadavg_1m"] = [run.summaries[p]["loadavg_1m"] for p in parts]
    summary["host"] = pooled_costs([run.summaries[p].get("host") or {} for p in parts])
    run.phases[name] = pooled
    run.summaries[name] = summary
    run.mark(f"{name}: pooled from {', '.join(parts)} ({_line(summary)})")


def pooled_costs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Blocks' `host` costs as one: vLLM's inter-token mean weighted by its counts, CPU seconds summed."""
    counted = [p for p in parts if p.get("vllm_itl_mean_ms") is not None and p.get("vllm_itl_count")]
    count = sum(p["vllm_itl_count"] for p in counted)
    mean = sum(p["vllm_itl_mean_ms"] * p["vllm_itl_count"] for p in counted) / count if count else None
    cpu: dict[str, float] = {}
    for part in parts:
        for group, seconds in (part.get("cpu_s") or {}).items():
            cpu[group] = round(cpu.get(group, 0.0) + seconds, 2)
    return {"vllm_itl_mean_ms": None if mean is None else round(mean, 3), "vllm_itl_count": count, "cpu_s": cpu}


def _throttled(run: Run, server: VllmServer, priority: int | None) -> None:
    """Reference points: vLLM priority with the flood offered at each of `frontier_rates` (a hand-set camera rate)."""
    direct = Target(server.base_url)
    for rate in run.options.frontier_rates:
        run.phase(
            f"R-priority-{rate:g}",
            server.root_url,
            chat=direct,
            flood=direct,
            flood_priority=priority,
            flood_rate_per_s=rate,
        )


def _objectives(run: Run, level: float = GOALS["itl_p99_at_1_25"]) -> dict[str, Any]:
    """The gateway's objectives from S0: inter-token p99 x `level`, TTFT p99 x 1.5 (explicit options win at 1.25)."""
    o = run.options
    s0 = run.summaries["S0"]["chat"]
    main = level == GOALS["itl_p99_at_1_25"]
    ttft = (o.ttft_objective_ms if main else None) or s0["ttft_ms"]["p99"] * GOALS["ttft_p99_at_1_25"]
    itl = (o.itl_objective_ms if main else None) or s0["itl_ms"]["p99"] * level
    return {"ttft_p99_ms": round(ttft, 1), "itl_p99_ms": round(itl, 1), "window_s": o.objective_window_s}


def _ceilings(run: Run) -> dict[str, Any]:
    """The cost model's frame-rate ceilings for this run's chat (visioncap.serve.ceiling), at every level."""
    gaps = [gap for chat in run.phases["S0"].chats for gap in chat.gaps_s]
    fidelity = run.extra.get("fidelity")
    if fidelity is not None:
        frame_steps = fidelity.measured["frame_encoder_steps"] + fidelity.measured["frame_prefill_steps"]
        source = "measured on this server at the start of the run (fidelity: encoder + prefill)"
    else:
        frame_steps = run.extra["calibration"]["image_prefill_over_decode_step"]
        source = "calibration: an image prompt alone, in decode steps"
    step_s = step_of(gaps)
    return {
        "step_ms": round(step_s * 1000, 3),
        "frame_steps": round(frame_steps, 3),
        "frame_steps_source": source,
        "levels": {
            str(level): {
                "deterministic": ceiling(level, step_s, frame_steps).to_dict(),
                "measured": ceiling(level, step_s, frame_steps, gaps).to_dict(),
            }
            for level in LEVELS
        },
    }


def _pacing(run: Run, level: float) -> dict[str, Any]:
    o = run.options
    if not o.gw_pacing:
        return {"enabled": False}
    start = o.gw_start_per_s
    if start is None:
        start = ceiling(
            level, run.extra["ceilings"]["step_ms"] / 1000, run.extra["ceilings"]["frame_steps"]
        ).frames_per_s
    start = max(0.05, float(start))
    return {
        "enabled": True,
        "start_per_s": round(start, 3),
        "min_per_s": round(start * o.gw_min_per_s_fraction, 3),
        "max_per_s": max(round(start, 3), 2 * o.flood_rate_per_s),
        "first_token_hold_s": o.gw_first_token_hold_s,
    }


def _gateway_config(
    run: Run,
    base_url: str,
    chat_key: str,
    caption_key: str,
    objectives: dict[str, Any],
    active_max_image_tokens: int | None = None,
    level: float = GOALS["itl_p99_at_1_25"],
) -> Any:
    o = run.options
    return gateway_config(
        base_url,
        chat_key,
        caption_key,
        o.background_priority,
        objectives=objectives,
        background={
            "max_concurrency": o.gw_max_concurrency,
            "min_concurrency": o.gw_min_concurrency,
            "max_image_tokens_in_flight": o.gw_max_image_tokens,
            "queue_size": 256,
            "deadline_s": o.gw_deadline_s,
            "preempt_window_s": o.gw_preempt_window_s,
            "active_max_image_tokens": active_max_image_tokens,
        },
        controller={"interval_s": o.gw_interval_s, "idle_after_s": o.gw_idle_after_s},
        max_tokens_per_image=max_model_pixels_tokens(run.profile),
        pacing=_pacing(run, level) if "ceilings" in run.extra else None,  # the overhead blocks: no background
        realtime_priority=o.gw_realtime_priority,
        # Declared on every gateway (a class no request uses changes nothing); only S3-alerts sends on its key.
        alert={"key": run.alert_key, "priority": o.alert_priority, "deadline_s": o.verify_deadline_s},
    )


def _gateway_metrics(text: str) -> dict[str, float]:
    """The gateway's controller and rejection counters (sums per series and label set)."""
    keep = (
        "visioncap_gateway_controller_decisions_total",
        "visioncap_gateway_controller_decreases_total",
        "visioncap_gateway_background_starts_per_second",
        "visioncap_gateway_rejections_total",
        "visioncap_gateway_requests_total",
        "visioncap_gateway_background_concurrency_limit",
        "visioncap_gateway_upstream_errors_total",
        "visioncap_gateway_preemptions_total",
        "visioncap_gateway_downscaled_images_total",
        "visioncap_gateway_queue_wait_seconds",
    )
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(keep):
            head, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                values[head] = float(value)
    return values


# -- results ----------------------------------------------------------------------------------------------


def _p(summary: dict[str, Any] | None, section: str, metric: str, stat: str) -> float | None:
    if not summary or not summary.get(section):
        return None
    value = summary[section][metric]
    return value.get(stat) if isinstance(value, dict) else value


def compute_ratios(summaries: dict[str, dict[str, Any]], pairs: list[dict[str, float]]) -> dict[str, Any]:
    s = summaries
    ratios: dict[str, Any] = {}
    for setup in ("S1", "S2", "S3", "S3-steady", "S3-downscale", "S0-gateway", "S2-alerts", "S3-alerts"):
        for metric in ("ttft_ms", "itl_ms"):
            for stat in ("p50", "p99"):
                key = f"{setup.lower().replace('-', '_')}_{metric.removesuffix('_ms')}_{stat}_over_s0"
                ratios[key] = ratio(_p(s.get(setup), "chat", metric, stat), _p(s.get("S0"), "chat", metric, stat))
    tput = "throughput_per_s"
    ratios["s3_idle_throughput_over_s1_idle"] = ratio(
        _p(s.get("S3-idle"), "captions", tput, ""), _p(s.get("S1-idle"), "captions", tput, "")
    )
    ratios["s3_idle_throughput_over_direct_idle_priority"] = ratio(
        _p(s.get("S3-idle"), "captions", tput, ""), _p(s.get("direct-idle-priority"), "captions", tput, "")
    )
    for setup in ("S2", "S3", "S3-steady", "S3-downscale"):
        ratios[f"{setup.lower().replace('-', '_')}_throughput_over_s1"] = ratio(
            _p(s.get(setup), "captions", tput, ""), _p(s.get("S1"), "captions", tput, "")
        )
    # The third class against the same set-up without it, and its questions against themselves alone.
    for setup, two_class, alone in (("S2-alerts", "S2", "V-alone-priority"), ("S3-alerts", "S3", "V-alone")):
        key = setup.lower().replace("-", "_")
        ratios[f"{key}_throughput_over_{two_class.lower()}"] = ratio(
            _p(s.get(setup), "captions", tput, ""), _p(s.get(two_class), "captions", tput, "")
        )
        for stat in ("p50", "p99"):
            ratios[f"{key}_verify_{stat}_over_alone"] = ratio(
                _p(s.get(setup), "verifications", "latency_ms", stat),
                _p(s.get(alone), "verifications", "latency_ms", stat),
            )
    if pairs:
        ttft_ratios = [p["gateway_ttft_s"] / p["direct_ttft_s"] for p in pairs if p["direct_ttft_s"] > 0]
        itl_ratios = [p["gateway_itl_s"] / p["direct_itl_s"] for p in pairs if p["direct_itl_s"] > 0]
        ratios["paired_gateway_ttft_over_direct_median"] = percentile(ttft_ratios, 50)
        ratios["paired_gateway_itl_over_direct_median"] = percentile(itl_ratios, 50)
        ratios["paired_gateway_ttft_added_ms_median"] = percentile(
            [(p["gateway_ttft_s"] - p["direct_ttft_s"]) * 1000 for p in pairs], 50
        )
        ratios["paired_gateway_itl_added_ms_median"] = percentile(
            [(p["gateway_itl_s"] - p["direct_itl_s"]) * 1000 for p in pairs], 50
        )
    return ratios


def intervals(run_phases: dict[str, PhaseResult], resamples: int, seed: int) -> dict[str, Any]:
    """Bootstrap 95 % intervals of the p99 ratios against S0, resampling whole chats (visioncap.bench.common.stats)."""
    s0 = run_phases.get("S0")
    if s0 is None:
        return {}
    found: dict[str, Any] = {}
    for setup, phase in run_phases.items():
        blocks = setup.startswith("S0-") and setup != "S0-gateway"  # the pooled S0-gateway only, not its blocks
        if setup == "S0" or blocks or not phase.chats:
            continue
        key = setup.lower().replace("-", "_")
        for metric, clusters in (("itl", gap_clusters), ("ttft", ttft_clusters)):
            interval = bootstrap_ratio_interval(clusters(phase), clusters(s0), 99, resamples, seed)
            found[f"{key}_{metric}_p99_over_s0"] = None if interval is None else [round(v, 3) for v in interval]
    return found


def gap_clusters(phase: PhaseResult) -> list[list[float]]:
    """Each answered chat's inter-token gaps: the unit a bootstrap resamples."""
    return [c.gaps_s for c in phase.ok_chats() if c.gaps_s]


def ttft_clusters(phase: PhaseResult) -> list[list[float]]:
    """Each answered chat's TTFT, one cluster each."""
    return [[c.ttft_s] for c in phase.ok_chats() if c.ttft_s is not None]


def evaluate_goals(
    ratios: dict[str, Any],
    bounds: dict[str, Any],
    summaries: dict[str, dict[str, Any]],
    ceilings: dict[str, Any] | None,
    overhead: dict[str, Any] | None,
    front: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The goals map of #12 item 7: `{value, goal, met}` under the issue's names; `front`: frontier()'s table."""
    goals: dict[str, Any] = {
        "frontier_dominance": _dominance_goal(front),
        "itl_p99_at_1_25": _p99_goal("itl_p99_at_1_25", "itl", ratios, bounds, summaries),
        "ttft_p99_at_1_25": _p99_goal("ttft_p99_at_1_25", "ttft", ratios, bounds, summaries),
    }
    served = _p(summaries.get("S3"), "captions", "throughput_per_s", "")
    top = None if ceilings is None else ceilings["levels"]["1.25"]["deterministic"]["frames_per_s"]
    goals["ceiling_fraction_at_1_25"] = {
        **_at_least(ratio(served, top), GOALS["ceiling_fraction_at_1_25"]),
        "captions_per_s": served,
        "ceiling_frames_per_s": top,
    }
    goals["no_expired_frames"] = _expired_goal(summaries.get("S3-steady"))
    goals.update(consistency.run_goals(summaries, front))
    goals.update(_alert_goals(ratios, bounds, summaries))
    goals["idle_throughput"] = _at_least(ratios.get("s3_idle_throughput_over_s1_idle"), GOALS["idle_throughput"])
    for name in ("overhead_ttft_p50", "overhead_ttft_p99", "overhead_itl_p99"):
        goals[name] = _overhead_goal(overhead, name)
    return goals


def _alert_goals(
    ratios: dict[str, Any], bounds: dict[str, Any], summaries: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """#46 item 3's goals on S3-alerts (none judged in a run without the third class)."""
    three = summaries.get("S3-alerts")
    questions = (three or {}).get("verifications") or {}
    alone = (summaries.get("V-alone") or {}).get("verifications") or {}
    late = questions.get("late")
    verify = _at_most(ratios.get("s3_alerts_verify_p99_over_alone"), GOALS["verify_p99_over_alone"])
    verify["samples"] = {"S3-alerts": questions.get("answered"), "V-alone": alone.get("answered")}
    return {
        "alerts_itl_p99_at_1_25": _p99_goal("alerts_itl_p99_at_1_25", "itl", ratios, bounds, summaries, "S3-alerts"),
        "alerts_ttft_p99_at_1_25": _p99_goal("alerts_ttft_p99_at_1_25", "ttft", ratios, bounds, summaries, "S3-alerts"),
        "verify_p99_over_alone": verify,
        "alerts_captions_over_two_class": _at_least(
            ratios.get("s3_alerts_throughput_over_s3"), GOALS["alerts_captions_over_two_class"]
        ),
        "no_late_verifications": {
            "value": late,
            "goal": "0 questions answered after their deadline or refused for it (S3-alerts, at the 1.25x objective)",
            "met": None if late is None else late == 0,
            "deadline_s": questions.get("deadline_s"),
        },
    }


def _p99_goal(
    name: str,
    metric: str,
    ratios: dict[str, Any],
    bounds: dict[str, Any],
    summaries: dict[str, dict[str, Any]],
    phase: str = "S3",
) -> dict[str, Any]:
    """Goal `name` for `phase`'s `metric` p99 over S0's: on its value where both rest on JUDGED_SAMPLES, else on its
    95 % interval's upper bound (#12 item 3 allows either); the other judgement is kept beside it."""
    key = f"{phase.lower().replace('-', '_')}_{metric}_p99_over_s0"
    value, interval, limit, need = ratios.get(key), bounds.get(key), GOALS[name], JUDGED_SAMPLES[metric]
    samples = {each: _p(summaries.get(each), "chat", f"{metric}_ms", "n") for each in (phase, "S0")}
    enough = _enough_samples(metric, summaries.get(phase), summaries.get("S0"))
    on_bound = None if interval is None else interval[1] <= limit
    on_value = None if value is None else value <= limit
    unit = "chats" if metric == "ttft" else "gaps"
    return {
        "value": value,
        "interval_95": interval,
        "samples": samples,
        "goal": f"<= {limit} (on the value: S3 and S0 each rest on >= {need} {unit})"
        if enough
        else f"<= {limit} (upper bound: fewer than {need} {unit} in {phase} or S0)",
        "met": on_value if enough else on_bound,
        "met_on_upper_bound": on_bound,
    }


def _enough_samples(metric: str, *summaries: dict[str, Any] | None) -> bool:
    """Every one of `summaries` rests on JUDGED_SAMPLES of `metric` ("ttft": chats, "itl": gaps), so that its p99
    is judged on its value (#12 item 3)."""
    counts = [_p(summary, "chat", f"{metric}_ms", "n") for summary in summaries]
    return all(isinstance(n, int) and n >= JUDGED_SAMPLES[metric] for n in counts)


def _at_least(value: float | None, limit: float) -> dict[str, Any]:
    return {"value": value, "goal": f">= {limit}", "met": None if value is None else value >= limit}


def _at_most(value: float | None, limit: float) -> dict[str, Any]:
    return {"value": value, "goal": f"<= {limit}", "met": None if value is None else value <= limit}


def _dominance_goal(front: dict[str, Any] | None) -> dict[str, Any]:
    """The gateway against the best vLLM-only configuration at every frontier level."""
    dominance: dict[str, Any] = {
        "value": None if not front else {level: row["gateway_over_vllm"] for level, row in front.items()},
        "goal": f">= {GOALS['frontier_dominance']}x the best vLLM-only configuration's captions/s at every level "
        "(or vLLM alone meets none and the gateway delivers > 0)",
        "met": None if not front else all(row["met"] for row in front.values()),
        "judged": "each point's p99 ratios on their values where its phase and S0 rest on >= 200 chats and >= 5,000 "
        "gaps, else on the upper ends of their 95 % intervals (#12 item 3), for vLLM alone and the gateway alike",
    }
    if front:
        dominance["on_point_estimates"] = {
            "value": {level: row["on_values"]["gateway_over_vllm"] for level, row in front.items()},
            "met": all(row["on_values"]["met"] for row in front.values()),
        }
        # Not a pass: a level no configuration can meet says that the run's offer, not the gateway, decides it.
        dominance["unreachable_levels"] = [level for level, row in front.items() if row.get("reachable") is False]
    else:
        dominance["not_judged"] = "no frontier points in this run"
    return dominance


def _expired_goal(steady: dict[str, Any] | None) -> dict[str, Any]:
    """No frame expired (408) while the cameras offered less than S3 served."""
    outcomes = (steady.get("captions") or {}).get("outcomes") if steady else None
    expired = None if outcomes is None else outcomes.get("408", 0)
    return {
        "value": expired,
        "goal": "0 frames answered 408 with the cameras offering less than S3's rate (S3-steady)",
        "met": None if expired is None else expired == 0,
        "offered_per_s": steady.get("offered_per_s") if steady else None,
    }


def _overhead_goal(overhead: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """An overhead goal as `visioncap bench overhead` judged it, when its results are there."""
    found = (overhead or {}).get("goals", {}).get(name)
    if found is None:
        return {"value": None, "goal": "see visioncap bench overhead", "met": None, "not_judged": "no overhead results"}
    return {
        "value": found["value"],
        "interval_95": found.get("interval_95"),
        "goal": f"<= {found['goal']} (upper bound)",
        "met": found.get("met_on_upper_bound"),
        "source": f"{OVERHEAD_RESULTS} (`{(overhead or {}).get('command')}`, vllm bench serve, ABBA)",
    }


def frontier_points(summaries: dict[str, dict[str, Any]], bounds: dict[str, Any]) -> list[FrontierPoint]:
    """Every phase with chat and a flood, as a point of its configuration (visioncap.bench.mixed.frontier)."""
    s0 = summaries.get("S0")
    points = []
    for name, summary in summaries.items():
        if not summary.get("chat") or not summary.get("captions") or name == "S0":
            continue
        offered = f"offered {summary.get('offered_per_s')}/s"
        if name == "S1":
            config, setting = "vllm-fcfs", offered
        elif name == "S2":
            config, setting = "vllm-priority", offered
        elif name.startswith("F-priority-"):
            knob = name.removeprefix("F-priority-")
            config, setting = f"vllm-priority-{knob}", offered
        elif name.startswith("R-priority-"):
            config, setting = "throttled-priority", offered
        elif name in ("S3", "S3-steady"):
            config, setting = "gateway", f"objective {GOALS['itl_p99_at_1_25']}x, offered {summary['offered_per_s']}/s"
        elif name.startswith("F-gateway-"):
            config, setting = "gateway", f"objective {name.removeprefix('F-gateway-')}"
        elif name == "S3-downscale":
            config, setting = "gateway-downscale", f"objective {GOALS['itl_p99_at_1_25']}x, images shrunk"
        else:
            continue
        key = name.lower().replace("-", "_")
        itl, ttft = bounds.get(f"{key}_itl_p99_over_s0"), bounds.get(f"{key}_ttft_p99_over_s0")
        points.append(
            FrontierPoint(
                phase=name,
                config=config,
                setting=setting,
                captions_per_s=_p(summary, "captions", "throughput_per_s", ""),
                itl_p99_ratio=ratio(_p(summary, "chat", "itl_ms", "p99"), _p(s0, "chat", "itl_ms", "p99")),
                ttft_p99_ratio=ratio(_p(summary, "chat", "ttft_ms", "p99"), _p(s0, "chat", "ttft_ms", "p99")),
                itl_interval=None if itl is None else (itl[0], itl[1]),
                ttft_interval=None if ttft is None else (ttft[0], ttft[1]),
                itl_on_value=_enough_samples("itl", summary, s0),
                ttft_on_value=_enough_samples("ttft", summary, s0),
            )
        )
    return points


def read_overhead(path: Path = OVERHEAD_RESULTS) -> dict[str, Any] | None:
    """The committed `visioncap bench overhead` results, whose goals the mixed goals map repeats."""
    try:
        results: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return results


def block_pair_ratios(
    summaries: dict[str, dict[str, Any]], blocks: dict[str, list[str]] | None
) -> list[dict[str, Any]]:
    """Gateway / direct p50 per ABBA pair of S0 blocks (same arrivals and lengths): the spread shows the noise."""
    if not blocks:
        return []
    pairs = []
    for direct, through in zip(blocks["direct"], blocks["gateway"], strict=False):
        entry: dict[str, Any] = {"direct": direct, "gateway": through}
        for metric in ("ttft_ms", "itl_ms"):
            entry[f"{metric.removesuffix('_ms')}_p50_ratio"] = ratio(
                _p(summaries.get(through), "chat", metric, "p50"), _p(summaries.get(direct), "chat", metric, "p50")
            )
        # vLLM's own inter-token mean (stamped before any relay): above 1 where vLLM made the tokens slower.
        arms = (("direct", direct), ("gateway", through))
        hosts = {arm: (summaries.get(block) or {}).get("host") or {} for arm, block in arms}
        means = {arm: host.get("vllm_itl_mean_ms") for arm, host in hosts.items()}
        entry["vllm_itl_mean_ratio"] = ratio(means["gateway"], means["direct"])
        entry["cpu_s"] = {arm: host.get("cpu_s") for arm, host in hosts.items()}
        pairs.append(entry)
    return pairs


def gateway_timeline(phase: PhaseResult | None, max_concurrency: int) -> dict[str, Any] | None:
    """From S3's gateway probes (every 0.5 s): how often chat streamed while background ran, and how often the
    cap jumped to max_concurrency (no chat for idle_after_s: work-conserving)."""
    if phase is None or not phase.probes.get("gateway"):
        return None
    samples = [(t, v) for t, v in phase.probes["gateway"] if isinstance(v, dict) and v.get("cap") is not None]
    streams = [(c.sent_at, c.finished_at) for c in phase.chats if c.finished_at is not None]
    chat_samples = [v for t, v in samples if any(start <= t <= end for start, end in streams)]
    jumps = sum(1 for (_, a), (_, b) in itertools.pairwise(samples) if a["cap"] < max_concurrency <= b["cap"])
    return {
        "probe_samples": len(samples),
        "samples_with_chat_streaming": len(chat_samples),
        "of_which_background_in_flight": sum(1 for v in chat_samples if (v.get("in_flight") or 0) > 0),
        "background_in_flight_mean_while_chat": (
            sum(v.get("in_flight") or 0 for v in chat_samples) / len(chat_samples) if chat_samples else None
        ),
        "cap_jumps_to_max_concurrency": jumps,
        # The learnt rate's model as the last probe saw it, and from when it had enough evidence to act.
        "learnt_last": next((v["learnt"] for _, v in reversed(samples) if v.get("learnt")), None),
        "learnt_from_s": next((t for t, v in samples if v.get("learnt")), None),
    }


def assemble(run: Run, started_at: datetime, wall_s: float) -> dict[str, Any]:
    o = run.options
    ratios = compute_ratios(run.summaries, run.extra.get("overhead_pairs", []))
    bounds = intervals(run.phases, o.bootstrap_resamples, o.seed)
    points = frontier_points(run.summaries, bounds)
    front = frontier(points, LEVELS, o.flood_rate_per_s)
    options = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(o).items()}
    return {
        "benchmark": "visioncap bench mixed",
        "command": command_line(o),
        "started_at": started_at.isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "machine": machine_facts(),
        "model": {
            "profile": run.profile.name,
            "served_model_name": run.model,
            "build_args": run.profile.build.args if run.profile.build else None,
            "vllm_args": run.profile.vllm_args,
        },
        "options": options,
        "workload": {
            "tokens_per_word": run.tokens_per_word,
            "jpeg_bytes_mean": sum(run.frames.jpeg_bytes) / max(1, len(run.frames.jpeg_bytes)),
        },
        "calibration": run.extra.get("calibration"),
        "gateway_objectives": run.extra.get("gateway_objectives"),
        "gateway_config": run.extra.get("gateway_config"),
        "gateway_metrics_after_s3": run.extra.get("gateway_metrics_after_s3"),
        "gateway_metrics_frontier": run.extra.get("gateway_metrics_frontier"),
        "gateway_metrics_after_s3_alerts": run.extra.get("gateway_metrics_after_s3_alerts"),
        "setups": run.summaries,
        "overhead_pairs": run.extra.get("overhead_pairs"),
        "overhead_block_pairs": block_pair_ratios(run.summaries, run.extra.get("overhead_blocks")),
        "s3_gateway_timeline": gateway_timeline(run.phases.get("S3"), o.gw_max_concurrency),
        "ratios": ratios,
        "fidelity": run.extra["fidelity"].to_dict() if "fidelity" in run.extra else None,
        "fidelity_attempts": [attempt_record(result) for result in run.extra.get("fidelity_attempts", [])],
        "ceilings": run.extra.get("ceilings"),
        "intervals_95": bounds,
        "frontier": {"points": [p.to_dict() for p in points], "levels": front},
        "goals": gate_goals(
            evaluate_goals(ratios, bounds, run.summaries, run.extra.get("ceilings"), read_overhead(), front),
            run.extra.get("fidelity"),
        ),
        "miss_sources": run_miss_sources(
            {name: phase.raw() for name, phase in run.phases.items()},
            run.summaries,
            run.extra.get("gateway_objectives"),
        ),
        "timeline": run.timeline,
    }


# MixedOptions fields a `bench mixed` flag sets, and the flag: a run's command line names those off their default,
# so that runs of different settings never pass for the same command (`bench mixed-series` compares them).
FLAGS = {
    "profile": "--profile",
    "duration_s": "--duration",
    "chat_rate_per_s": "--chat-rate",
    "flood_rate_per_s": "--flood-rate",
    "flood_max_outstanding": "--flood-max-outstanding",
    "gw_max_concurrency": "--gw-max-concurrency",
    "gw_min_concurrency": "--gw-min-concurrency",
    "gw_idle_after_s": "--gw-idle-after",
    "gw_start_per_s": "--gw-start-per-s",
    "gw_active_max_image_tokens": "--gw-active-max-image-tokens",
    "ttft_objective_ms": "--ttft-objective-ms",
    "itl_objective_ms": "--itl-objective-ms",
    "seed": "--seed",
    "frames_per_caption": "--frames-per-caption",
    "verify_rate_per_s": "--verify-rate",
}
BOOLEAN_FLAGS = {
    "gw_pacing": ("--gw-pacing", "--gw-no-pacing"),
    "fcfs_restart": ("--fcfs-restart", "--no-fcfs-restart"),
}


def command_line(o: MixedOptions) -> str:
    """The `bench mixed` command that runs with these options (the stand-in's refit sizes are the run's own)."""
    quick = o.name == "mixed-quick"
    default = MixedOptions.quick() if quick else MixedOptions()
    words = ["visioncap", "bench", "mixed", *(["--quick"] if quick else [])]
    for name, flag in FLAGS.items():
        value = getattr(o, name)
        if value != getattr(default, name):
            words += [flag, "0" if value is None else f"{value:g}" if isinstance(value, float) else str(value)]
    for name, (on, off) in BOOLEAN_FLAGS.items():
        if getattr(o, name) != getattr(default, name):
            words.append(on if getattr(o, name) else off)
    if tuple(o.verify_frames) != tuple(default.verify_frames):
        words += ["--verify-frames", ",".join(str(count) for count in o.verify_frames)]
    return " ".join(words)
