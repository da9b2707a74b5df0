"""benchmarks/results/fleet.md from fleet.json: one table per part, each with the command, date and load."""

from __future__ import annotations

from typing import Any


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _header(part: dict[str, Any]) -> list[str]:
    return [
        f"Command: `{part['command']}`",
        "",
        f"Date: {part['date']}; `uptime` at start: `{part['uptime_start']}`; at end: `{part['uptime_end']}`",
        "",
    ]


def _capacity(part: dict[str, Any]) -> list[str]:
    s = part["settings"]
    lines = ["## Cameras per worker on this CPU (measured)", "", *_header(part)]
    lines += [
        f"One `visioncap worker --capacity N` with N live MJPEG cameras (640x480, 10 fps, served from the bench "
        f"process: 4 s of nobody, then 4 s of two people, looped, each camera at its own phase), "
        f"`analyze_fps: {s['analyze_fps']:g}` per camera, the person detector (`best.pt`, image size 320, PyTorch "
        f"on the CPU), the default selection policy, the tiny vLLM (on the same 2 cores) writing "
        f"{s['max_tokens']}-token captions, PostgreSQL. {s['duration_s']:g} s measured per point after every "
        "camera's first analysed frame and 3 s more.",
        "",
        "| cameras | analysed fps per camera, mean (min-max) | worker CPU per camera (CPU s / s) | worker CPU "
        "total | outbox rows per camera per s | first caption: selected p50 / p95 (s) | captioned p50 / p95 (s) "
        "| arrivals (missed) |",
        "| ---: | --- | ---: | ---: | ---: | --- | --- | --- |",
    ]
    for p in part["points"]:
        fps, fc = p["analysed_fps_per_camera"], p["first_caption"]
        sel, cap = fc["selected_s"], fc["captioned_s"]
        lines.append(
            f"| {p['cameras']} | {fps['mean']:.2f} ({fps['min']:.2f}-{fps['max']:.2f}) | {p['cpu_per_camera']:.3f} "
            f"| {p['worker_cpu_share']:.2f} | {p['captions_selected_per_camera_s']:.3f} | {_f(sel['p50'])} / "
            f"{_f(sel['p95'])} | {_f(cap['p50'])} / {_f(cap['p95'])} | {fc['arrivals']} ({fc['missed']}) |"
        )
    lines += [
        "",
        "Analysed fps: the worker's `visioncap_frames_analysed_total{camera}` over the window. First caption: from "
        "the wall time the camera server wrote the first frame with people after nobody to that camera's first "
        "caption row whose frame was captured within the people stretch; `selected` = the row's `created_at` (the "
        "outbox row, before the VLM), `captioned` = its `updated_at` once `captioned` (the stored caption). Missed: "
        "arrivals with no such row 8 s after the window: a camera analysed too rarely for "
        "`stable_frames` (3) analysed frames within the 4 s visit never makes an event of it. "
        "CPU: the worker process's user + system seconds (psutil) "
        "over the window; 2.00 would be both cores of this machine.",
        "",
    ]
    return lines


def _trials(fault: dict[str, Any]) -> str:
    return ", ".join(
        f"({_f(t['lease_s'], 1)}, {_f(t.get('camera_started_s'), 1)}, {_f(t['first_frame_s'], 1)})"
        for t in fault["trials"]
    )


def _takeover(part: dict[str, Any]) -> list[str]:
    lines = ["## Takeover time (measured)", "", *_header(part)]
    lines += [
        f"One camera, two `visioncap worker --capacity 1` processes, lease {part['lease_s']:g} s, renewal every "
        f"{part['renew_s']:g} s, stop margin {part['stop_margin_s']:g} s. The owner is killed (`kill -9`) or cut "
        "off (it runs in its own network namespace; its veth link is taken down), at a random point of its "
        "renewal cycle; times from the fault to the other worker holding the camera's lease (`camera_leases` row) "
        "and to the new owner's first analysed frame (its own metrics).",
        "",
        "| fault | trials | lease taken p50 / max (s) | camera started by the new owner p50 / max (s) | first frame "
        "analysed by the new owner p50 / max (s) |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for fault in ("kill", "cut"):
        f = part[fault]
        lease, started, frame = f["lease"], f["camera_started"], f["first_frame"]
        lines.append(
            f"| {'kill -9' if fault == 'kill' else 'network cut'} | {len(f['trials'])} | {_f(lease['p50'])} / "
            f"{_f(lease['max'])} | {_f(started['p50'])} / {_f(started['max'])} | {_f(frame['p50'])} / "
            f"{_f(frame['max'])} (n={frame['n']}) |"
        )
    lines += [
        "",
        "Per trial (lease, camera started, first frame; s): "
        + "; ".join(f"{fault}: {_trials(part[fault])}" for fault in ("kill", "cut")),
        "",
    ]
    return lines


def _model(part: dict[str, Any]) -> list[str]:
    lines = [f"## Cameras per GPU at the {part['level']:g}x chat objective (MODEL OUTPUT, not measured)", ""]
    lines += _header(part)
    rates = part["rates"]
    lines += [
        "Frames per second that chat's inter-token p99 lives beside at the objective (`visioncap/serve/ceiling.py` "
        "with steady GPU steps, on `visioncap/serve/costmodel.py`'s decode step and frame cost, as `visioncap serve "
        "--profile P --gpu G --dry-run` prints it), divided by each camera's caption rate:",
        "",
        *[f"- {r['name']}: {r['per_s']:.3f} captions/s per camera ({r['why']})" for r in rates],
        "",
        "| profile | GPU | decode step (ms, batch) | frame cost (decode steps) | ceiling (frames/s) | "
        + " | ".join(f"cameras: {r['name']}" for r in rates)
        + " |",
        "| --- | --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in rates) + " |",
    ]
    for row in part["rows"]:
        lines.append(
            f"| {row['profile']} | {row['gpu']} | {row['decode_step_ms']:.2f} ({row['batch']}) | "
            f"{row['frame_steps']:.2f} | {row['ceiling_frames_per_s']:.2f} | "
            + " | ".join(f"{row['cameras'][r['name']]:.1f}" for r in rates)
            + " |"
        )
    lines.append("")
    return lines


CARRIES_OVER = """## What carries over to a GPU box

- **Cameras per worker** does not carry over as a number. Here the person detector runs on the CPU (PyTorch,
  one thread: about 10 frames/s for the pipeline at image size 320, `benchmarks/results/detector_throughput.md`)
  beside the tiny vLLM and other work on the same 2 cores, so the cameras share one detector's frames: analysed
  fps per camera falls as cameras are added, and the worker's CPU is mostly the detector. On a GPU box the
  detector runs on the GPU (`detector.device`), batched across cameras by the frame hub, and the worker's CPU
  goes to decoding streams, tracking, selection and JPEG encoding; rerun this part there (`--cameras 1,2,4,8,16`).
- **First-caption delay** carries over in its shape: most of it is the selection policy (`stable_frames` analysed
  frames, then `best_frame_window_s`), paid in analysed frames, so it shrinks where each camera is analysed at its
  full `analyze_fps`; the caption itself is a GPU VLM call there instead of the tiny CPU model here.
- **Takeover** carries over: the lease time is set by `lease_s`/`renew_s` and PostgreSQL's clock, not by the
  machine (expect between `lease_s - renew_s` and `lease_s + renew_s` after the last renewal). The gap from the
  lease to the first analysed frame is opening the stream and waiting for the detector's turn; a worker warms its
  detector before its first lease (`PersonDetector.warm_up`, since commit 69a1bc4), so the model's first call
  (seconds on a CPU, CUDA/cuDNN initialisation on a GPU) is no longer in it.
- **Cameras per GPU** is model output for the target GPU already; it holds only as far as the cost model does
  (`visioncap serve --profile P --gpu G --dry-run`, docs/cost-model.md), and it counts the VLM only: the
  detector on the same GPU takes some of its time, not modelled here.
"""


def render(data: dict[str, Any]) -> str:
    parts = data.get("parts", {})
    lines = ["# Fleet benchmarks", ""]
    if "capacity" in parts:
        lines += _capacity(parts["capacity"])
    if "takeover" in parts:
        lines += _takeover(parts["takeover"])
    if "model" in parts:
        lines += _model(parts["model"])
    return "\n".join(lines) + "\n" + CARRIES_OVER
