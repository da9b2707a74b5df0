"""Sizes a CPU stand-in so that it costs, in decode steps, what a target model costs on a GPU class.

What the scheduler and a chat user feel is dimensionless (see `visioncap.bench.fidelity`): a frame's encoder
pass and prompt prefill and a chat prompt's prefill, each in decode steps, and token counts relative to the chunk
budget. A small model on a CPU has the wrong ratios at the target's sizes (its prefill per token is dearer
relative to its decode step than a 7B model's on an H200), so its workload is scaled: fewer tokens per frame and
per chat prompt, and a budget scaled by the same factor, chosen from measurements of the stand-in:

- prefill cost in decode steps is close to linear in prompt tokens: `a + b * tokens`, fitted to the
  measured frame-sized and chat-sized text prompts of two calibration runs;
- the stand-in's frame prompt then gets `(P - a) / b` tokens for the target's frame prefill P, its chat prompt
  `(C - a) / b` for the target's chat prefill C, its frame the image tokens that leaves after the caption text,
  and its chunk budget the target's budget times the frame prompts' ratio (the same chunks per frame);
- the encoder's cost per frame follows the vision tower's shape, not these sizes: the fitted `c + d * image
  tokens` at the chosen frame tells whether the tower needs to be smaller or larger.

The result is checked by measuring it (`visioncap bench fidelity`), never assumed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from visioncap.bench.fidelity import FidelityProbe, FidelityResult, FidelityTarget, measure, report_lines
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
    """The stand-in's workload for one target: frame size, chat prompt length, chunk budget."""

    frame_width: int
    frame_height: int
    image_tokens: int
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


def solve(
    target: FidelityTarget,
    target_frame_prompt_tokens: int,
    target_budget: int,
    points: Sequence[CalibrationPoint],
    aspect: float = 4 / 3,
) -> StandInSizes:
    """The stand-in's sizes for `target`, from calibration points measured on the stand-in."""
    prefill = [(p.frame_prompt_tokens, p.frame_prefill_steps) for p in points]
    prefill += [(p.chat_prompt_tokens, p.chat_prefill_steps) for p in points]
    a, b = fit_line(prefill)
    if b <= 0:
        raise ValueError("prefill cost does not grow with prompt length: the calibration is noise")
    text_tokens = round(sum(p.frame_prompt_tokens - p.image_tokens for p in points) / len(points))
    frame_prompt = max(text_tokens + 4, round((target.frame_prefill_steps - a) / b))
    chat = max(8, round((target.chat_prefill_steps - a) / b))
    width, height = frame_for_tokens(frame_prompt - text_tokens, aspect)
    tokens = image_tokens(width, height)
    c, d = fit_line([(p.image_tokens, p.frame_encoder_steps) for p in points])
    scale = (tokens + text_tokens) / target_frame_prompt_tokens
    return StandInSizes(
        frame_width=width,
        frame_height=height,
        image_tokens=tokens,
        frame_prompt_tokens=tokens + text_tokens,
        chat_prompt_tokens=chat,
        max_num_batched_tokens=max(16, math.ceil(target_budget * scale / 16) * 16),
        scale=scale,
        predicted=FidelityTarget(
            frame_encoder_steps=c + d * tokens,
            frame_prefill_steps=a + b * (tokens + text_tokens),
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


def target_shape(profile: str, gpu: str, models_dir: Path) -> TargetShape:
    """The cost model's figures and the serving plan's budget for `profile` on `gpu`."""
    from visioncap.bench.fidelity import target_for
    from visioncap.serve.costmodel import for_profile
    from visioncap.serve.plan import plan_serving
    from visioncap.serve.profiles import load_profile

    loaded = load_profile(profile, models_dir)
    args = plan_serving(loaded, gpu=gpu).args
    budget = int(args[args.index("--max-num-batched-tokens") + 1])
    return TargetShape(gpu, target_for(profile, gpu, models_dir), for_profile(loaded, gpu).frame_prompt_tokens, budget)


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
            repeats=repeats,
        )
        result = measure(base_url, model, target.costs, probe)
        log("\n".join([f"{target.gpu}: solved {asdict(sizes)}", *report_lines(result)]))
        solved[target.gpu] = {"target": asdict(target), "sizes": asdict(sizes), "verified": result.to_dict()}
    return {"calibration": points, "targets": solved}
