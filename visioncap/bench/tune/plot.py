"""The trade-off curve of a tuning run: caption throughput against chat tail latency, one point per candidate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display here or on servers
import matplotlib.pyplot as plt


def plot(results: dict[str, Any], path: Path) -> None:
    points = [c for c in results["candidates"] if c.get("measurement")]
    objectives = results["objectives"]
    chosen = results["chosen"]["label"]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    panels = (
        ("itl_p99_ms", "itl_p50_ms", "chat inter-token latency (ms)", objectives["itl_p99_ms"]),
        ("ttft_p99_ms", "ttft_p50_ms", "chat time to first token (ms)", objectives["ttft_p99_ms"]),
    )
    for ax, (p99_key, p50_key, xlabel, objective) in zip(axes, panels, strict=True):
        xs = [c["measurement"][p99_key] for c in points]
        xs50 = [c["measurement"][p50_key] for c in points]
        ys = [c["measurement"]["captions_per_s"] for c in points]
        usable = [(x, x50, y, c) for x, x50, y, c in zip(xs, xs50, ys, points, strict=True) if None not in (x, y)]
        if usable:
            ax.plot([u[0] for u in usable], [u[2] for u in usable], "-", color="#1f77b4", alpha=0.5, zorder=1)
            ax.scatter([u[0] for u in usable], [u[2] for u in usable], color="#1f77b4", label="p99", zorder=2)
            p50 = [(u[1], u[2]) for u in usable if u[1] is not None]
            ax.scatter([p[0] for p in p50], [p[1] for p in p50], color="#aaaaaa", marker="x", label="p50", zorder=2)
        for index, (x, _, y, c) in enumerate(usable):
            meets = c["measurement"]["meets_objectives"]
            style = {"color": "#2ca02c" if meets else "#d62728", "fontweight": "bold" if c["label"] == chosen else None}
            text = c["label"] + (" (chosen)" if c["label"] == chosen else "")
            load = (c.get("summary") or {}).get("loadavg_1m")
            if load:  # on a shared machine the load during the phase explains much of the spread
                text += f"\nload {load[0]:.1f}-{load[1]:.1f}"
            # Alternate above and below so neighbouring points' labels do not overprint each other.
            offset = (6, 6) if index % 2 == 0 else (6, -26)
            ax.annotate(text, (x, y), textcoords="offset points", xytext=offset, fontsize=9, **style)
            if c["label"] == chosen:
                ax.scatter([x], [y], s=180, facecolors="none", edgecolors="#2ca02c", linewidths=2, zorder=3)
        ax.axvline(objective, color="#d62728", linestyle="--", linewidth=1, label=f"p99 objective {objective:g} ms")
        reference = (results.get("reference_chat_alone") or {}).get("chat") or {}
        ref = (reference.get(p99_key.removesuffix("_p99_ms") + "_ms") or {}).get("p99")
        if ref is not None:
            ax.axvline(ref, color="#555555", linestyle=":", linewidth=1, label=f"chat alone p99 {ref:.0f} ms")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("captions per second beside chat")
        top = max((u[2] for u in usable), default=1.0)
        ax.set_ylim(0, top * 1.2 if top > 0 else 1.0)  # room for the labels above the highest point
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    threshold = any(c.get("long_prefill_token_threshold") for c in points)
    knob = "max_num_batched_tokens/long_prefill_token_threshold" if threshold else "max_num_batched_tokens"
    met = "" if results["objectives_met"] else " - NO candidate met the objectives"
    if results.get("not_judged"):
        met = " - NOT JUDGED (stand-in off target)"
    subject = f"{results['profile']} on {results['gpu_class']}"
    target = results.get("stand_in_for")
    if target:
        subject = f"{target['profile']} for {target['gpu_class']}, measured on the stand-in {subject}"
    fig.suptitle(
        f"visioncap tune: {subject} ({results['hardware']}){met}\n"
        f"labels: {knob}, and the 1-min load average during the phase; green meets the objectives",
        fontsize=10,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
