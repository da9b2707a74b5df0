"""What the detector benchmarks share (`detector_throughput`, `caption_budget`, `scenes --check`): offline
Ultralytics settings, the detector config, detect+track over a video, detection quality against the scene's
ground truth, and the machine facts with the detector's.

Importing this module sets the YOLO_* environment defaults, so import it before anything imports ultralytics."""

from __future__ import annotations

import os

from visioncap.bench.machine import REPO

# Before anything imports ultralytics: no downloads, no run-time pip installs, settings inside the repo's data/.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", str(REPO / "data" / "ultralytics"))

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig
from visioncap.frames import Detection, Frame, PersonBox

if TYPE_CHECKING:
    from visioncap.bench.scenes import Scene

WEIGHTS = "pkg:fall_detection/models/best.pt"
PERSON_CLASSES = [0, 1]  # the fall detector's Normal and Fall: both are people


def detector_config(image_size: int = 320, weights: str = WEIGHTS, confidence: float = 0.35) -> DetectorConfig:
    return DetectorConfig(weights=weights, person_classes=PERSON_CLASSES, confidence=confidence, image_size=image_size)


@dataclass(frozen=True, slots=True)
class TrackedFrame:
    """One analysed frame without its pixels: what the detector found and what the tracker kept."""

    index: int
    offset_s: float
    raw: tuple[PersonBox, ...]
    tracked: tuple[PersonBox, ...]


def file_source(path: Path, camera: str = "bench", analyze_fps: float | None = None) -> FileSourceConfig:
    return FileSourceConfig(camera=camera, path=path, analyze_fps=analyze_fps)


def detect_and_track(
    video: Path, config: DetectorConfig, analyze_fps: float | None = None, event_end_s: float | None = None
) -> tuple[list[TrackedFrame], dict[str, float]]:
    """The real source, detector and tracker over a whole video, one frame at a time (as one camera runs).

    Returns the frames and timings (seconds): decode+detect+track wall time and the detector's share."""
    import time

    from visioncap.detect.tracking import PersonTracker
    from visioncap.detect.yolo import PersonDetector
    from visioncap.sources.registry import open_source

    source = open_source(file_source(video, analyze_fps=analyze_fps))
    detector = PersonDetector(config)
    tracker = PersonTracker(
        config.tracker,
        source.analyse_rate(),
        keep_lost_s=event_end_s if event_end_s is not None else SelectionConfig().event_end_s,
    )
    out: list[TrackedFrame] = []
    detect_s = 0.0
    started = time.perf_counter()
    for frame in source.frames():
        t0 = time.perf_counter()
        detection = detector.detect([frame])[0]
        detect_s += time.perf_counter() - t0
        tracked = tracker.update(detection)
        out.append(TrackedFrame(frame.index, frame.offset_s, detection.people, tracked.people))
    return out, {"wall_s": time.perf_counter() - started, "detect_s": detect_s}


def replay(video: Path, frames: Sequence[TrackedFrame], camera: str = "bench") -> Iterator[Detection]:
    """The tracked detections again, with their pixels decoded afresh (cheaper than holding a video in memory)."""
    from visioncap.sources.video_file import VideoFileSource

    by_index = {f.index: f for f in frames}
    for frame in VideoFileSource(file_source(video, camera)).frames():
        record = by_index.get(frame.index)
        if record is not None:
            yield Detection(frame=Frame(camera, frame.index, record.offset_s, frame.image), people=record.tracked)


# -- detection quality against the ground truth -----------------------------------------------------------------


def _expected_people(scene: Scene) -> dict[int, int]:
    counts: dict[int, int] = {}
    for event in scene.ground_truth():
        for first, last in event.person_spans:
            for index in range(first, last + 1):
                counts[index] = counts.get(index, 0) + 1
    return counts


def track_spans(frames: Sequence[TrackedFrame]) -> dict[int, tuple[int, int, int]]:
    """Track id -> (first frame, last frame, frames seen)."""
    spans: dict[int, tuple[int, int, int]] = {}
    for frame in frames:
        for person in frame.tracked:
            if person.track_id is None:
                continue
            first, _, seen = spans.get(person.track_id, (frame.index, frame.index, 0))
            spans[person.track_id] = (first, frame.index, seen + 1)
    return spans


def assign_tracks(scene: Scene, frames: Sequence[TrackedFrame]) -> dict[int, int | None]:
    """Track id -> ground-truth event number it overlaps most (None: a track outside every event)."""
    events = scene.ground_truth()
    out: dict[int, int | None] = {}
    for track_id, (first, last, _) in track_spans(frames).items():
        best, best_overlap = None, 0
        for event in events:
            overlap = min(last, event.end_frame) - max(first, event.start_frame) + 1
            if overlap > best_overlap:
                best, best_overlap = event.index, overlap
        out[track_id] = best
    return out


def detection_quality(scene: Scene, frames: Sequence[TrackedFrame], stable_frames: int = 3) -> dict[str, Any]:
    """Frame recall/false alarms, people-count accuracy, and per event: found, first detection, track ids."""
    expected = _expected_people(scene)
    analysed = {f.index: f for f in frames}
    person_frames = [i for i in analysed if expected.get(i, 0) > 0]
    empty_frames = [i for i in analysed if expected.get(i, 0) == 0]
    hit = [i for i in person_frames if analysed[i].raw]
    false_alarm = [i for i in empty_frames if analysed[i].raw]
    count_ok = [i for i in person_frames if len(analysed[i].raw) == expected[i]]
    tracked_hit = [i for i in person_frames if analysed[i].tracked]
    spans = track_spans(frames)
    owner = assign_tracks(scene, frames)
    events = []
    for event in scene.ground_truth():
        in_event = [analysed[i] for i in range(event.start_frame, event.end_frame + 1) if i in analysed]
        first_hit = next((f for f in in_event if f.raw), None)
        ids = sorted(t for t, e in owner.items() if e == event.index and spans[t][2] >= stable_frames)
        events.append(
            {
                "event": event.index,
                "label": event.label,
                "people": event.people,
                "start_s": round(event.start_s, 1),
                "duration_s": round(event.duration_s, 1),
                "frames_with_detection": round(sum(1 for f in in_event if f.raw) / max(1, len(in_event)), 3),
                "frames_count_exact": round(
                    sum(1 for f in in_event if len(f.raw) == expected.get(f.index, 0)) / max(1, len(in_event)), 3
                ),
                "first_detection_after_s": None
                if first_hit is None
                else round(first_hit.offset_s - event.start_frame / scene.fps, 2),
                "stable_tracks": len(ids),
            }
        )
    stray = sorted(t for t, e in owner.items() if e is None and spans[t][2] >= stable_frames)
    return {
        "analysed_frames": len(analysed),
        "person_frame_recall": round(len(hit) / max(1, len(person_frames)), 3),
        "person_frame_recall_after_tracking": round(len(tracked_hit) / max(1, len(person_frames)), 3),
        "people_count_exact": round(len(count_ok) / max(1, len(person_frames)), 3),
        "empty_frames_with_detection": round(len(false_alarm) / max(1, len(empty_frames)), 3),
        "events_found": sum(1 for e in events if e["frames_with_detection"] > 0),
        "events": len(events),
        "stable_tracks": sum(1 for s in spans.values() if s[2] >= stable_frames),
        "stable_tracks_outside_events": len(stray),
        "people_in_events": sum(e.people for e in scene.ground_truth()),
        "per_event": events,
    }


# -- machine facts ----------------------------------------------------------------------------------------------


def detector_machine_facts() -> dict[str, Any]:
    """visioncap.bench.machine's facts, with the detector's: torch and its threads, ultralytics, onnxruntime, opencv."""
    import torch

    from visioncap.bench.machine import machine_facts

    facts = machine_facts()
    versions = facts["versions"]
    facts.update(
        torch=torch.__version__,
        # Ultralytics sets torch to cpu_count - 1 threads on CPU (1 thread on a 2-core machine).
        torch_threads=torch.get_num_threads(),
        ultralytics=versions.get("ultralytics"),
        onnxruntime=versions.get("onnxruntime"),
        opencv=versions.get("opencv-python") or versions.get("opencv-python-headless"),
    )
    return facts
