"""VLM requests and image tokens per minute of people, by selection policy, on the same tracked detections.

The scene video (`detection/scenes.py`) goes once through the real source, detector and tracker; the tracked
detections are then replayed (pixels decoded again) into every policy side by side:

- the real `EventSelector` with the default `SelectionConfig` and a few other settings;
- "every person frame": a request for each analysed frame with a tracked person (what selection saves);
- "1 per second": a request per second per camera while tracked people are in view (a naive rate limit).

For each policy: requests and image tokens per minute of video with people (tokens of the composed full frame,
`encode_jpeg(..., max_image_tokens=256, token_size=28)`, as the runner sends it), the share of person events that
got at least one caption (ground-truth events from the scene, and tracker events: tracks seen in `stable_frames`
frames), and time to first caption per ground-truth event: from the event's first frame in view to the frame that
was selected (what the caption shows) and to the moment it was selected (when the request would be queued).

Run: `.venv/bin/python -m visioncap.bench.detection.caption_budget [--quick]`
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, cast

from visioncap.bench.common.outputs import command_line, write_results
from visioncap.bench.common.stats import percentile
from visioncap.bench.detection.scenes import DATA_DIR, Scene, assign_tracks, detection_quality, track_spans
from visioncap.bench.detection.shared import (
    TrackedFrame,
    detect_and_track,
    detector_config,
    detector_machine_facts,
    replay,
)
from visioncap.caption.encode import compose, encode_jpeg
from visioncap.config.caption import ImageMode
from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.frames import Detection, PersonBox
from visioncap.select.events import EventSelector

MAX_IMAGE_TOKENS = 256
TOKEN_SIZE = 28
GOAL_EVENTS = 1.0
GOAL_TOKEN_REDUCTION = 50.0
EVERY_FRAME = "every person frame"


@dataclass(frozen=True, slots=True)
class Pick:
    """One VLM request: the frame it shows, when it was chosen, and who is in the picture."""

    frame_index: int
    frame_s: float
    chosen_s: float
    track_ids: tuple[int, ...]
    reason: str
    detection: Detection = field(repr=False, compare=False)


class Policy:
    """Sees every tracked detection in order; returns the frames it would send to the VLM."""

    name = ""

    def offer(self, detection: Detection) -> list[Pick]:
        raise NotImplementedError

    def flush(self, now_s: float) -> list[Pick]:
        return []


class EventPolicy(Policy):
    """The pipeline's own selector, fed as `PipelineRunner._handle` feeds it (and flushed at stream end)."""

    def __init__(self, name: str, config: SelectionConfig) -> None:
        self.name = name
        self.config = config
        self._selector = EventSelector(config)

    def offer(self, detection: Detection) -> list[Pick]:
        return [_pick(s.detection, detection.frame.offset_s, s.reason) for s in self._selector.offer(detection)]

    def flush(self, now_s: float) -> list[Pick]:
        return [_pick(s.detection, now_s, s.reason) for s in self._selector.flush()]


class EveryFrame(Policy):
    name = EVERY_FRAME

    def offer(self, detection: Detection) -> list[Pick]:
        return [_pick(detection, detection.frame.offset_s, "person")] if detection.people else []


class PerSecond(Policy):
    name = "1 per second"

    def __init__(self, interval_s: float = 1.0) -> None:
        self._interval_s = interval_s
        self._last_s: float | None = None

    def offer(self, detection: Detection) -> list[Pick]:
        now = detection.frame.offset_s
        if not detection.people or (self._last_s is not None and now - self._last_s < self._interval_s - 1e-9):
            return []
        self._last_s = now
        return [_pick(detection, now, "interval")]


def _pick(detection: Detection, chosen_s: float, reason: str) -> Pick:
    ids = tuple(sorted(p.track_id for p in detection.people if p.track_id is not None))
    return Pick(detection.frame.index, detection.frame.offset_s, chosen_s, ids, reason, detection)


def policies() -> list[Policy]:
    default = SelectionConfig()
    return [
        EventPolicy("events (default)", default),
        EventPolicy("events, recaption 30 s", default.model_copy(update={"recaption_interval_s": 30.0})),
        EventPolicy("events, no recaption", default.model_copy(update={"recaption_interval_s": None})),
        EventPolicy("events, per person", default.model_copy(update={"per_person": True})),
        PerSecond(),
        EveryFrame(),
    ]


# -- detections (computed once, cached on request) ---------------------------------------------------------------


def _cache_path(scene: Scene, config: DetectorConfig, analyze_fps: float | None, event_end_s: float) -> Path:
    key = {
        "scene": scene.spec_hash(),
        "detector": config.model_dump(),
        "analyze_fps": analyze_fps,
        "event_end_s": event_end_s,
        "ultralytics": metadata.version("ultralytics"),
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return DATA_DIR / "cache" / f"tracked-{scene.name}-{digest}.json"


def tracked_frames(
    scene: Scene, video: Path, config: DetectorConfig, analyze_fps: float | None, reuse: bool
) -> tuple[list[TrackedFrame], dict[str, Any]]:
    event_end_s = SelectionConfig().event_end_s
    cache = _cache_path(scene, config, analyze_fps, event_end_s)
    if reuse and cache.is_file():
        data = json.loads(cache.read_text())
        frames = [
            TrackedFrame(
                f["index"],
                f["offset_s"],
                tuple(PersonBox(**p) for p in f["raw"]),
                tuple(PersonBox(**p) for p in f["tracked"]),
            )
            for f in data["frames"]
        ]
        return frames, {**data["timing"], "reused_cache": str(cache.relative_to(DATA_DIR.parent.parent))}
    frames, timing = detect_and_track(video, config, analyze_fps=analyze_fps, event_end_s=event_end_s)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"timing": timing, "frames": [asdict(f) for f in frames]}))
    return frames, {**timing, "reused_cache": None}


# -- evaluation --------------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    name: str
    picks: list[Pick] = field(default_factory=list)
    tokens: int = 0


def run_policies(
    video: Path, frames: Sequence[TrackedFrame], chosen: Sequence[Policy], tokens_of: Callable[[Detection], int]
) -> list[Outcome]:
    outcomes = [Outcome(p.name) for p in chosen]
    # Every policy sends the composed full frame, so a frame costs the same whoever picks it: encode it once.
    cost: dict[int, int] = {}

    def keep(outcome: Outcome, picks: list[Pick]) -> None:
        for pick in picks:
            outcome.picks.append(pick)
            if pick.frame_index not in cost:
                cost[pick.frame_index] = tokens_of(pick.detection)

    last_s = 0.0
    for detection in replay(video, frames):
        last_s = detection.frame.offset_s
        for policy, outcome in zip(chosen, outcomes, strict=True):
            keep(outcome, policy.offer(detection))
    for policy, outcome in zip(chosen, outcomes, strict=True):
        keep(outcome, policy.flush(last_s))
    for outcome in outcomes:
        outcome.tokens = sum(cost[p.frame_index] for p in outcome.picks)
    return outcomes


def full_frame_tokens(detection: Detection) -> int:
    picture = compose(detection.frame.image, detection.people, ImageMode.FULL)
    return encode_jpeg(picture, MAX_IMAGE_TOKENS, TOKEN_SIZE).image_tokens


def evaluate(
    scene: Scene, frames: Sequence[TrackedFrame], outcome: Outcome, every_frame_tokens: int, stable_frames: int
) -> dict[str, Any]:
    gt = scene.ground_truth()
    person_minutes = sum(e.end_frame - e.start_frame + 1 for e in gt) / scene.fps / 60
    video_minutes = scene.frame_count / scene.fps / 60
    spans = track_spans(frames)
    owner = assign_tracks(scene, frames)
    stable = {t for t, s in spans.items() if s[2] >= stable_frames}
    captioned_tracks = {t for p in outcome.picks for t in p.track_ids}
    per_event = []
    for event in gt:
        inside = [p for p in outcome.picks if event.start_frame <= p.frame_index <= event.end_frame and p.track_ids]
        first = min(inside, key=lambda p: p.chosen_s, default=None)
        event_tracks = {t for t in stable if owner.get(t) == event.index}
        per_event.append(
            {
                "event": event.index,
                "label": event.label,
                "people": event.people,
                "duration_s": round(event.duration_s, 1),
                "captions": len(inside),
                "first_frame_after_s": None if first is None else round(first.frame_s - event.start_s, 2),
                "first_chosen_after_s": None if first is None else round(first.chosen_s - event.start_s, 2),
                "tracks_captioned": f"{len(event_tracks & captioned_tracks)}/{len(event_tracks)}",
            }
        )
    shown = [cast(float, e["first_frame_after_s"]) for e in per_event if e["first_frame_after_s"] is not None]
    chosen = [cast(float, e["first_chosen_after_s"]) for e in per_event if e["first_chosen_after_s"] is not None]
    requests = len(outcome.picks)
    return {
        "policy": outcome.name,
        "requests": requests,
        "requests_per_person_minute": round(requests / person_minutes, 2),
        "requests_per_video_minute": round(requests / video_minutes, 2),
        "image_tokens": outcome.tokens,
        "image_tokens_per_person_minute": round(outcome.tokens / person_minutes, 1),
        "token_reduction_vs_every_frame": round(every_frame_tokens / outcome.tokens, 1) if outcome.tokens else None,
        "gt_events_captioned": sum(1 for e in per_event if e["captions"]) / len(per_event),
        "tracker_events_captioned": len(stable & captioned_tracks) / len(stable) if stable else None,
        "tracker_events_missed": sorted(stable - captioned_tracks),
        "time_to_first_caption_frame_s": {"p50": percentile(shown, 50), "p95": percentile(shown, 95)},
        "time_to_first_caption_chosen_s": {
            "p50": percentile(chosen, 50),
            "p95": percentile(chosen, 95),
            "max": max(chosen, default=None),
        },
        "reasons": dict(Counter(p.reason for p in outcome.picks)),
        "per_event": per_event,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    argv_used = list(argv) if argv is not None else sys.argv[1:]

    facts = detector_machine_facts()
    scene = Scene(quick=args.quick)
    video = scene.video()
    config = detector_config(image_size=args.image_size)
    print(f"{video.name}: {scene.frame_count} frames; detecting and tracking ...", flush=True)
    analyze_fps = args.analyze_fps or None
    frames, timing = tracked_frames(scene, video, config, analyze_fps, args.reuse_detections)
    stable_frames = SelectionConfig().stable_frames
    quality = detection_quality(scene, frames, stable_frames)
    print(
        f"  {quality['events_found']}/{quality['events']} events found, person-frame recall "
        f"{quality['person_frame_recall']}, {quality['stable_tracks']} stable tracks for "
        f"{quality['people_in_events']} people ({timing['wall_s']:.0f} s)",
        flush=True,
    )
    chosen = policies()
    rows = _compare_policies(scene, video, frames, chosen, stable_frames)
    results = {
        "benchmark": "caption_budget",
        "command": command_line("visioncap.bench.detection.caption_budget", argv_used),
        "machine": facts,
        "goals": _goals(rows[0]),
        "scene": _scene_record(scene, video),
        "detector": {
            **config.model_dump(),
            "analyze_fps": analyze_fps,
            **{k: round(v, 1) if isinstance(v, float) else v for k, v in timing.items()},
        },
        "detection_quality": quality,
        "selection_settings": {p.name: p.config.model_dump() for p in chosen if isinstance(p, EventPolicy)},
        "image": {"mode": ImageMode.FULL, "max_image_tokens": MAX_IMAGE_TOKENS, "token_size": TOKEN_SIZE},
        "policies": rows,
    }
    write_results("caption_budget", results, _markdown)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 1-minute scene (3 events): ~1.5 minutes")
    parser.add_argument("--image-size", type=int, default=320, help="detector image size (default 320, the demo's)")
    parser.add_argument(
        "--analyze-fps",
        type=float,
        default=0.0,
        help="frames per second to analyse; default 0: every frame of the 10 fps video, so that the "
        "'every person frame' baseline is every frame (pipelines/*.yaml analyse at 5 fps: half the baseline)",
    )
    parser.add_argument(
        "--reuse-detections", action="store_true", help="reuse cached detections of an earlier run with same inputs"
    )
    return parser


def _compare_policies(
    scene: Scene, video: Path, frames: list[TrackedFrame], chosen: list[Policy], stable_frames: int
) -> list[dict[str, Any]]:
    """Every policy run over the same tracked frames and evaluated against the ground truth, a line each."""
    outcomes = run_policies(video, frames, chosen, full_frame_tokens)
    every = next(o for o in outcomes if o.name == EVERY_FRAME)
    rows = [evaluate(scene, frames, o, every.tokens, stable_frames) for o in outcomes]
    for row in rows:
        print(
            f"  {row['policy']:<24} {row['requests']:>5} requests, {row['requests_per_person_minute']:>7} /min, "
            f"{row['image_tokens_per_person_minute']:>9} tokens/min, x{row['token_reduction_vs_every_frame']} fewer, "
            f"events {row['gt_events_captioned']:.0%} (tracks {row['tracker_events_captioned']:.0%})",
            flush=True,
        )
    return rows


def _goals(default: dict[str, Any]) -> dict[str, Any]:
    """The goals, and whether the default selection (the first policy) meets them."""
    return {
        "events_captioned": GOAL_EVENTS,
        "token_reduction_vs_every_frame": GOAL_TOKEN_REDUCTION,
        "default_meets": default["gt_events_captioned"] >= GOAL_EVENTS
        and (default["tracker_events_captioned"] or 0) >= GOAL_EVENTS
        and (default["token_reduction_vs_every_frame"] or 0) >= GOAL_TOKEN_REDUCTION,
    }


def _scene_record(scene: Scene, video: Path) -> dict[str, Any]:
    return {
        "video": str(video.relative_to(DATA_DIR.parent.parent)),
        "frames": scene.frame_count,
        "fps": scene.fps,
        "size": [scene.width, scene.height],
        "person_minutes": round(sum(e.end_frame - e.start_frame + 1 for e in scene.ground_truth()) / scene.fps / 60, 3),
        "events": [e.as_dict() for e in scene.ground_truth()],
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _markdown(r: dict[str, Any]) -> str:
    """The results as markdown: set-up and goals, a row per policy, a row per event of the default selection."""
    return "\n".join([*_setup(r), *_policy_table(r), *_per_event_table(r), ""])


def _setup(r: dict[str, Any]) -> list[str]:
    """The command, machine, scene, detector, its quality and the goals."""
    m, s, q = r["machine"], r["scene"], r["detection_quality"]
    d = r["detector"]
    return [
        "# Caption budget: VLM requests and image tokens by selection policy",
        "",
        f"Command: `{r['command']}`",
        "",
        f"Date: {m['date']}; machine: {m['cpu']}, {m['cpu_count']} cores; ultralytics {m['ultralytics']}, "
        f"torch {m['torch']}; commit {m['git_commit']}"
        + (" with uncommitted changes under visioncap/" if m["visioncap_uncommitted_changes"] else ""),
        "",
        f"Scene: `{s['video']}`, {s['frames']} frames ({s['frames'] / s['fps'] / 60:.1f} min) at {s['fps']} fps, "
        f"{len(s['events'])} person events, {s['person_minutes']:.2f} min with people. Detector `{d['weights']}` "
        f"classes {d['person_classes']}, image size {d['image_size']}, confidence {d['confidence']}, "
        f"{d['tracker']}, "
        + (f"analysed at {d['analyze_fps']:g} fps" if d["analyze_fps"] else "every frame analysed")
        + f" ({d['wall_s']} s to decode, detect and track)."
        f" Images: full frame, at most {r['image']['max_image_tokens']} tokens of {r['image']['token_size']} px.",
        "",
        f"Detection quality: {q['events_found']}/{q['events']} events found; person-frame recall "
        f"{q['person_frame_recall']:.1%} (after tracking {q['person_frame_recall_after_tracking']:.1%}); "
        f"exact people count in {q['people_count_exact']:.1%} of person frames; detections in "
        f"{q['empty_frames_with_detection']:.1%} of empty frames; {q['stable_tracks']} stable tracks for "
        f"{q['people_in_events']} people ({q['stable_tracks_outside_events']} outside events).",
        "",
        f"Goals (default selection): every event captioned, >= {r['goals']['token_reduction_vs_every_frame']:.0f}x "
        f"fewer image tokens than every person frame: **{'met' if r['goals']['default_meets'] else 'not met'}**.",
        "",
    ]


def _policy_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "| policy | requests | requests / min with people | image tokens / min with people | x fewer tokens "
        "than every frame | events captioned (ground truth) | tracker events captioned | first caption: frame "
        "shown p50 / p95 (s) | first caption: chosen p50 / p95 / max (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in r["policies"]:
        shown, chosen = row["time_to_first_caption_frame_s"], row["time_to_first_caption_chosen_s"]
        lines.append(
            f"| {row['policy']} | {row['requests']} | {row['requests_per_person_minute']:.1f} | "
            f"{row['image_tokens_per_person_minute']:,.0f} | {_fmt(row['token_reduction_vs_every_frame'])} | "
            f"{row['gt_events_captioned']:.0%} | {_fmt((row['tracker_events_captioned'] or 0) * 100, 0)}% | "
            f"{_fmt(shown['p50'])} / {_fmt(shown['p95'])} | "
            f"{_fmt(chosen['p50'])} / {_fmt(chosen['p95'])} / {_fmt(chosen['max'])} |"
        )
    lines += [
        "",
        "Times are video seconds from the first frame in which the event's first person is at least half in view "
        "(ground truth) to the selected frame (what the caption shows) and to the frame at which it was chosen "
        "(when the request would be queued); they include the detector's and tracker's delay (`stable_frames`) "
        "and the selector's best-frame window. Tracker events are tracks seen in at least "
        '`stable_frames` analysed frames. "every person frame" is every *analysed* frame with a tracked person, '
        "so its cost grows with the analysis rate while the event policies' does not.",
        "",
    ]
    return lines


def _per_event_table(r: dict[str, Any]) -> list[str]:
    lines = [
        "Per event, default selection:",
        "",
        "| event | people | in view (s) | captions | first frame shown after (s) | chosen after (s) "
        "| tracks captioned |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in r["policies"][0]["per_event"]:
        lines.append(
            f"| {e['event']}: {e['label']} | {e['people']} | {e['duration_s']} | {e['captions']} | "
            f"{_fmt(e['first_frame_after_s'])} | {_fmt(e['first_chosen_after_s'])} | {e['tracks_captioned']} |"
        )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
