"""Where chat's slow inter-token gaps fall: beside a frame at vLLM, or beside none (the host's own), per set-up.

#46 item 4 asks how much of S3's miss of the inter-token objective the host's own stalls explain. A run's raw
records hold each chat gap's end and each caption's completion. A caption is taken to be at vLLM for `service_s`
before it completed (its latency p50 with chat idle on the same path: S3-idle's through the gateway, S1-idle's
direct; in a gateway set-up the rest of its latency was spent queued in the gateway, outside vLLM). A gap is
*beside a frame* when a caption was at vLLM at some moment from `spike_window_s` before the gap's end to its end
(the window the gateway's learnt rate uses: a frame's encoder and prefill run within a few engine steps of its
start). Then, for each set-up with chat and captions, against the 1.25x objective (the gateway's frontier points
set for looser ones are left out):

- `share_above`: the share of its gaps above the objective (over 1 %: its p99 misses the objective);
- `beside_none` and `beside_frames`: the gaps of each kind and the share above among them;
- `if_host_as_s0`: the share had the gaps beside no frame been as often slow as chat alone's (S0's): what the
  frames leave by themselves. Over 1 %: the host's stalls do not explain the miss;
- `if_frames_free`: the share had the gaps beside frames been as often slow as those beside none: what the host
  leaves by itself. Over 1 %: the host's stalls alone miss the objective, whatever the frames do.

The split is by time, so it charges to the frames whatever else coincides with them (the gateway's and the load
generator's CPU when frames flow, on a 2-core host): `if_host_as_s0` is an upper bound of what frames alone cost.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Any

from visioncap.config.gateway import PacingConfig

P99_SHARE = 0.01  # a p99 within the objective: at most 1 % of gaps above it
SPIKE_WINDOW_S: float = PacingConfig.model_fields["spike_window_s"].default  # the learnt rate's window
GATEWAY_PREFIXES = ("S3", "F-gateway")
# The gateway's frontier points, configured for looser objectives (1.5x, 2x, 3x): judging them by 1.25x's says
# nothing of their own.
OTHER_LEVELS = ("F-gateway",)


def gap_ends(chats: Iterable[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(end time, length) of every inter-token gap of the answered chats, in the phase's clock."""
    found = []
    for chat in chats:
        if chat.get("status") != 200 or chat.get("ttft_s") is None:
            continue
        moment = float(chat["sent_at"]) + float(chat["ttft_s"])
        for gap in chat.get("gaps_s") or []:
            moment += gap
            found.append((moment, float(gap)))
    return found


def service_s(summaries: Mapping[str, Any], phase: str) -> float | None:
    """A caption's time at vLLM on `phase`'s path: the idle set-up's caption latency p50, in seconds."""
    idle = "S3-idle" if phase.startswith(GATEWAY_PREFIXES) else "S1-idle"
    p50 = (((summaries.get(idle) or {}).get("captions") or {}).get("latency_ms") or {}).get("p50")
    return None if p50 is None else float(p50) / 1000


def _share(above: int, gaps: int) -> float | None:
    return None if gaps == 0 else round(above / gaps, 5)


def split_gaps(
    gaps: list[tuple[float, float]], done_at: list[float], objective_s: float, service: float, window_s: float
) -> dict[str, Any]:
    """Gaps beside no frame and beside frames, with how many of each were above `objective_s`."""
    done = sorted(done_at)
    counts = {"beside_none": [0, 0], "beside_frames": [0, 0]}
    for end, length in gaps:
        # A caption at vLLM within [end - window, end]: completed at or after end - window, started (done - service)
        # at or before end.
        first = bisect.bisect_left(done, end - window_s)
        beside = first < len(done) and done[first] <= end + service
        kind = counts["beside_frames" if beside else "beside_none"]
        kind[0] += 1
        kind[1] += length > objective_s
    return {kind: {"gaps": n, "above": above, "share_above": _share(above, n)} for kind, (n, above) in counts.items()}


def verdict(share: float, if_host_as_s0: float, if_frames_free: float) -> str:
    """Which part explains a miss (`share` over 1 %): the frames, the host, both, or either one."""
    if share <= P99_SHARE:
        return "met"
    frames, host = if_host_as_s0 > P99_SHARE, if_frames_free > P99_SHARE
    if frames and host:
        return "both: either alone misses"
    if frames:
        return "frames: the host's stalls do not explain it"
    if host:
        return "host: its stalls alone miss"
    return "either: each alone would meet it"


def miss_sources(
    raw: Mapping[str, Mapping[str, Any]],
    summaries: Mapping[str, Any],
    objective_s: float,
    window_s: float = SPIKE_WINDOW_S,
) -> dict[str, Any]:
    """The split for every set-up with chat and captions, against chat alone's (S0) share above `objective_s`."""
    s0 = gap_ends((raw.get("S0") or {}).get("chats") or [])
    s0_above = sum(1 for _, length in s0 if length > objective_s)
    s0_share = s0_above / len(s0) if s0 else None
    phases: dict[str, Any] = {}
    for phase, records in raw.items():
        if phase.startswith(OTHER_LEVELS):
            continue
        gaps = gap_ends(records.get("chats") or [])
        done_at = [float(c["done_at"]) for c in records.get("captions") or [] if c.get("done_at") is not None]
        service = service_s(summaries, phase)
        if not gaps or not done_at or service is None or s0_share is None:
            continue
        split = split_gaps(gaps, done_at, objective_s, service, window_s)
        none, frames = split["beside_none"], split["beside_frames"]
        above = none["above"] + frames["above"]
        share = above / len(gaps)
        none_share = none["above"] / none["gaps"] if none["gaps"] else s0_share
        if_host_as_s0 = (s0_share * none["gaps"] + frames["above"]) / len(gaps)
        if_frames_free = none_share
        phases[phase] = {
            "gaps": len(gaps),
            "above": above,
            "share_above": round(share, 5),
            **split,
            "if_host_as_s0": round(if_host_as_s0, 5),
            "if_frames_free": round(if_frames_free, 5),
            "service_s": round(service, 4),
            "verdict": verdict(share, if_host_as_s0, if_frames_free),
        }
    return {
        "objective_ms": round(objective_s * 1000, 3),
        "window_s": window_s,
        "s0": {"gaps": len(s0), "above": s0_above, "share_above": None if s0_share is None else round(s0_share, 5)},
        "phases": phases,
        "method": "visioncap/bench/mixed/misses.py",
    }


def run_miss_sources(
    raw: Mapping[str, Mapping[str, Any]], summaries: Mapping[str, Any], objectives: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """`miss_sources` against a run's gateway inter-token objective (None: the run set none)."""
    objective_ms = (objectives or {}).get("itl_p99_ms")
    return None if objective_ms is None else miss_sources(raw, summaries, float(objective_ms) / 1000)


def misses_table(found: Mapping[str, Any]) -> str:
    """Markdown of `miss_sources`."""
    s0 = found["s0"]
    lines = [
        f"Gaps above the objective ({found['objective_ms']} ms): chat alone (S0) {s0['above']} of {s0['gaps']} "
        f"({_percent(s0['share_above'])}). Beside a frame: a caption at vLLM within {found['window_s']} s before "
        "the gap's end.",
        "",
        "| set-up | gaps | above | beside no frame: gaps, above | beside frames: gaps, above | if the host were "
        "as in S0 | if frames cost nothing | the miss is |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for phase, row in found["phases"].items():
        none, frames = row["beside_none"], row["beside_frames"]
        lines.append(
            f"| {phase} | {row['gaps']} | {_percent(row['share_above'])} | {none['gaps']}, "
            f"{_percent(none['share_above'])} | {frames['gaps']}, {_percent(frames['share_above'])} | "
            f"{_percent(row['if_host_as_s0'])} | {_percent(row['if_frames_free'])} | {row['verdict']} |"
        )
    return "\n".join(lines) + "\n"


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.2%}"
