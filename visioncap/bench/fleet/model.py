"""Cameras per GPU at a chat objective, from the cost model: model output, not a measurement.

The ceiling (visioncap.serve.ceiling, with steady GPU steps) is the frames per second that chat's inter-token p99
lives beside at `level` x chat alone, for the profile's frame on that GPU class (visioncap.serve.costmodel, the
same figures `visioncap serve --profile P --gpu G --dry-run` prints). Cameras = ceiling / captions per second per
camera, for several caption rates the default selection policy allows (visioncap.config.selection).
"""

from __future__ import annotations

from typing import Any

from visioncap.bench.common.machine import REPO
from visioncap.config.profiles import load_profile
from visioncap.config.selection import SelectionConfig
from visioncap.serve.ceiling import ceiling
from visioncap.serve.costmodel import decode_step_ms, for_profile


def caption_rates(measured_per_camera: float | None) -> list[dict[str, Any]]:
    """Captions/s per camera: the most the default policy allows, what this bench's cameras made, and one person
    standing in view; each with why."""
    policy = SelectionConfig()
    rates = [
        {
            "name": "busy (policy cap)",
            "per_s": 1.0 / policy.min_interval_s,
            "why": f"min_interval_s = {policy.min_interval_s:g} s: the most one camera can ask for, new people "
            "arriving all the time",
        }
    ]
    if measured_per_camera:
        rates.append(
            {
                "name": "bench scene (measured)",
                "per_s": measured_per_camera,
                "why": "outbox rows per camera per second in this run's cameras-per-worker table (two people "
                "arriving every 8 s)",
            }
        )
    if policy.recaption_interval_s:
        rates.append(
            {
                "name": "one person staying",
                "per_s": 1.0 / policy.recaption_interval_s,
                "why": f"recaption_interval_s = {policy.recaption_interval_s:g} s",
            }
        )
    return rates


def cameras_per_gpu(
    profiles: list[str], gpus: list[str], level: float, measured_per_camera: float | None
) -> dict[str, Any]:
    rates = caption_rates(measured_per_camera)
    rows = []
    for name in profiles:
        profile = load_profile(name, REPO / "models")
        for gpu in gpus:
            cost = for_profile(profile, gpu)
            if not (cost.frame_encoder_steps and cost.frame_prefill_steps):
                continue
            batch = cost.workload.typical_batch
            step = cost.decode_ms.get(batch) or decode_step_ms(
                cost.shape.text, cost.gpu, batch, cost.workload.context_tokens, cost.efficiency
            )
            # As `serve --dry-run` prints it: the frame's encoder and prefill in decode steps at the typical batch.
            frame_steps = cost.frame_encoder_steps[1] + cost.frame_prefill_steps[1]
            top = ceiling(level, step / 1000, frame_steps)
            rows.append(
                {
                    "profile": name,
                    "gpu": gpu,
                    "decode_step_ms": step,
                    "batch": batch,
                    "frame_steps": frame_steps,
                    "ceiling_frames_per_s": top.frames_per_s,
                    "bound": top.bound,
                    "cameras": {r["name"]: top.frames_per_s / r["per_s"] for r in rates},
                }
            )
    return {"level": level, "rates": rates, "rows": rows, "model_output": True}
