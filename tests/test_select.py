"""The selection policy and the image budget, on constructed detections (no timing involved)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from visioncap.caption.encode import encode_jpeg, fit_within
from visioncap.config.selection import SelectionConfig
from visioncap.frames import Detection, Frame, PersonBox
from visioncap.select import PersonRunSelector

BLANK = np.zeros((4, 4, 3), np.uint8)
PERSON = PersonBox(1, 1, 3, 3, 0.9, 0)


def detection(offset_s: float, people: int) -> Detection:
    frame = Frame(camera="c", index=round(offset_s * 10), offset_s=offset_s, image=BLANK)
    return Detection(frame=frame, people=(PERSON,) * people)


def selections(timeline: list[tuple[float, int]], **config: float) -> list[tuple[float, str]]:
    selector = PersonRunSelector(SelectionConfig(**config))
    chosen = [selector.offer(detection(t, n)) for t, n in timeline]
    return [(s.detection.frame.offset_s, s.reason) for s in chosen if s is not None]


def test_first_frame_of_each_run_and_none_without_people() -> None:
    timeline = [(0.0, 0), (0.1, 1), (0.2, 2), (0.3, 1), (2.0, 0), (3.0, 0), (4.0, 1), (4.1, 1)]
    assert selections(timeline, interval_s=10, gap_s=1) == [(0.1, "run-start"), (4.0, "run-start")]


def test_at_most_one_more_per_interval_while_the_run_lasts() -> None:
    timeline = [(t / 10, 1) for t in range(0, 65)]  # 0.0 .. 6.4 s, people throughout
    assert selections(timeline, interval_s=2, gap_s=1) == [
        (0.0, "run-start"),
        (2.0, "interval"),
        (4.0, "interval"),
        (6.0, "interval"),
    ]


def test_short_gaps_do_not_start_a_new_run() -> None:
    timeline = [(0.0, 1), (0.5, 0), (0.8, 1), (1.7, 1), (3.0, 1)]
    assert selections(timeline, interval_s=10, gap_s=1) == [(0.0, "run-start"), (3.0, "run-start")]


@pytest.mark.parametrize(("width", "height"), [(1920, 1080), (640, 480), (100, 3000), (5000, 20)])
def test_images_fit_the_pixel_budget(width: int, height: int) -> None:
    budget = 256 * 28 * 28
    w, h = fit_within(width, height, budget)
    assert w * h <= budget
    assert abs(w / h - width / height) / (width / height) < 0.1 or min(w, h) <= 2
    if width * height <= budget:
        assert (w, h) == (width, height)


def test_encode_jpeg_downscales_large_frames() -> None:
    frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    image = encode_jpeg(frame, max_pixels=128 * 28 * 28, quality=80)
    assert image.width * image.height <= 128 * 28 * 28
    assert image.jpeg[:2] == b"\xff\xd8"
    decoded = cv2.imdecode(np.frombuffer(image.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape[:2] == (image.height, image.width)
