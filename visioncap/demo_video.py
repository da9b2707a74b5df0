"""Builds the demo video offline from the two photos that ship inside the `ultralytics` wheel.

Stretches with people (a slow zoom over bus.jpg, then zidane.jpg) alternate with stretches of an empty
synthetic scene, so a run shows both what gets captioned and what does not.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

WIDTH, HEIGHT, FPS = 640, 480, 10


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the demo video: frames [start, end) showing `image`, or nobody when image is None."""

    start: int
    end: int
    image: str | None

    @property
    def has_people(self) -> bool:
        return self.image is not None


def _segments(spec: list[tuple[str | None, int]]) -> tuple[Segment, ...]:
    out, start = [], 0
    for image, length in spec:
        out.append(Segment(start, start + length, image))
        start += length
    return tuple(out)


SEGMENTS = _segments([(None, 15), ("bus.jpg", 25), (None, 15), ("zidane.jpg", 25), (None, 10)])


def ultralytics_asset(name: str) -> Path:
    """A photo shipped in the ultralytics wheel. Found without importing the package: importing it loads PyTorch,
    seconds of CPU for a file path."""
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the ultralytics package is not installed")
    return Path(spec.submodule_search_locations[0]) / "assets" / name


def _asset(name: str) -> np.ndarray:
    image = cv2.imread(str(ultralytics_asset(name)))
    if image is None:
        raise FileNotFoundError(f"ultralytics asset {name} is missing")
    return image


def _letterbox_zoom(image: np.ndarray, zoom: float) -> np.ndarray:
    """Fit the photo into the frame, zoomed about its centre, on a dark background."""
    h, w = image.shape[:2]
    crop_w, crop_h = int(w / zoom), int(h / zoom)
    x0, y0 = (w - crop_w) // 2, (h - crop_h) // 2
    crop = image[y0 : y0 + crop_h, x0 : x0 + crop_w]
    scale = min(WIDTH / crop_w, HEIGHT / crop_h)
    resized = cv2.resize(crop, (int(crop_w * scale), int(crop_h * scale)), interpolation=cv2.INTER_AREA)
    canvas = np.full((HEIGHT, WIDTH, 3), 24, np.uint8)
    oy, ox = (HEIGHT - resized.shape[0]) // 2, (WIDTH - resized.shape[1]) // 2
    canvas[oy : oy + resized.shape[0], ox : ox + resized.shape[1]] = resized
    return canvas


def _empty_scene(t: int, rng: np.random.Generator) -> np.ndarray:
    """A drifting street-like scene with no people: sky gradient, blocks, sensor noise."""
    sky = np.linspace(200, 90, HEIGHT, dtype=np.float32)[:, None, None] * np.array([1.0, 0.9, 0.7], np.float32)
    frame = np.broadcast_to(sky, (HEIGHT, WIDTH, 3)).copy()
    for i, (x, w, h, colour) in enumerate(
        [(40, 120, 260, (70, 80, 90)), (220, 160, 320, (60, 60, 75)), (430, 140, 220, (85, 75, 70))]
    ):
        shift = (t * (i + 1)) % 6
        frame[HEIGHT - h :, x + shift : x + shift + w] = colour
    frame[HEIGHT - 40 :, :] = (50, 50, 50)
    frame += rng.normal(0, 3, frame.shape).astype(np.float32)
    return np.clip(frame, 0, 255).astype(np.uint8)


def make_demo_video(path: Path) -> tuple[Segment, ...]:
    """Write the demo video (MPEG-4 in .mp4) and return its segments."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"cannot write video {path}")
    rng = np.random.default_rng(0)
    try:
        for segment in SEGMENTS:
            photo = _asset(segment.image) if segment.image else None
            for i in range(segment.end - segment.start):
                if photo is None:
                    frame = _empty_scene(segment.start + i, rng)
                else:
                    frame = _letterbox_zoom(photo, 1.0 + 0.1 * i / (segment.end - segment.start))
                writer.write(frame)
    finally:
        writer.release()
    return SEGMENTS
