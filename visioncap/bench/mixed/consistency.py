"""#46 item 4: more captions at the same chat objectives, every run.

Two goals judged on each run (`run_goals`, beside the others in `mixed.json`):

- `captions_at_1_25_over_s1_idle`: the gateway's best captions/s among its points that meet the 1.25x objective
  (the frontier's judgement: values where the samples allow, else interval ends) over S1-idle's, the capacity with
  chat idle; at least 0.6.
- `objective_levels_non_decreasing`: the gateway configured at each objective level (S3 at 1.25x, then
  F-gateway-1.5x, -2x, -3x) serves at least as many captions/s as at the level before, judged on intervals: a
  level falls short only where its interval lies wholly below the previous level's. Captions completed in a
  phase's window are counted; their 95 % interval is the count's (normal approximation to Poisson, n +- 1.96
  sqrt(n), over the window): a pacer's starts are more regular than Poisson, so this errs wide, towards "not
  decreasing".

And one judged across runs (`judge_series`, `visioncap bench mixed-series`): every goal met in each of three
consecutive runs of the same command, and their S3 captions/s each within 20 % of the three's mean.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

CAPTIONS_OVER_S1_IDLE = 0.6
# The gateway's phase at each objective level: S3 is the gateway at 1.25x; the frontier's F-gateway-* the others.
LEVEL_PHASES = {"1.25": "S3", "1.5": "F-gateway-1.5x", "2.0": "F-gateway-2x", "3.0": "F-gateway-3x"}
Z95 = 1.96
SERIES_RUNS = 3
SERIES_SPREAD = 0.2  # each run's S3 captions/s within this share of the runs' mean


def captions_interval(summary: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """95 % interval of a phase's captions/s from the captions completed in its window (None: not measured)."""
    if not summary:
        return None
    count = (summary.get("captions") or {}).get("completed_in_window")
    window_s = float(summary.get("duration_s") or 0) - float(summary.get("warmup_s") or 0)
    if not isinstance(count, int) or window_s <= 0:
        return None
    half = Z95 * math.sqrt(count)
    return round(max(0.0, count - half) / window_s, 3), round((count + half) / window_s, 3)


def run_goals(summaries: Mapping[str, Mapping[str, Any]], front: Mapping[str, Any] | None) -> dict[str, Any]:
    """The two per-run goals of #46 item 4 (`front`: the frontier's levels table)."""
    return {
        "captions_at_1_25_over_s1_idle": _over_idle(summaries, front),
        "objective_levels_non_decreasing": _levels(summaries),
    }


def _over_idle(summaries: Mapping[str, Mapping[str, Any]], front: Mapping[str, Any] | None) -> dict[str, Any]:
    idle = ((summaries.get("S1-idle") or {}).get("captions") or {}).get("throughput_per_s")
    best = None if not front else ((front.get("1.25") or {}).get("best") or {}).get("gateway")
    served = 0.0 if front and best is None else (best or {}).get("captions_per_s")
    value = None if served is None or not idle else round(served / idle, 3)
    return {
        "value": value,
        "goal": f">= {CAPTIONS_OVER_S1_IDLE} (the gateway's best captions/s meeting 1.25x over S1-idle's; 0 when no "
        "gateway point meets it)",
        "met": None if value is None else value >= CAPTIONS_OVER_S1_IDLE,
        "captions_per_s": served,
        "phase": (best or {}).get("phase"),
        "s1_idle_captions_per_s": idle,
    }


def _levels(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    rates = {
        level: ((summaries.get(phase) or {}).get("captions") or {}).get("throughput_per_s")
        for level, phase in LEVEL_PHASES.items()
    }
    intervals = {level: captions_interval(summaries.get(phase)) for level, phase in LEVEL_PHASES.items()}
    measured = [level for level in LEVEL_PHASES if intervals[level] is not None]
    falls = [
        f"{looser} below {tighter}"
        for tighter, looser in itertools.pairwise(measured)
        if intervals[looser][1] < intervals[tighter][0]  # type: ignore[index]
    ]
    return {
        "value": rates,
        "unit": "/s",
        "interval_95": intervals,
        "goal": "captions/s at each objective level (S3 1.25x, F-gateway-1.5x/-2x/-3x) not below the tighter "
        "level's, on 95 % count intervals",
        "met": None if len(measured) < 2 else not falls,
        "falls": falls,
        "phases": LEVEL_PHASES,
    }


def judge_series(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Whether these consecutive runs (their `mixed.json`, oldest first) meet #46 item 4: every goal met in each of
    at least three, and each one's S3 captions/s within 20 % of their mean; what missed, by run."""
    # A goal not judged (met None: an unfaithful stand-in, a phase the run lacks) is not met either, but says
    # nothing of the gateway: listed apart.
    missed = {
        name: sorted(goal for goal, judged in goals_of(run).items() if judged.get("met") is False)
        for name, run in zip(names, runs, strict=True)
    }
    unjudged = {
        name: sorted(goal for goal, judged in goals_of(run).items() if judged.get("met") is None)
        for name, run in zip(names, runs, strict=True)
    }
    s3 = [((run.get("setups") or {}).get("S3") or {}).get("captions", {}).get("throughput_per_s") for run in runs]
    known = [rate for rate in s3 if isinstance(rate, int | float)]
    mean = sum(known) / len(known) if len(known) == len(runs) and known else None
    spread = None if not mean else [round(rate / mean - 1, 3) for rate in known]
    commands = sorted({str(run.get("command")) for run in runs})
    within = spread is not None and all(abs(each) <= SERIES_SPREAD for each in spread)
    return {
        "runs": list(names),
        "commands": commands,
        "started_at": [run.get("started_at") for run in runs],
        "goals_missed": missed,
        "goals_not_judged": unjudged,
        "s3_captions_per_s": s3,
        "s3_mean": None if mean is None else round(mean, 3),
        "s3_spread_from_mean": spread,
        "s3_within_spread": within,
        "met": len(runs) >= SERIES_RUNS
        and len(commands) == 1
        and within
        and not any(missed.values())
        and not any(unjudged.values()),
        "goal": f"every goal met in each of {SERIES_RUNS} consecutive runs of one command, and their S3 captions/s "
        f"each within {SERIES_SPREAD:.0%} of the mean",
    }


def goals_of(run: Mapping[str, Any]) -> dict[str, Any]:
    """A run's goals as recorded, with this module's judged from its phases where the run predates them."""
    levels = (run.get("frontier") or {}).get("levels")
    return {**run_goals(run.get("setups") or {}, levels), **(run.get("goals") or {})}


def series_report(judged: Mapping[str, Any]) -> str:
    """Markdown of `judge_series`'s answer."""
    lines = [
        "| run | started | S3 captions/s | vs mean | goals missed | not judged |",
        "|---|---|---:|---:|---|---|",
    ]
    spread = judged["s3_spread_from_mean"] or [None] * len(judged["runs"])
    for name, started, rate, off in zip(
        judged["runs"], judged["started_at"], judged["s3_captions_per_s"], spread, strict=True
    ):
        missed = ", ".join(judged["goals_missed"][name]) or "none"
        unjudged = ", ".join(judged["goals_not_judged"][name]) or "none"
        shown = "-" if off is None else f"{off:+.0%}"
        lines.append(f"| {name} | {started} | {rate} | {shown} | {missed} | {unjudged} |")
    verdict = "met" if judged["met"] else "not met"
    lines += ["", f"Series goal ({judged['goal']}): **{verdict}**. Commands: {', '.join(judged['commands'])}."]
    return "\n".join(lines) + "\n"


def load_runs(paths: Sequence[Path]) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in paths]
