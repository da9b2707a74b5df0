"""How many frames per second chat can live beside: the cost model's ceiling for a chat latency objective.

A chat stream gets one token per engine step, so its inter-token gaps are the engine's step times. A step that
also runs a frame's vision encoder and prefill (vLLM never splits one image's encoder pass; a frame prompt that
fits the chunk budget is prefilled in one step) lasts `1 + a` decode steps, where `a` is the frame's encoder plus
prefill cost in decode steps (`visioncap.bench.standin.fidelity` measures it; `visioncap.serve.costmodel` estimates it
for a target GPU). With frames started one at a time, a share `f` of the steps carries one frame each and the
gaps are a mixture: `(1 - f)` chat-alone gaps and `f` chat-alone gaps lengthened by `a` steps.

The objective is a p99: at most 1 % of the gaps may exceed `T = level x p99(chat alone)`. So

    f* = (0.01 - q0) / (qa - q0)     q0 = P(gap > T), qa = P(gap + a steps > T), both on chat-alone gaps

(all of the steps when `qa <= 0.01`: frames never push a gap past T, and only the engine's capacity bounds
them), and the frame rate is `f*` of the steps per second: `r* = f* / (t (1 + f* a))`, `t` the decode step.

Two sets of chat-alone gaps:
- deterministic: every gap is one decode step, as on a GPU, whose steps vary little. Then `q0 = 0` and a frame
  step (`1 + a` steps) is above `T` for every level below `1 + a`: `f* = 1 %` whatever the level, until the
  level reaches `1 + a`. This is the ceiling the target would see, in the stand-in's decode steps.
- measured: the gaps of chat alone on this machine, whose scheduling noise already puts its p99 at a few
  decode steps; frames then hide partly inside the noise, and the ceiling comes out higher.

The ceiling is for frames of the size that costs `a`: smaller frames (fewer image tokens) cost less and may
fit under `T` altogether; several frames in one step cost one long gap for many frames (a p99 does not see
how long a gap is), which is how an unpaced server can beat this ceiling on p99 while stalling streams longer.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

ALLOWED_ABOVE = 0.01  # a p99 objective: at most 1 % of the gaps above it


@dataclass(frozen=True)
class Ceiling:
    """Frames per second at which chat's inter-token p99 stays within `level` x chat alone."""

    level: float
    model: Literal["deterministic", "measured"]
    frames_per_s: float
    step_share: float  # f*: share of engine steps that carry a frame
    bound: Literal["p99", "capacity"]
    step_s: float
    frame_steps: float

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def ceiling(level: float, step_s: float, frame_steps: float, gaps_s: Sequence[float] | None = None) -> Ceiling:
    """The ceiling for objective `level` (e.g. 1.25); `gaps_s`: chat-alone gaps (None: deterministic steps)."""
    if step_s <= 0 or frame_steps < 0 or level <= 0:
        raise ValueError(f"need step_s > 0, frame_steps >= 0 and level > 0 (got {step_s}, {frame_steps}, {level})")
    gaps = [step_s] if gaps_s is None or not gaps_s else list(gaps_s)
    # numpy's default (linear) percentile, as the benchmarks report p99
    p99 = gaps[0] if len(gaps) == 1 else statistics.quantiles(gaps, n=100, method="inclusive")[98]
    threshold = level * p99
    added = frame_steps * step_s
    q0 = sum(g > threshold for g in gaps) / len(gaps)
    qa = sum(g + added > threshold for g in gaps) / len(gaps)
    bound: Literal["p99", "capacity"]
    if qa <= ALLOWED_ABOVE:
        share, bound = 1.0, "capacity"
    else:
        share, bound = max(0.0, min(1.0, (ALLOWED_ABOVE - q0) / (qa - q0))), "p99"
    # Steps per second with that share of frame steps, each frame step 1 + a decode steps long.
    rate = share / (step_s * (1 + share * frame_steps))
    return Ceiling(
        level=level,
        model="deterministic" if gaps_s is None else "measured",
        frames_per_s=rate,
        step_share=share,
        bound=bound,
        step_s=step_s,
        frame_steps=frame_steps,
    )


def step_of(gaps_s: Sequence[float]) -> float:
    """The decode step chat streams see: the median of their gaps."""
    return float(statistics.median(gaps_s))
