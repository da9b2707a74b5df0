"""The latency/throughput frontier of `visioncap bench mixed` (#12 item 4): captions per second against chat's
inter-token and TTFT p99, for vLLM alone and for the gateway, from the phases of one run.

A configuration is what an operator can set while the cameras offer what they offer: vLLM alone with its own
knobs (FCFS or priority policy, the chunk budget, `--long-prefill-token-threshold`; configs named `vllm-*`), or
the gateway with an objective level (`gateway*`). Its frontier value at a chat objective (inter-token p99 at most
`level` x chat alone, TTFT p99 at most 1.5x alongside) is the most captions per second any of its measured
points delivered during chat while meeting it. Points of other configurations (cameras throttled by hand, named
`throttled-*`) are shown for reference and never enter the dominance comparison.

Whether a point meets a level is judged as every p99 goal of the run (#12 item 3): a ratio on its value where
its phase and chat alone rest on enough samples (200 chats for TTFT, 5,000 gaps for inter-token), else on the upper
end of its bootstrap 95 % interval. A 40 s phase holds about 35 chats: its TTFT p99 point estimate cannot tell
1.4x from 1.7x, for vLLM alone or for the gateway. The same table on point estimates is kept beside it
(`on_values`), so that a reader sees what the judgement rests on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

TTFT_LIMIT = 1.5  # TTFT p99 / chat alone, alongside every level
DOMINANCE = 1.5  # the gateway's captions/s over the best vLLM-only configuration's, at every level


@dataclass(frozen=True)
class FrontierPoint:
    """One measured phase: a configuration at one setting, and what chat and the cameras got."""

    phase: str
    config: str  # "vllm-fcfs", "vllm-priority", "gateway", ...
    setting: str  # "offered 2/s", "objective 1.5x", ...
    captions_per_s: float | None
    itl_p99_ratio: float | None
    ttft_p99_ratio: float | None
    itl_interval: tuple[float, float] | None = None
    ttft_interval: tuple[float, float] | None = None
    itl_on_value: bool = True  # this phase and chat alone rest on enough gaps: the value stands for the p99
    ttft_on_value: bool = True  # ... on enough chats

    def meets(self, level: float, on_values: bool = False) -> bool:
        """Inter-token p99 within `level` and TTFT p99 within 1.5x of chat alone, each judged as the module says
        (`on_values`: on the point estimates whatever the samples)."""
        itl = _judged(self.itl_p99_ratio, self.itl_interval, on_values or self.itl_on_value)
        ttft = _judged(self.ttft_p99_ratio, self.ttft_interval, on_values or self.ttft_on_value)
        return itl is not None and ttft is not None and itl <= level and ttft <= TTFT_LIMIT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _judged(value: float | None, interval: tuple[float, float] | None, on_value: bool) -> float | None:
    return value if on_value or interval is None else interval[1]


def frontier(
    points: Iterable[FrontierPoint], levels: Iterable[float], offered_per_s: float | None = None
) -> dict[str, Any]:
    """Per level: each configuration's best captions/s meeting it (and which phase), and the gateway's dominance
    (`dominance`; `offered_per_s`: the flood's rate); `on_values`: the same on point estimates."""
    points = list(points)
    configs = sorted({p.config for p in points})

    def best_at(level: float, on_values: bool) -> dict[str, Any]:
        best: dict[str, Any] = {}
        for config in configs:
            meeting = [
                p for p in points if p.config == config and p.meets(level, on_values) and p.captions_per_s is not None
            ]
            top = max(meeting, key=lambda p: p.captions_per_s or 0.0, default=None)
            best[config] = None if top is None else {"captions_per_s": top.captions_per_s, "phase": top.phase}
        return best

    table: dict[str, Any] = {}
    for level in levels:
        best, on_values = best_at(level, False), best_at(level, True)
        table[str(level)] = {
            "best": best,
            **dominance(best, offered_per_s),
            "on_values": {"best": on_values, **dominance(on_values, offered_per_s)},
        }
    return table


def dominance(best: Mapping[str, Any], offered_per_s: float | None = None) -> dict[str, Any]:
    """The gateway against the best vLLM-only configuration at one level: the ratio and whether it is >= 1.5x
    (or vLLM alone meets nothing and the gateway delivers > 0). With the cameras' `offered_per_s`, also whether
    1.5x is `reachable` at all: no gateway serves more than is offered, so where vLLM alone already serves more
    than two thirds of the offer the goal cannot be met by any configuration, only by a larger offer."""
    gateway = max(
        (v["captions_per_s"] for k, v in best.items() if k.startswith("gateway") and v is not None), default=None
    )
    alone = max((v["captions_per_s"] for k, v in best.items() if k.startswith("vllm") and v is not None), default=None)
    reachable = None if offered_per_s is None else alone is None or DOMINANCE * alone <= offered_per_s
    return {**_gateway_over(gateway, alone), "reachable": reachable}


def _gateway_over(gateway: float | None, alone: float | None) -> dict[str, Any]:
    """The ratio of the gateway's best to vLLM alone's, and whether it meets the dominance factor."""
    if gateway is None:
        return {"gateway_over_vllm": None, "met": False}
    if alone is None or alone <= 0:
        return {"gateway_over_vllm": None, "met": gateway > 0}
    value = gateway / alone
    return {"gateway_over_vllm": round(value, 3), "met": value >= DOMINANCE}
