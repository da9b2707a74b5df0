"""Sizes a CPU stand-in so that it costs, in decode steps, what a target model costs on a GPU class.

What the scheduler and a chat user feel is dimensionless (see `visioncap.bench.standin.fidelity`): a frame's encoder
pass and prompt prefill and a chat prompt's prefill, each in decode steps, and token counts relative to the chunk
budget. A small model on a CPU has other ratios at the target's sizes, so its workload is sized from measurements
of the stand-in, three figures with three knobs:

- prefill cost in decode steps is close to linear in prompt tokens: `a + b * tokens`, fitted to the measured
  frame-sized and chat-sized text prompts of two calibration runs; the frame prompt gets `(P - a) / b` tokens for
  the target's frame prefill P and the chat prompt `(C - a) / b` for its chat prefill C;
- the encoder's cost grows with the image's tokens: `c + d * image tokens`, fitted to the calibration frames;
  the frame gets the size whose image tokens cost the target's encoder steps E, `(E - c) / d`;
- the frame prompt's tokens that the image does not fill are filler text after the image. A CPU's vision tower
  costs more per image token, relative to its decode step, than an H200's (a one-layer tower of width 64 is still
  ~3x too dear at 640x480), so a stand-in frame is a smaller image with text that keeps its prompt as long as the
  cost asks for: the encoder pass and the prefill each cost what the target's do;
- the chunk budget is the target's times the frame prompts' ratio (the same chunks per frame).

The result is checked by measuring it (`visioncap bench standin`, `visioncap bench fidelity`), never assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from visioncap.bench.standin.fidelity import (
    FIGURES,
    FidelityProbe,
    FidelityResult,
    FidelityTarget,
    measure,
    report_lines,
)
from visioncap.config.profiles import ModelProfile, StandInSpec, StandInWorkload
from visioncap.qwen_images import smart_resize

PIXELS_PER_TOKEN_SIDE = 28  # Qwen2-VL: 14-pixel patches, 2x2 merged into one language token


@dataclass(frozen=True)
class CalibrationPoint:
    """One fidelity measurement of the stand-in at one workload size."""

    frame_prompt_tokens: int
    image_tokens: int
    chat_prompt_tokens: int
    frame_encoder_steps: float
    frame_prefill_steps: float
    chat_prefill_steps: float


@dataclass(frozen=True)
class StandInSizes:
    """The stand-in's workload for one target: frame size and filler, chat prompt length, chunk budget."""

    frame_width: int
    frame_height: int
    image_tokens: int
    frame_filler_words: int  # text after the image (about a token a word)
    frame_prompt_tokens: int
    chat_prompt_tokens: int
    max_num_batched_tokens: int
    scale: float  # stand-in frame prompt tokens / target frame prompt tokens
    predicted: FidelityTarget  # what the fits predict at these sizes


def fit_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y against x."""
    if len({x for x, _ in points}) < 2:
        raise ValueError("a line needs points at two different sizes at least")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    return mean_y - slope * mean_x, slope


def image_tokens(width: int, height: int, min_pixels: int = 4 * 28 * 28, max_pixels: int = 1280 * 28 * 28) -> int:
    """Language tokens of a width x height frame after Qwen2-VL's resize."""
    h, w = smart_resize(height, width, PIXELS_PER_TOKEN_SIDE, min_pixels, max_pixels)
    return (h // PIXELS_PER_TOKEN_SIDE) * (w // PIXELS_PER_TOKEN_SIDE)


def frame_for_tokens(tokens: int, aspect: float = 4 / 3) -> tuple[int, int]:
    """A frame of the given aspect whose image tokens come closest to `tokens` (sides multiples of 28)."""
    best: tuple[int, int] | None = None
    for rows in range(1, 200):
        cols = max(1, round(rows * aspect))
        if best is None or abs(rows * cols - tokens) < abs(best[0] * best[1] - tokens):
            best = (rows, cols)
        if rows * cols > tokens * 2:
            break
    assert best is not None
    return best[1] * PIXELS_PER_TOKEN_SIDE, best[0] * PIXELS_PER_TOKEN_SIDE


def stand_in_tokens(target_tokens: int, scale: float) -> int:
    """A target's per-step token count (a chunk budget, a prefill threshold) in the stand-in's tokens: scaled by
    the frame prompts' ratio, rounded up to a multiple of 16 (vLLM's block-friendly sizes)."""
    return max(16, math.ceil(target_tokens * scale / 16) * 16)


def solve(
    target: FidelityTarget,
    target_frame_prompt_tokens: int,
    target_budget: int,
    points: Sequence[CalibrationPoint],
    aspect: float = 4 / 3,
) -> StandInSizes:
    """The stand-in's sizes for `target`, from calibration points measured on the stand-in (frames without
    filler, so each point's prompt beyond its image is the caption text and the chat template)."""
    a, b = fit_line(
        [(p.frame_prompt_tokens, p.frame_prefill_steps) for p in points]
        + [(p.chat_prompt_tokens, p.chat_prefill_steps) for p in points]
    )
    if b <= 0:
        raise ValueError("prefill cost does not grow with prompt length: the calibration is noise")
    c, d = fit_line([(p.image_tokens, p.frame_encoder_steps) for p in points])
    if d <= 0:
        raise ValueError("encoder cost does not grow with image tokens: the calibration is noise")
    text_tokens = round(sum(p.frame_prompt_tokens - p.image_tokens for p in points) / len(points))
    width, height = frame_for_tokens(max(4, round((target.frame_encoder_steps - c) / d)), aspect)
    tokens = image_tokens(width, height)
    frame_prompt = max(tokens + text_tokens, round((target.frame_prefill_steps - a) / b))
    chat = max(8, round((target.chat_prefill_steps - a) / b))
    scale = frame_prompt / target_frame_prompt_tokens
    return StandInSizes(
        frame_width=width,
        frame_height=height,
        image_tokens=tokens,
        frame_filler_words=frame_prompt - tokens - text_tokens,
        frame_prompt_tokens=frame_prompt,
        chat_prompt_tokens=chat,
        max_num_batched_tokens=stand_in_tokens(target_budget, scale),
        scale=scale,
        predicted=FidelityTarget(
            frame_encoder_steps=c + d * tokens,
            frame_prefill_steps=a + b * frame_prompt,
            chat_prefill_steps=a + b * chat,
            source="stand-in calibration fits",
        ),
    )


@dataclass(frozen=True)
class TargetShape:
    """One target on one GPU class: its costs in decode steps, its frame prompt and its chunk budget."""

    gpu: str
    costs: FidelityTarget
    frame_prompt_tokens: int
    budget: int
    chat_prompt_tokens: int  # the cost model's chat prompt, whose prefill `costs` gives


def target_shape(profile: str, gpu: str, models_dir: Path) -> TargetShape:
    """The cost model's figures and the serving plan's budget for `profile` on `gpu`."""
    from visioncap.bench.standin.fidelity import target_for
    from visioncap.config.profiles import load_profile
    from visioncap.serve.costmodel import for_profile
    from visioncap.serve.plan import plan_serving

    loaded = load_profile(profile, models_dir)
    args = plan_serving(loaded, gpu=gpu).args
    budget = int(args[args.index("--max-num-batched-tokens") + 1])
    cost = for_profile(loaded, gpu)
    if cost.frame_prompt_tokens is None:
        raise ValueError(f"{profile} on {gpu}: the cost model has no frame prompt to size the stand-in by")
    return TargetShape(
        gpu, target_for(profile, gpu, models_dir), cost.frame_prompt_tokens, budget, cost.workload.chat_prompt_tokens
    )


def calibration_point(result: FidelityResult) -> CalibrationPoint:
    """A fidelity measurement as a calibration point (its image tokens from the probe's frame size)."""
    probe = result.probe
    return CalibrationPoint(
        frame_prompt_tokens=result.frame_prompt_tokens,
        image_tokens=image_tokens(probe.frame_width, probe.frame_height),
        chat_prompt_tokens=result.chat_prompt_tokens,
        frame_encoder_steps=result.measured["frame_encoder_steps"],
        frame_prefill_steps=result.measured["frame_prefill_steps"],
        chat_prefill_steps=result.measured["chat_prefill_steps"],
    )


def size_stand_in(
    base_url: str,
    model: str,
    targets: Sequence[TargetShape],
    calibration: Sequence[tuple[int, int, int]],
    repeats: int = 15,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Calibrate the running stand-in at `calibration` sizes (width, height, chat tokens), solve its sizes for
    each target, and measure it at those sizes: the fit proposes, the measurement decides."""
    points: list[dict[str, Any]] = []
    for width, height, chat in calibration:
        probe = FidelityProbe(frame_width=width, frame_height=height, chat_prompt_tokens=chat, repeats=repeats)
        result = measure(base_url, model, targets[0].costs, probe)
        points.append({"point": asdict(calibration_point(result)), "result": result.to_dict()})
        log("\n".join([f"calibration at {width}x{height}, chat {chat} tokens:", *report_lines(result)]))
    fitted = [CalibrationPoint(**entry["point"]) for entry in points]
    solved: dict[str, Any] = {}
    for target in targets:
        sizes = solve(target.costs, target.frame_prompt_tokens, target.budget, fitted)
        probe = FidelityProbe(
            frame_width=sizes.frame_width,
            frame_height=sizes.frame_height,
            chat_prompt_tokens=sizes.chat_prompt_tokens,
            frame_filler_words=sizes.frame_filler_words,
            repeats=repeats,
        )
        result = measure(base_url, model, target.costs, probe)
        log("\n".join([f"{target.gpu}: solved {asdict(sizes)}", *report_lines(result)]))
        solved[target.gpu] = {"target": asdict(target), "sizes": asdict(sizes), "verified": result.to_dict()}
    return {"calibration": points, "targets": solved}


@dataclass(frozen=True)
class Resized:
    """A workload moved toward its target after a fidelity measurement missed it (see `refit`)."""

    frame_width: int
    frame_height: int
    frame_filler_words: int
    chat_scale: float  # the chat prompts' new length over their old
    changed: tuple[str, ...]  # the figures that were off and were resized for


def refit(result: FidelityResult, earlier: Sequence[FidelityResult] = ()) -> Resized:
    """The measured workload resized so that each figure that missed its target would hit it.

    The profile's sizes were fitted when `visioncap bench standin` ran; the machine's load moves the decode step
    since (the committed run of 2026-12-02 13:41 met 1.48x and 1.29x of its targets 13 minutes after the sizing had
    measured 0.85x and 1.08x), so a run corrects its workload on the server it is about to measure, and measures it
    again: the refit proposes, the measurement decides. Figures within tolerance keep their size, and the frame
    prompt keeps its length when only the image changes (the filler takes up the difference).

    Each figure's size (image tokens, frame prompt tokens, chat prompt tokens) moves along the line through this
    measurement and the latest `earlier` one at another size (`next_size`); with none, in proportion to the miss.
    """
    probe, target = result.probe, result.target
    sizes = _sizes(result)
    text = max(0, result.frame_prompt_tokens - sizes["frame_encoder_steps"] - probe.frame_filler_words)
    history = [(_sizes(old), old.measured) for old in earlier]

    def resized(name: str) -> int | None:
        if result.within[name] or result.measured[name] <= 0:  # at or below zero: noise, nothing to scale from
            return None
        points = [(old[name], measured[name]) for old, measured in history]
        return next_size(sizes[name], result.measured[name], getattr(target, name), points)

    new = {name: resized(name) for name in FIGURES}
    width, height = probe.frame_width, probe.frame_height
    image = new["frame_encoder_steps"]
    if image is not None:
        width, height = frame_for_tokens(max(4, image), probe.frame_width / probe.frame_height)
    prompt = new["frame_prefill_steps"] or result.frame_prompt_tokens
    chat = new["chat_prefill_steps"]
    return Resized(
        frame_width=width,
        frame_height=height,
        frame_filler_words=max(0, prompt - image_tokens(width, height) - text),
        chat_scale=1.0 if chat is None else max(8, chat) / result.chat_prompt_tokens,
        changed=tuple(name for name, size in new.items() if size is not None),
    )


def _sizes(result: FidelityResult) -> dict[str, int]:
    """The token count each figure grows with, in one measurement."""
    return {
        "frame_encoder_steps": image_tokens(result.probe.frame_width, result.probe.frame_height),
        "frame_prefill_steps": result.frame_prompt_tokens,
        "chat_prefill_steps": result.chat_prompt_tokens,
    }


def next_size(size: int, cost: float, target: float, earlier: Sequence[tuple[int, float]]) -> int:
    """The size at which `cost` (measured at `size`) would be `target`.

    Cost is not proportional to size on a CPU: a small prefill hides in the step's fixed overhead (chat prompts cut
    from 475 to 305 tokens went from 1.71 to 0.81 decode steps, not 1.10), so a proportional step overshoots.
    With an earlier point at another size, the line through the two (a secant step) is used, when it rises and
    lands within half to twice the size; a noisy pair that does not falls back to the proportional step.
    """
    proportional = round(size * target / cost)
    for old_size, old_cost in reversed(earlier):
        if old_size == size:
            continue
        slope = (cost - old_cost) / (size - old_size)
        if slope > 0:
            secant = size + (target - cost) / slope
            if size / 2 <= secant <= size * 2:
                return round(secant)
        break
    return proportional


# -- the profile's generated stand_in block --------------------------------------------------------------------

STAND_IN_START = "# --- sized by `visioncap bench standin --write` (generated: re-run it rather than editing) ---"
STAND_IN_END = "# --- end of stand_in ---"


def stand_in_spec(target: str, result: dict[str, Any], measured_at: str) -> StandInSpec:
    """The profile's `stand_in` section from a `size_stand_in` result (every target, faithful or not: the
    fidelity figures say which, and `bench mixed` measures them again before it judges anything)."""
    workloads = {}
    for gpu, entry in result["targets"].items():
        sizes, verified = entry["sizes"], entry["verified"]
        workloads[gpu] = StandInWorkload(
            frame_width=sizes["frame_width"],
            frame_height=sizes["frame_height"],
            frame_filler_words=sizes["frame_filler_words"],
            chat_prompt_tokens=sizes["chat_prompt_tokens"],
            target_chat_prompt_tokens=entry["target"]["chat_prompt_tokens"],
            max_num_batched_tokens=sizes["max_num_batched_tokens"],
            token_scale=round(sizes["scale"], 4),
            fidelity={name: round(verified["ratio"][name] or 0.0, 3) for name in FIGURES},
            measured_at=measured_at,
        )
    return StandInSpec(target=target, workloads=workloads)


def write_stand_in(profile_path: Path, spec: StandInSpec) -> None:
    """Put `spec` into the profile as a generated block (before `visioncap tune`'s block, which ends the file);
    the rest of the file stays byte for byte, and nothing is written unless the result loads as a profile."""
    import yaml

    from visioncap.bench.common.profile_file import replace_profile, split_block
    from visioncap.errors import ConfigError

    text = profile_path.read_text(encoding="utf-8")
    start = text.find(STAND_IN_START)
    if start >= 0:
        end = text.find(STAND_IN_END, start)
        if end < 0:
            raise ConfigError(f"{profile_path}: the generated stand_in block has lost its end marker")
        text = text[:start] + text[end + len(STAND_IN_END) :].lstrip("\n")
    elif "stand_in" in (yaml.safe_load(text) or {}):
        raise ConfigError(f"{profile_path}: its `stand_in:` section is not the generated block; remove it first")
    body = yaml.safe_dump({"stand_in": spec.model_dump(mode="json")}, sort_keys=False, width=120)
    head, tuned = split_block(text)
    replace_profile(profile_path, f"{head.rstrip()}\n{STAND_IN_START}\n{body}{STAND_IN_END}\n{tuned}")


def workload_for(profile: ModelProfile, target: str | None, gpu: str) -> StandInWorkload | None:
    """The profile's sized workload for `target` on `gpu`, if it has one."""
    spec = profile.stand_in
    if spec is None or target is None or spec.target != target:
        return None
    return cast("StandInWorkload | None", spec.workloads.get(gpu))  # type: ignore[call-overload]


def workload_options(workload: StandInWorkload, chat_prompt_tokens: tuple[int, int]) -> dict[str, Any]:
    """The bench options a sized workload sets: frame size and filler, the chat prompt range scaled to it."""
    return {
        "image_width": workload.frame_width,
        "image_height": workload.frame_height,
        "frame_filler_words": workload.frame_filler_words,
        "chat_prompt_tokens": scaled_chat_prompts(workload, chat_prompt_tokens),
    }


def scaled_chat_prompts(workload: StandInWorkload, tokens: tuple[int, int]) -> tuple[int, int]:
    """A range of the target's chat prompt lengths as the stand-in's (the same cost in decode steps)."""
    scale = workload.chat_prompt_tokens / workload.target_chat_prompt_tokens
    return max(8, round(tokens[0] * scale)), max(8, round(tokens[1] * scale))


def with_vllm_flag(profile: ModelProfile, flag: str, value: str) -> ModelProfile:
    """The profile with one `vllm serve` flag set to `value` in its argument list."""
    args = list(profile.vllm_args)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return profile.model_copy(update={"vllm_args": args})
