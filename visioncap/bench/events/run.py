"""`visioncap bench events`: what an event described from 1, 3 or 6 frames costs, and what the gateway's pacing
does with such requests beside chat (issue 45, item 3).

One vLLM (the tiny random-weight model here: several images a prompt) and one gateway in front of it, as
`visioncap gateway` runs. For each frame count N, every event's frames share one image-token budget
(`caption.events.max_image_tokens`, `caption.encode.encode_frames`: each 1280x720 camera frame shrunk to its share):

- **alone**: N-frame events sent one at a time, directly to vLLM and through the gateway: the image tokens we
  estimate, those vLLM's processor made (its prompt tokens less the text's and each image's two markers), those the
  gateway counted, and the request latency p50 / p99;
- **beside chat**: streaming chat (Poisson, 1/s) through the gateway while cameras offer more frames than it
  serves, packed N to an event: events and frames served per second, event latency, and chat's TTFT and
  inter-token p99 against chat alone through the same gateway. The gateway paces background starts in frames (a
  request of N images spends N starts' credit), so frames/s and chat's latency should hold whatever N is.

What carries to a GPU: the token counts (the same processor grid); latency ratios between frame counts are this
CPU's. The target's cost per event (vision encoder passes and prefill of the shared budget, Qwen2.5-VL-7B on an
H200) comes from the cost model beside them.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from PIL import Image

from visioncap.bench.common.gateway_proc import GatewayProcess, gateway_config, new_key
from visioncap.bench.common.load import PhaseSpec, Target, run_phase_sync
from visioncap.bench.common.machine import machine_facts
from visioncap.bench.common.outputs import RESULTS_DIR, command_line, machine_line, write_results
from visioncap.bench.common.servers import measured_vllm
from visioncap.bench.common.stats import percentile, ratio
from visioncap.bench.common.workload import camera_frame, caption_body, chat_body, chat_schedule
from visioncap.bench.mixed.calibrate import tokens_per_word
from visioncap.bench.mixed.run import drain
from visioncap.caption.encode import encode_frames, image_tokens, jpeg_data_uri
from visioncap.config.caption import DEFAULT_EVENT_PROMPT
from visioncap.config.profiles import load_profile
from visioncap.serve.costmodel import GPU_SPECS, event_cost, shape_for

log = logging.getLogger(__name__)
MODULE = "visioncap.bench.events.run"
# Each image of a Qwen2-VL prompt is wrapped in <|vision_start|> ... <|vision_end|>: two tokens beside its own.
IMAGE_MARKERS = 2
# The event prompt's words and the chat template around them, in the target's tokens (about; the cost model's).
PROMPT_TOKENS = 40


@dataclass(frozen=True)
class EventsOptions:
    """One run's settings; `quick()` is a smoke run of a minute or two."""

    profile: str = "tiny"
    models_dir: Path = Path("models")
    server_python: Path = Path(".venv-vllm/bin/python")
    work_dir: Path = Path("data/bench-events")
    out_dir: Path = RESULTS_DIR
    name: str = "events_multiframe"
    frame_counts: tuple[int, ...] = (1, 3, 6)
    budget_tokens: int = 768  # shared by an event's frames (caption.events.max_image_tokens)
    frame_width: int = 1280
    frame_height: int = 720
    samples: int = 12  # events sent alone per frame count and path
    duration_s: float = 60.0
    warmup_s: float = 5.0
    chat_rate_per_s: float = 1.0
    chat_prompt_tokens: tuple[int, int] = (64, 256)
    chat_output_tokens: tuple[int, int] = (16, 64)
    # Frames the cameras offer per second beside chat, packed N to an event: more than the gateway lets through.
    offered_frames_per_s: float = 6.0
    max_outstanding: int = 8
    max_tokens: int = 24
    target: str = "qwen2.5-vl-7b"
    target_gpu: str = "h200"
    seed: int = 0

    @classmethod
    def quick(cls, **overrides: Any) -> EventsOptions:
        return replace(cls(name="events_multiframe-quick", samples=3, duration_s=12.0, warmup_s=3.0), **overrides)


def event_jpegs(count: int, options: EventsOptions, rng: random.Random) -> list[bytes]:
    """`count` unique camera frames sharing the budget, as the pipeline encodes an event's frames."""
    pictures = []
    for _ in range(count):
        jpeg = camera_frame(options.frame_width, options.frame_height, rng)
        pictures.append(np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"))[:, :, ::-1])
    return [image.jpeg for image in encode_frames(pictures, options.budget_tokens)]


def event_body(model: str, jpegs: list[bytes], max_tokens: int, camera: str) -> dict[str, Any]:
    """An event description request as `VlmCaptioner.describe` sends it (non-streaming, exactly `max_tokens`)."""
    uris = [jpeg_data_uri(jpeg) for jpeg in jpegs]
    return caption_body(model, uris, max_tokens, camera, prompt=DEFAULT_EVENT_PROMPT)


def _estimate(jpegs: list[bytes], token_size: int = 28) -> int:
    return sum(image_tokens(*Image.open(io.BytesIO(jpeg)).size, token_size) for jpeg in jpegs)


def _gateway_image_tokens(gateway: GatewayProcess) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in gateway.metrics_text().splitlines()
        if line.startswith("visioncap_gateway_image_tokens_total{")
    )


def _gauge(gateway: GatewayProcess, name: str) -> float | None:
    for line in gateway.metrics_text().splitlines():
        if line.startswith(name) and not line.startswith("#"):
            return round(float(line.rsplit(" ", 1)[1]), 3)
    return None


def _alone(
    client: httpx.Client, url: str, headers: dict[str, str], bodies: list[dict[str, Any]]
) -> tuple[list[float], list[int]]:
    """Latency (ms) and vLLM's prompt tokens of each body sent alone, one after another."""
    latencies, prompts = [], []
    for body in bodies:
        started = time.perf_counter()
        answer = client.post(f"{url}/chat/completions", json=body, headers=headers)
        answer.raise_for_status()
        latencies.append((time.perf_counter() - started) * 1000)
        prompts.append(int(answer.json()["usage"]["prompt_tokens"]))
    return latencies, prompts


def _p(values: list[float], q: float) -> float | None:
    found = percentile(values, q)
    return None if found is None else round(found, 1)


def target_cost(options: EventsOptions, sizes: list[tuple[int, int]]) -> dict[str, float]:
    """The cost model's figures for the target on its GPU (`costmodel.event_cost`): the frames' encoder passes and
    the prefill of them all."""
    target = load_profile(options.target, options.models_dir)
    cost = event_cost(
        shape_for(target),
        GPU_SPECS[options.target_gpu],
        sizes,
        text_tokens=PROMPT_TOKENS + IMAGE_MARKERS * len(sizes),
        max_pixels=target.image.max_pixels,
    )
    return {
        "image_tokens": cost.image_tokens,
        "encoder_ms": round(cost.encoder_ms, 2),
        "largest_pass_ms": round(cost.largest_pass_ms, 2),
        "prefill_ms": round(cost.prefill_ms, 2),
    }


def measure(options: EventsOptions) -> dict[str, Any]:
    o = options
    rng = random.Random(f"{o.seed}:events")
    profile = load_profile(o.profile, o.models_dir)
    model = profile.served_model_name
    o.work_dir.mkdir(parents=True, exist_ok=True)
    # Paths as given (relative to the repository), the results folder left out: no machine's paths in the file.
    recorded = {key: str(value) if isinstance(value, Path) else value for key, value in asdict(o).items()}
    recorded.pop("out_dir")
    results: dict[str, Any] = {"options": recorded, "machine": machine_facts(), "counts": {}}
    with measured_vllm(profile, o.server_python, o.work_dir, "events") as server, httpx.Client(timeout=300) as client:
        for jpegs in (event_jpegs(1, o, rng) for _ in range(3)):  # the first images' one-off costs
            client.post(f"{server.base_url}/chat/completions", json=event_body(model, jpegs, 4, "warm"))
        text_only = {"model": model, "messages": [{"role": "user", "content": DEFAULT_EVENT_PROMPT}], "max_tokens": 1}
        answer = client.post(f"{server.base_url}/chat/completions", json=text_only).json()
        text_tokens = int(answer["usage"]["prompt_tokens"])
        words = tokens_per_word(client, server.root_url, model, o.seed)
        per_count: dict[int, dict[str, Any]] = {}
        for count in o.frame_counts:
            events = [event_jpegs(count, o, rng) for _ in range(o.samples)]
            bodies = [event_body(model, jpegs, o.max_tokens, f"cam-{n % 4 + 1}") for n, jpegs in enumerate(events)]
            latencies, prompts = _alone(client, server.base_url, {}, bodies)
            estimate = [_estimate(jpegs) for jpegs in events]
            sizes = [Image.open(io.BytesIO(jpeg)).size for jpeg in events[0]]
            per_count[count] = {
                "frames": count,
                "frame_size": list(sizes[0]),
                "image_tokens_estimated": estimate[0],
                "image_tokens_vllm": prompts[0] - text_tokens - IMAGE_MARKERS * count,
                "estimate_matches_vllm": all(
                    p - text_tokens - IMAGE_MARKERS * count == e for p, e in zip(prompts, estimate, strict=True)
                ),
                "prompt_tokens": prompts[0],
                "direct_latency_ms": {"p50": _p(latencies, 50), "p99": _p(latencies, 99)},
                "target": target_cost(o, sizes),
            }
        chat_key, caption_key = new_key(), new_key()
        chat_alone = _chat_phase("chat-direct", o, Target(server.base_url), model, words, None, [])
        s0 = chat_alone.summary()["chat"]
        objectives = {
            "ttft_p99_ms": round(s0["ttft_ms"]["p99"] * 1.5, 1),
            "itl_p99_ms": round(s0["itl_ms"]["p99"] * 1.25, 1),
            "window_s": 10.0,
        }
        config = gateway_config(
            server.base_url,
            chat_key,
            caption_key,
            10,
            objectives=objectives,
            background={"max_concurrency": 8, "queue_size": 256, "deadline_s": 60.0},
            controller={"interval_s": 0.25, "idle_after_s": 5.0},
            max_tokens_per_image=1280,
        )
        phases: dict[str, Any] = {"chat-direct": s0}
        with GatewayProcess(config, o.work_dir, name="gateway-events") as gateway:
            chat = Target(gateway.base_url, {"authorization": f"Bearer {chat_key}"})
            captions = Target(gateway.base_url, {"authorization": f"Bearer {caption_key}"})
            for count in o.frame_counts:
                events = [event_jpegs(count, o, rng) for _ in range(o.samples)]
                bodies = [event_body(model, jpegs, o.max_tokens, f"cam-{n % 4 + 1}") for n, jpegs in enumerate(events)]
                before = _gateway_image_tokens(gateway)
                latencies, _ = _alone(client, captions.base_url, captions.headers, bodies)
                per_count[count]["gateway_latency_ms"] = {"p50": _p(latencies, 50), "p99": _p(latencies, 99)}
                per_count[count]["image_tokens_gateway"] = (_gateway_image_tokens(gateway) - before) / len(bodies)
            drain(server.root_url, gateway.root_url)
            phases["chat-gateway"] = _chat_phase("chat-gateway", o, chat, model, words, None, []).summary()["chat"]
        for count in o.frame_counts:
            # A gateway of its own for each frame count: each starts from the same pacing state, none inherits what
            # the one before learnt.
            with GatewayProcess(config, o.work_dir, name=f"gateway-events-{count}") as gateway:
                chat = Target(gateway.base_url, {"authorization": f"Bearer {chat_key}"})
                captions = Target(gateway.base_url, {"authorization": f"Bearer {caption_key}"})
                offered = int(o.duration_s * o.offered_frames_per_s / count) + 4
                flood = [
                    json.dumps(event_body(model, event_jpegs(count, o, rng), o.max_tokens, f"cam-{n % 4 + 1}")).encode()
                    for n in range(offered)
                ]
                name = f"events-{count}"
                result = _chat_phase(name, o, chat, model, words, captions, flood, o.offered_frames_per_s / count)
                summary = result.summary()
                summary["gateway_starts_per_s_at_end"] = _gauge(
                    gateway, "visioncap_gateway_background_starts_per_second"
                )
                drain(server.root_url, gateway.root_url)
            phases[name] = summary
            served = summary["captions"]["throughput_per_s"] or 0.0
            per_count[count]["beside_chat"] = {
                "events_per_s": round(served, 3),
                "frames_per_s": round(served * count, 3),
                "event_latency_ms": summary["captions"]["latency_ms"],
                "ttft_p99_ms": summary["chat"]["ttft_ms"]["p99"],
                "itl_p99_ms": summary["chat"]["itl_ms"]["p99"],
                # Against chat alone straight to vLLM, as the objectives are (bench mixed's S0).
                "ttft_p99_ratio": _round(ratio(summary["chat"]["ttft_ms"]["p99"], s0["ttft_ms"]["p99"])),
                "itl_p99_ratio": _round(ratio(summary["chat"]["itl_ms"]["p99"], s0["itl_ms"]["p99"])),
                "pacer_frames_per_s_at_end": summary["gateway_starts_per_s_at_end"],
                "chat_ok": summary["chat"]["ok"],
            }
        results["text_prompt_tokens"] = text_tokens
        results["objectives"] = objectives
        results["gateway_config"] = config.model_dump(mode="json", exclude={"keys"})
        results["counts"] = {str(count): figures for count, figures in per_count.items()}
        results["phases"] = phases
    return results


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _chat_phase(
    name: str,
    o: EventsOptions,
    chat: Target,
    model: str,
    words: float,
    flood: Target | None,
    bodies: list[bytes],
    rate: float = 0.0,
) -> Any:
    turns = chat_schedule(
        o.chat_rate_per_s, o.duration_s - o.warmup_s, o.chat_prompt_tokens, o.chat_output_tokens, words, o.seed
    )
    seed = o.seed * 1000 + sum(map(ord, name))  # new prompt texts each phase: nothing from the prefix cache
    spec = PhaseSpec(name, o.duration_s, o.warmup_s, flood_max_outstanding=o.max_outstanding)
    spec.chat, spec.chat_turns = chat, turns  # arrivals after the warm-up (the load generator adds it)
    spec.chat_bodies = [json.dumps(chat_body(model, turn, seed)).encode() for turn in turns]
    if flood is not None:
        spec.flood, spec.flood_rate_per_s, spec.flood_bodies = flood, rate, bodies
        spec.flood_cameras = [f"cam-{n % 4 + 1}" for n in range(len(bodies))]
    log.info("%s: %.0f s", name, o.duration_s)
    return run_phase_sync(spec)


def render(data: dict[str, Any]) -> str:
    o = data["options"]
    lines = [
        "# Events described from several frames: tokens, latency and the gateway's pacing",
        "",
        f"Command: `{data['command']}`",
        "",
        machine_line(data["machine"], f"profile {o['profile']} (vLLM on this CPU)"),
        "",
        f"Each event's frames ({o['frame_width']}x{o['frame_height']} camera frames) share {o['budget_tokens']} image "
        f"tokens (`caption.encode.encode_frames`); {o['samples']} events alone per frame count and path; beside chat "
        f"({o['chat_rate_per_s']:g}/s through the gateway) the cameras offer {o['offered_frames_per_s']:g} frames/s, "
        f"packed N to an event, for {o['duration_s']:g} s ({o['warmup_s']:g} s warm-up), each frame count through a "
        "gateway of its own. Chat's ratios are to chat alone straight to vLLM, as the gateway's objectives (1.5x "
        "TTFT p99, 1.25x inter-token p99).",
        "",
        "| frames | frame size | image tokens: ours / vLLM's / gateway's | alone, direct p50 / p99 ms | "
        "alone, gateway p50 / p99 ms | beside chat: events/s (frames/s) | event latency p50 / p99 ms | "
        "chat TTFT p99 / ITL p99 ms (vs chat alone) | pacer's frames/s at the end | target: encoder (longest pass) + "
        "prefill ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for count, c in data["counts"].items():
        beside = c.get("beside_chat", {})
        latency = beside.get("event_latency_ms") or {}
        target = c["target"]
        lines.append(
            f"| {count} | {c['frame_size'][0]}x{c['frame_size'][1]} | {c['image_tokens_estimated']} / "
            f"{c['image_tokens_vllm']} / {c.get('image_tokens_gateway', 0):.0f} | "
            f"{c['direct_latency_ms']['p50']} / {c['direct_latency_ms']['p99']} | "
            f"{c['gateway_latency_ms']['p50']} / {c['gateway_latency_ms']['p99']} | "
            f"{beside.get('events_per_s')} ({beside.get('frames_per_s')}) | "
            f"{_ms(latency.get('p50'))} / {_ms(latency.get('p99'))} | "
            f"{_ms(beside.get('ttft_p99_ms'))} / {_ms(beside.get('itl_p99_ms'), 1)} "
            f"({beside.get('ttft_p99_ratio')}x / {beside.get('itl_p99_ratio')}x) | "
            f"{beside.get('pacer_frames_per_s_at_end')} | "
            f"{target['encoder_ms']} (longest {target['largest_pass_ms']}) + {target['prefill_ms']} "
            f"({target['image_tokens']} tokens) |"
        )
    s0, g0 = data["phases"]["chat-direct"], data["phases"]["chat-gateway"]
    lines += [
        "",
        f"Chat alone: straight to vLLM TTFT p99 {_ms(s0['ttft_ms']['p99'])} ms, inter-token p99 "
        f"{_ms(s0['itl_ms']['p99'], 1)} ms; through the gateway {_ms(g0['ttft_ms']['p99'])} / "
        f"{_ms(g0['itl_ms']['p99'], 1)} ms ({g0['ok']} chats each); the gateway's objectives: {data['objectives']}.",
        "Every event's estimate equals vLLM's count: "
        + ", ".join(f"{n} frames {'yes' if c['estimate_matches_vllm'] else 'NO'}" for n, c in data["counts"].items())
        + ".",
        "",
        f"Target: {o['target']} on {o['target_gpu']} by the cost model (visioncap.serve.costmodel): each frame's "
        "vision encoder pass summed, and the prefill of the whole prompt. The frames' tokens are the budget's either "
        "way; what several frames add is encoder passes of smaller images, which cost less each.",
        "",
    ]
    return "\n".join(lines)


def _ms(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog=MODULE, description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="three events per count, 12 s phases (~2 min)")
    parser.add_argument("--duration", type=float, help="seconds per phase beside chat (default 45; quick 12)")
    parser.add_argument("--out-dir", type=Path, help="where the results files go (default benchmarks/results)")
    parser.add_argument("--work-dir", type=Path, help="logs and the gateway's config (default data/bench-events)")
    parsed = parser.parse_args(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    overrides: dict[str, Any] = {}
    if parsed.duration is not None:
        overrides["duration_s"] = parsed.duration
    if parsed.out_dir is not None:
        overrides["out_dir"] = parsed.out_dir
    if parsed.work_dir is not None:
        overrides["work_dir"] = parsed.work_dir
    options = EventsOptions.quick(**overrides) if parsed.quick else replace(EventsOptions(), **overrides)
    data = measure(options)
    data["command"] = command_line(MODULE, args)
    write_results(options.name, data, render, options.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
