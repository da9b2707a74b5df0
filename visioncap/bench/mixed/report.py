"""The results files of `visioncap bench mixed`: JSON (summary and raw samples), a Markdown table, a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visioncap.bench.common.machine import portable
from visioncap.bench.common.stats import ecdf
from visioncap.bench.mixed.misses import misses_table

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from visioncap.bench.common.load import PhaseResult
    from visioncap.bench.mixed.run import MixedOptions, Run

ROWS = (
    ("S0", "chat alone, direct"),
    ("S1", "chat + flood, vLLM FCFS"),
    ("S2", "chat + flood, vLLM priority"),
    ("S3", "chat + flood, gateway"),
    ("S3-steady", "chat + flood offered below S3's rate, gateway"),
    ("S3-downscale", "chat + flood, gateway shrinking images while chat is active"),
    ("S0-gateway", "chat alone, gateway"),
    ("S1-idle", "flood alone, direct"),
    ("direct-idle-priority", "flood alone, direct (priority server)"),
    ("S3-idle", "flood alone, gateway"),
    ("S2-alerts", "chat + flood + questions, vLLM priority"),
    ("S3-alerts", "chat + flood + questions, gateway"),
)
COLORS = {
    "S0": "#333333",
    "S1": "#d62728",
    "S2": "#ff7f0e",
    "S3": "#2ca02c",
    "S3-downscale": "#9467bd",
    "S0-gateway": "#1f77b4",
}


def _round(value: Any, digits: int = 5) -> Any:
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _round(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_round(v, digits) for v in value]
    return value


def write_outputs(results: dict[str, Any], run: Run, options: MixedOptions) -> dict[str, Path]:
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out / f"{options.name}.json",
        "markdown": out / f"{options.name}.md",
        "png": out / f"{options.name}.png",
    }
    paths["json"].write_text(json.dumps(portable(_round(results, 3)), indent=1) + "\n", encoding="utf-8")
    if options.keep_raw:
        paths["raw"] = out / f"{options.name}-raw.json"
        raw = {name: phase.raw() for name, phase in run.phases.items()}
        paths["raw"].write_text(json.dumps(_round(raw, 4), separators=(",", ":")) + "\n", encoding="utf-8")
    paths["markdown"].write_text(markdown(results), encoding="utf-8")
    plot(results, run, paths["png"])
    if (out / f"{options.name}-frontier.png").exists():
        paths["frontier_png"] = out / f"{options.name}-frontier.png"
    results["files"] = {key: str(path) for key, path in paths.items()}
    return paths


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: dict[str, Any]) -> str:
    setups = results["setups"]
    lines = [
        "| set-up | what | chats | TTFT p50 / p99 (ms) | inter-token p50 / p99 (ms) | captions/s | "
        "caption latency p50 / p99 (ms) | load (1 min) |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    extra = [(name, "frontier point") for name in setups if name.startswith("F-")]
    extra += [(name, "reference: cameras throttled by hand") for name in setups if name.startswith("R-")]
    for name, what in (*ROWS, *extra):
        summary = setups.get(name)
        if summary is None:
            continue
        chat = summary.get("chat") or {}
        captions = summary.get("captions") or {}
        ttft = chat.get("ttft_ms") or {}
        itl = chat.get("itl_ms") or {}
        latency = captions.get("latency_ms") or {}
        load = summary.get("loadavg_1m")
        load_text = (
            "-"
            if not load
            else "/".join(_f(v, 1) for v in load)
            if not isinstance(load[0], list)
            else ", ".join("/".join(_f(v, 1) for v in part) for part in load)
        )
        lines.append(
            f"| {name} | {what} | {chat.get('ok', '-') if chat else '-'} | "
            f"{_f(ttft.get('p50'))} / {_f(ttft.get('p99'))} | {_f(itl.get('p50'), 1)} / {_f(itl.get('p99'), 1)} | "
            f"{_f(captions.get('throughput_per_s'), 2) if captions else '-'} | "
            f"{_f(latency.get('p50'))} / {_f(latency.get('p99'))} | {load_text} |"
        )
    return "\n".join(lines)


def goals_table(results: dict[str, Any]) -> str:
    lines = ["| goal | measured | target | met |", "|---|---:|---:|:---:|"]
    for name, goal in results["goals"].items():
        value = goal["value"]
        if isinstance(value, dict):
            unit = goal.get("unit", "x")
            shown = ", ".join(f"{k.replace('_over_s0', '')} {_f(v, 2)}{unit}" for k, v in value.items())
        else:
            shown = _f(value, 3)
        met = {True: "yes", False: "**no**", None: "-"}[goal["met"]]
        if goal.get("not_judged"):
            met = "not judged"
        lines.append(f"| {name} | {shown} | {goal['goal']} | {met} |")
    reasons = {goal["not_judged"] for goal in results["goals"].values() if goal.get("not_judged")}
    lines += [f"\nNot judged: {reason}." for reason in sorted(reasons)]
    unreachable = (results["goals"].get("frontier_dominance") or {}).get("unreachable_levels")
    if unreachable:
        offered = (results.get("options") or {}).get("flood_rate_per_s")
        lines.append(
            f"\nfrontier_dominance cannot be met at {', '.join(f'{level}x' for level in unreachable)} by any "
            f"configuration: vLLM alone met the level serving more than 2/3 of the {offered}/s offered, and no "
            "gateway serves more than is offered."
        )
    return "\n".join(lines)


def frontier_text(results: dict[str, Any]) -> str:
    """The frontier (visioncap.bench.mixed.frontier): each configuration's best captions/s per chat objective, and the
    points it is made of."""
    front = results.get("frontier") or {}
    levels = front.get("levels") or {}
    if not levels:
        return ""
    configs = sorted({c for row in levels.values() for c in row["best"]})
    lines = [
        "Frontier: the most captions/s each configuration delivered during chat while chat's inter-token p99 "
        "stayed within the level x S0 and TTFT p99 within 1.5x S0 (point estimates):",
        "",
        "| level | " + " | ".join(configs) + " | gateway / best vLLM | met (>= 1.5x) | 1.5x within the offer |",
        "|---|" + "---:|" * len(configs) + "---:|:---:|:---:|",
    ]
    for level, row in levels.items():
        cells = [
            "-" if row["best"].get(c) is None else f"{row['best'][c]['captions_per_s']:.2f} ({row['best'][c]['phase']})"
            for c in configs
        ]
        met = {True: "yes", False: "**no**", None: "-"}[row["met"]]
        # "no": vLLM alone served more than 2/3 of the offer, so 1.5x of it is more than the cameras offer.
        reachable = {True: "yes", False: "no", None: "-"}[row.get("reachable")]
        lines.append(
            f"| {level}x | " + " | ".join(cells) + f" | {_f(row['gateway_over_vllm'], 2)} | {met} | {reachable} |"
        )
    lines += [
        "",
        "| point | configuration | setting | captions/s | ITL p99 / S0 [95 %] | TTFT p99 / S0 [95 %] |",
        "|---|---|---|---:|---:|---:|",
    ]
    for point in front.get("points") or []:
        lines.append(
            f"| {point['phase']} | {point['config']} | {point['setting']} | {_f(point['captions_per_s'], 2)} | "
            f"{_with_interval(point['itl_p99_ratio'], point['itl_interval'])} | "
            f"{_with_interval(point['ttft_p99_ratio'], point['ttft_interval'])} |"
        )
    return "\n".join(lines) + "\n\n"


def _with_interval(value: float | None, interval: list[float] | None) -> str:
    bracket = "" if not interval else f" [{interval[0]:.2f}-{interval[1]:.2f}]"
    return _f(value, 2) + bracket


def ceiling_text(results: dict[str, Any]) -> str:
    found = results.get("ceilings")
    if not found:
        return ""
    lines = [
        f"Cost-model ceilings (visioncap.serve.ceiling): decode step {found['step_ms']} ms (S0's median gap), a frame "
        f"costs {found['frame_steps']} decode steps ({found['frame_steps_source']}):",
        "",
        "| level | deterministic steps (GPU-like): frames/s, step share | S0 gaps here: frames/s, step share |",
        "|---|---:|---:|",
    ]
    for level, row in found["levels"].items():
        det, mea = row["deterministic"], row["measured"]
        lines.append(
            f"| {level}x | {det['frames_per_s']:.2f}, {det['step_share']:.3f} ({det['bound']}) | "
            f"{mea['frames_per_s']:.2f}, {mea['step_share']:.3f} ({mea['bound']}) |"
        )
    return "\n".join(lines) + "\n\n"


def _fidelity_text(fidelity: dict[str, Any] | None) -> str:
    """The stand-in fidelity table, measured at the start of the run (nothing when it was not measured)."""
    if not fidelity:
        return ""
    lines = [
        f"Stand-in fidelity against {fidelity['target']['source']} (decode step {_f(fidelity['step_ms'], 2)} ms "
        f"here, spread {_f(fidelity['step_spread'], 2)}; tolerance +-{fidelity['tolerance']:.0%}):",
        "",
        "| figure (decode steps) | target | measured | ratio | within |",
        "|---|---:|---:|---:|:---:|",
    ]
    for name, measured in fidelity["measured"].items():
        within = "yes" if fidelity["within"][name] else "**no**"
        lines.append(
            f"| {name} | {_f(fidelity['target'][name], 2)} | {_f(measured, 2)} | "
            f"{_f(fidelity['ratio'][name], 2)} | {within} |"
        )
    return "\n".join(lines) + "\n\n"


def _attempts_text(attempts: list[dict[str, Any]]) -> str:
    """Each fidelity measurement of the run's start, when the workload was resized after a miss (else nothing)."""
    if len(attempts) < 2:
        return ""
    lines = [
        "The stand-in was resized on the run's first server after missing its target"
        " (visioncap.bench.standin.sizing.refit):",
        "",
        "| attempt | frame | filler words | chat prompt tokens | decode step ms | encoder / prefill / chat ratio |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for number, attempt in enumerate(attempts, 1):
        probe, ratio = attempt["probe"], attempt["ratio"]
        ratios = " / ".join(_f(ratio[name], 2) for name in ratio)
        lines.append(
            f"| {number} | {probe['frame_width']}x{probe['frame_height']} | {probe['frame_filler_words']} | "
            f"{probe['chat_prompt_tokens']} | {_f(attempt['step_ms'], 2)} | {ratios} |"
        )
    return "\n".join(lines) + "\n\n"


def host_costs_table(results: dict[str, Any]) -> str:
    """Per set-up: vLLM's own inter-token mean (stamped before any relay) and CPU seconds per process group."""
    rows = [(name, s["host"]) for name, s in (results.get("setups") or {}).items() if (s or {}).get("host")]
    if not rows:
        return ""
    groups = sorted({group for _, host in rows for group in host.get("cpu_s") or {}})
    lines = [
        "What each set-up cost the host: vLLM's own inter-token mean (`vllm:inter_token_latency_seconds`, "
        "stamped before any relay) and CPU seconds per process group over the phase.\n",
        "| set-up | vLLM ITL mean (ms) | " + " | ".join(groups) + " |",
        "|---|---:|" + "---:|" * len(groups),
    ]
    for name, host in rows:
        cpu = host.get("cpu_s") or {}
        cells = " | ".join(_f(cpu.get(group), 1) for group in groups)
        lines.append(f"| {name} | {_f(host.get('vllm_itl_mean_ms'), 2)} | {cells} |")
    return "\n".join(lines) + "\n\n"


def alerts_table(results: dict[str, Any]) -> str:
    """The three classes side by side (#46 item 3): chat against S0, captions against the two-class run, the
    questions against themselves alone on the same server; nothing when the run had no questions."""
    setups, ratios = results["setups"], results.get("ratios") or {}
    if "S3-alerts" not in setups and "S2-alerts" not in setups:
        return ""
    lines = [
        "Three classes: watch rules' questions (1-3 frames, forced answer) beside chat and the flood. Chat's p99s "
        "over S0's, captions/s over the same set-up's without questions, question latency over the same questions "
        "alone on the same server, one at a time (V-alone*).\n",
        "| set-up | chat TTFT / ITL p99 vs S0 | captions/s (vs two-class) | questions answered (frames mean) | "
        "question latency p50 / p99 ms (alone) | p99 vs alone | late / deadline |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, two_class, alone in (("S2-alerts", "S2", "V-alone-priority"), ("S3-alerts", "S3", "V-alone")):
        summary = setups.get(name)
        if summary is None:
            continue
        key = name.lower().replace("-", "_")
        captions = summary.get("captions") or {}
        questions = summary.get("verifications") or {}
        latency = questions.get("latency_ms") or {}
        alone_latency = ((setups.get(alone) or {}).get("verifications") or {}).get("latency_ms") or {}
        ttft, itl = ratios.get(f"{key}_ttft_p99_over_s0"), ratios.get(f"{key}_itl_p99_over_s0")
        share = ratios.get(f"{key}_throughput_over_{two_class.lower()}")
        lines.append(
            f"| {name} | {_f(ttft, 2)}x / {_f(itl, 2)}x "
            f"| {_f(captions.get('throughput_per_s'), 2)} ({_f(share, 2)}x) "
            f"| {questions.get('answered', '-')} ({_f(questions.get('frames_mean'), 1)}) "
            f"| {_f(latency.get('p50'))} / {_f(latency.get('p99'))} ({_f(alone_latency.get('p50'))} / "
            f"{_f(alone_latency.get('p99'))}) | {_f(ratios.get(f'{key}_verify_p99_over_alone'), 2)}x "
            f"| {questions.get('late', '-')} / {_f(questions.get('deadline_s'))} s |"
        )
    return "\n".join(lines) + "\n\n"


def _frames_text(results: dict[str, Any]) -> str:
    """What a caption is when each request carries several frames (`--frames-per-caption`); nothing for one."""
    per = (results.get("options") or {}).get("frames_per_caption", 1)
    if per <= 1:
        return ""
    return (
        f"Each caption request carries {per} frames (an event described from its frames): captions/s count "
        f"requests, {per} frames each; the cost-model ceilings and frontier count frames of one request each, and "
        "the gateway paces frames.\n\n"
    )


def _misses_text(results: dict[str, Any]) -> str:
    found = results.get("miss_sources")
    if not found:
        return ""
    return f"Where the gaps above the objective fell ({found['method']}):\n\n{misses_table(found)}\n"


def markdown(results: dict[str, Any]) -> str:
    calibration = results.get("calibration") or {}
    model = results["model"]
    pairs = "; ".join(
        f"{p['gateway']}/{p['direct']}: TTFT {_f(p['ttft_p50_ratio'], 2)}, ITL {_f(p['itl_p50_ratio'], 2)}, "
        f"vLLM's own ITL mean {_f(p.get('vllm_itl_mean_ratio'), 2)}"
        for p in results.get("overhead_block_pairs") or []
    )
    return (
        f"# visioncap bench mixed: {results['started_at']}\n\n"
        f"Command: `{results['command']}` (wall {results['wall_s']:.0f} s; machine: {results['machine']['cpu_count']} "
        f"CPUs, {results['machine']['platform']}).\n\n"
        f"Model: profile `{model['profile']}`, built with `{' '.join(model['build_args'] or [])}`. Alone on the "
        f"server: decode step {_f(calibration.get('decode_step_ms'), 1)} ms, text prefill "
        f"({calibration.get('text_prefill_prompt_tokens')} tokens) {_f(calibration.get('text_prefill_ms'))} ms, "
        f"640x480 image prompt ({calibration.get('image_prefill_prompt_tokens')} tokens) "
        f"{_f(calibration.get('image_prefill_ms'))} ms = "
        f"{_f(calibration.get('image_prefill_over_decode_step'), 1)} decode steps.\n\n"
        f"{_attempts_text(results.get('fidelity_attempts') or [])}{_fidelity_text(results.get('fidelity'))}"
        f"{_frames_text(results)}"
        f"Gateway objectives in S3: {json.dumps(results.get('gateway_objectives'))}.\n\n"
        f"{table(results)}\n\n{alerts_table(results)}{goals_table(results)}\n\n"
        f"{ceiling_text(results)}{frontier_text(results)}"
        f"S0 blocks, gateway / direct p50 per ABBA pair: {pairs}.\n\n"
        f"{host_costs_table(results)}{_misses_text(results)}"
        f"S3 gateway probes (every 0.5 s): {json.dumps(results.get('s3_gateway_timeline'))}.\n"
    )


def plot(results: dict[str, Any], run: Run, path: Path) -> None:
    """The bench's six panels (chat latency, caption latency and throughput, the gateway's caps in S3, its
    overhead) in `path`, and the frontier plot beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = run.phases
    fig, axes = plt.subplots(2, 3, figsize=(17, 9.5))
    ax_ttft, ax_itl, ax_cap = axes[0]
    ax_bar, ax_gw, ax_over = axes[1]
    _chat_latency(ax_ttft, ax_itl, phases)
    _caption_latency(ax_cap, phases)
    _caption_throughput(ax_bar, results["setups"])
    s3 = phases.get("S3")
    if s3 is not None and s3.probes.get("gateway"):
        _gateway_caps(ax_gw, s3)
    pairs = results.get("overhead_pairs") or []
    if pairs:
        _gateway_overhead(ax_over, pairs)
    fig.suptitle(
        f"visioncap bench mixed - {results['started_at']} - model {results['model']['profile']} - "
        f"ratios from one run on a shared {results['machine']['cpu_count']}-CPU machine",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    plot_frontier(results, path.with_name(path.stem + "-frontier.png"))


def _chat_latency(ax_ttft: Axes, ax_itl: Axes, phases: dict[str, PhaseResult]) -> None:
    """Chat time to first token and inter-token gaps, one distribution per setup."""
    for name in ("S0", "S1", "S2", "S3", "S3-downscale", "S0-gateway"):
        phase = phases.get(name)
        if phase is None:
            continue
        ok = [c for c in phase.chats if c.ttft_s is not None and c.error is None]
        style: dict[str, Any] = {"color": COLORS.get(name), "linestyle": "--" if name == "S0-gateway" else "-"}
        if ok:
            x, y = ecdf([c.ttft_s * 1000 for c in ok if c.ttft_s is not None])
            ax_ttft.step(x, y, where="post", label=f"{name} (n={len(x)})", **style)
            gaps = [g * 1000 for c in ok for g in c.gaps_s]
            if gaps:
                x, y = ecdf(gaps)
                ax_itl.step(x, y, where="post", label=f"{name} (n={len(x)})", **style)
    for ax, title in ((ax_ttft, "chat time to first token"), (ax_itl, "chat inter-token gap")):
        ax.set_xscale("log")
        ax.set_xlabel("ms (log)")
        ax.set_ylabel("fraction")
        ax.set_title(title)
        ax.axhline(0.99, color="#999999", linewidth=0.6)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")


def _caption_latency(ax_cap: Axes, phases: dict[str, PhaseResult]) -> None:
    """Caption latency after each phase's warm-up, chat active (solid) and idle (dotted)."""
    for name in ("S1", "S2", "S3", "S3-downscale", "S1-idle", "S3-idle"):
        phase = phases.get(name)
        if phase is None:
            continue
        latencies = [
            c.latency_s * 1000
            for c in phase.captions
            if c.latency_s is not None and phase.warmup_s <= (c.done_at or 0) <= phase.duration_s
        ]
        if latencies:
            x, y = ecdf(latencies)
            idle = name.endswith("idle")
            color = COLORS.get(name.removesuffix("-idle"))
            ax_cap.step(x, y, where="post", label=f"{name} (n={len(x)})", color=color, linestyle=":" if idle else "-")
    ax_cap.set_xscale("log")
    ax_cap.set_xlabel("ms (log)")
    ax_cap.set_title("caption latency (send to answer)")
    ax_cap.grid(True, which="both", alpha=0.3)
    ax_cap.legend(fontsize=8, loc="lower right")


def _caption_throughput(ax_bar: Axes, setups: dict[str, Any]) -> None:
    names = [n for n in ("S1", "S2", "S3", "S3-downscale", "S1-idle", "direct-idle-priority", "S3-idle") if n in setups]
    values = [(setups[n].get("captions") or {}).get("throughput_per_s") or 0.0 for n in names]
    colors = [COLORS.get(n.removesuffix("-idle"), "#7f7f7f") for n in names]
    bars = ax_bar.bar(range(len(names)), values, color=colors)
    for bar, value in zip(bars, values, strict=True):
        ax_bar.text(bar.get_x() + bar.get_width() / 2, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    ax_bar.set_xticks(range(len(names)), [n.replace("direct-idle-priority", "idle direct\n(prio srv)") for n in names])
    ax_bar.set_ylabel("images/s")
    ax_bar.set_title("caption throughput (chat active / idle)")


def _gateway_caps(ax_gw: Axes, s3: PhaseResult) -> None:
    """S3's gateway probes over time: background cap, in flight, paced starts (or AIMD limit), chat streams."""
    samples = [(t, v) for t, v in s3.probes["gateway"] if isinstance(v, dict) and "cap" in v]
    times = [t for t, _ in samples]
    ax_gw.step(times, [v.get("cap") or 0 for _, v in samples], where="post", label="background cap")
    ax_gw.step(times, [v.get("in_flight") or 0 for _, v in samples], where="post", label="background in flight")
    if any(v.get("starts_per_s") is not None for _, v in samples):
        rate = [v.get("starts_per_s") or 0 for _, v in samples]
        ax_gw.step(times, rate, where="post", label="paced starts/s", alpha=0.8)
    else:
        ax_gw.step(times, [v.get("limit") or 0 for _, v in samples], where="post", label="AIMD limit", alpha=0.6)
    for chat in s3.chats:
        if chat.finished_at is not None:
            ax_gw.plot([chat.sent_at, chat.finished_at], [-0.3, -0.3], color="#2ca02c", linewidth=4, alpha=0.4)
    ax_gw.set_xlabel("s since S3 start (green: chat streams)")
    ax_gw.set_title("S3: gateway's background caps over time")
    ax_gw.legend(fontsize=8, loc="upper right")
    ax_gw.grid(True, alpha=0.3)


def _gateway_overhead(ax_over: Axes, pairs: list[dict[str, Any]]) -> None:
    """Direct against through-the-gateway TTFT and inter-token time of the ABBA pairs."""
    for offset, metric, label in ((0, "ttft", "TTFT"), (1, "itl", "inter-token (median)")):
        direct = [p[f"direct_{metric}_s"] * 1000 for p in pairs]
        through = [p[f"gateway_{metric}_s"] * 1000 for p in pairs]
        ax_over.boxplot(
            [direct, through], positions=[offset * 3, offset * 3 + 1], widths=0.7, tick_labels=["direct", "gw"]
        )
        ax_over.text(offset * 3 + 0.5, max(direct + through), label, ha="center", va="bottom", fontsize=8)
    ax_over.set_yscale("log")
    ax_over.set_ylabel("ms (log)")
    ax_over.set_title("gateway overhead: single requests, ABBA pairs")


def plot_frontier(results: dict[str, Any], path: Path) -> None:
    """Captions/s against chat's inter-token and TTFT p99 (x S0), every point of every configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = (results.get("frontier") or {}).get("points") or []
    if not points:
        return
    markers = {"vllm-fcfs": ("o", "#d62728"), "vllm-priority": ("s", "#ff7f0e"), "gateway": ("^", "#2ca02c")}
    spare = iter([("v", "#8c564b"), ("P", "#e377c2"), ("X", "#7f7f7f"), ("*", "#bcbd22"), ("h", "#17becf")] * 3)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    for ax, metric, label, limits in (
        (axes[0], "itl", "chat inter-token p99 / S0", (1.25, 1.5, 2.0, 3.0)),
        (axes[1], "ttft", "chat TTFT p99 / S0", (1.5,)),
    ):
        for config in sorted({p["config"] for p in points}):
            mine = [p for p in points if p["config"] == config and p[f"{metric}_p99_ratio"] is not None]
            if config not in markers:
                markers[config] = next(spare, ("D", "#9467bd"))
            marker, color = markers[config]
            xs = [p[f"{metric}_p99_ratio"] for p in mine]
            ys = [p["captions_per_s"] or 0 for p in mine]
            errors = [
                [max(0.0, x - (p[f"{metric}_interval"] or [x, x])[0]) for x, p in zip(xs, mine, strict=True)],
                [max(0.0, (p[f"{metric}_interval"] or [x, x])[1] - x) for x, p in zip(xs, mine, strict=True)],
            ]
            ax.errorbar(xs, ys, xerr=errors, fmt=marker, color=color, label=config, capsize=3, alpha=0.8)
            for x, y, p in zip(xs, ys, mine, strict=True):
                ax.annotate(p["phase"], (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        for limit in limits:
            ax.axvline(limit, color="#888888", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_xlabel(label + " (log; bars: bootstrap 95 %)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("captions/s during chat")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"visioncap bench mixed - frontier - {results['started_at']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
