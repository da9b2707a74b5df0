"""What the detector benchmarks share (`throughput`, `caption_budget`, `scenes --check`, the fleet): offline
Ultralytics settings, the detector config, detect+track over a video, and the machine facts with the detector's
(the detection quality against a scene's ground truth is `scenes.detection_quality`).

Importing this module sets the YOLO_* environment defaults, so import it before anything imports ultralytics."""

from __future__ import annotations

import os

from visioncap.bench.common.machine import REPO

# Before anything imports ultralytics: no downloads, no run-time pip installs, settings inside the repo's data/.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", str(REPO / "data" / "ultralytics"))

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig
from visioncap.frames import Detection, Frame, PersonBox

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


# -- machine facts ----------------------------------------------------------------------------------------------


def detector_machine_facts() -> dict[str, Any]:
    """common.machine's facts, with the detector's: torch and its threads, ultralytics, onnxruntime, opencv."""
    import torch

    from visioncap.bench.common.machine import machine_facts

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
