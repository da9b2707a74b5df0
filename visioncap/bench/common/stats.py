"""Workload statistics: percentiles, summaries and seeded arrival schedules (pure, no I/O, no clock)."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (q in 0..100, like numpy's default); None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, not {q}")
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    fraction = position - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * fraction)


def summarize(values: Sequence[float], scale: float = 1.0) -> dict[str, float | int | None]:
    """Count, mean, p50, p90, p99 and max of `values` multiplied by `scale` (e.g. 1000 for s -> ms)."""
    scaled = [value * scale for value in values]
    return {
        "n": len(scaled),
        "mean": sum(scaled) / len(scaled) if scaled else None,
        "p50": percentile(scaled, 50),
        "p90": percentile(scaled, 90),
        "p99": percentile(scaled, 99),
        "max": max(scaled) if scaled else None,
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def poisson_arrivals(rate_per_s: float, duration_s: float, rng: random.Random) -> list[float]:
    """Arrival offsets (seconds from 0, increasing, all < duration_s) of a Poisson process at `rate_per_s`."""
    if rate_per_s <= 0 or duration_s <= 0:
        return []
    arrivals: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        arrivals.append(t)
        t += rng.expovariate(rate_per_s)
    return arrivals


def uniform_int(rng: random.Random, low: int, high: int) -> int:
    """An integer in [low, high] (both included); `low` when the range is empty."""
    return low if high <= low else rng.randint(low, high)


def ecdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their cumulative fractions (for CDF plots)."""
    ordered = sorted(values)
    n = len(ordered)
    return ordered, [(index + 1) / n for index in range(n)]


def _resampled(clusters: Sequence[Sequence[float]], q: float, rng: random.Random) -> float | None:
    """Percentile q of the values of len(clusters) clusters drawn with replacement, pooled."""
    return percentile([v for c in rng.choices(clusters, k=len(clusters)) for v in c], q)


def _interval(values: list[float]) -> tuple[float, float] | None:
    if not values:
        return None
    low, high = percentile(values, 2.5), percentile(values, 97.5)
    assert low is not None and high is not None
    return low, high


def bootstrap_interval(
    clusters: Sequence[Sequence[float]], q: float, resamples: int = 1000, seed: int = 0
) -> tuple[float, float] | None:
    """95 % interval of percentile-q of the pooled values, resampling whole clusters (see
    `bootstrap_ratio_interval`). None when there are none."""
    if not clusters:
        return None
    rng = random.Random(seed)
    found = (_resampled(clusters, q, rng) for _ in range(resamples))
    return _interval([v for v in found if v is not None])


def bootstrap_ratio_interval(
    numerator: Sequence[Sequence[float]],
    denominator: Sequence[Sequence[float]],
    q: float,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """95 % interval of percentile-q(numerator) / percentile-q(denominator), resampling whole clusters.

    A cluster is what was measured together: one chat's inter-token gaps (they share that chat's fate), or one
    TTFT. Each arm's clusters are drawn with replacement and pooled, so an interval reflects how few chats a
    p99 rests on, not only how many gaps. None when either arm is empty.
    """
    if not numerator or not denominator:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        value = ratio(_resampled(numerator, q, rng), _resampled(denominator, q, rng))
        if value is not None:
            ratios.append(value)
    return _interval(ratios)
