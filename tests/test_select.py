"""The event selection policy and the image-token budget, on constructed tracked detections (no timing)."""

from __future__ import annotations

import itertools

import cv2
import numpy as np
import pytest

from visioncap.caption.encode import compose, encode_frames, encode_jpeg, fit_tokens, image_tokens
from visioncap.config.caption import ImageMode
from visioncap.config.selection import SelectionConfig
from visioncap.frames import Detection, Frame, PersonBox
from visioncap.select import EventSelector

# A textured frame so that sharpness, and so the score, is not zero.
IMAGE = np.random.default_rng(0).integers(0, 255, (120, 160, 3), dtype=np.uint8)


def person(track: int, x: float = 10, size: float = 30, confidence: float = 0.9) -> PersonBox:
    return PersonBox(x, 10, x + size, 10 + size * 2, confidence, 0, track_id=track)


def detection(t: float, *people: PersonBox) -> Detection:
    return Detection(frame=Frame(camera="c", index=round(t * 10), offset_s=t, image=IMAGE), people=people)


def run(timeline: list[Detection], **config: object) -> list[tuple[float, str, tuple[int, ...]]]:
    selector = EventSelector(SelectionConfig(**config))
    out = [s for d in timeline for s in selector.offer(d)] + selector.flush()
    return [(s.detection.frame.offset_s, s.reason, s.event_ids) for s in out]


def seconds(start: float, end: float, step: float = 0.1) -> list[float]:
    return [round(start + i * step, 3) for i in range(round((end - start) / step))]


BASE = {"stable_frames": 3, "best_frame_window_s": 0.3, "min_interval_s": 0.0, "recaption_interval_s": None}


def test_one_caption_per_event_and_none_without_people() -> None:
    timeline = [detection(t) for t in seconds(0, 1)]
    timeline += [detection(t, person(1)) for t in seconds(1, 3)]
    timeline += [detection(t) for t in seconds(3, 6)]
    timeline += [detection(t, person(2)) for t in seconds(6, 8)]
    chosen = run(timeline, **BASE)
    assert [(reason, ids) for _, reason, ids in chosen] == [("new-event", (1,)), ("new-event", (2,))]
    assert 1.2 <= chosen[0][0] <= 1.5 and 6.2 <= chosen[1][0] <= 6.5  # within the window after it became stable


def test_a_flicker_shorter_than_stable_frames_is_not_an_event() -> None:
    timeline = [detection(0.0, person(1)), detection(0.1, person(1)), *[detection(t) for t in seconds(0.2, 4)]]
    selector = EventSelector(SelectionConfig(**BASE))
    assert [s for d in timeline for s in selector.offer(d)] + selector.flush() == []
    assert selector.events_started == 0


def test_people_in_view_together_share_one_caption() -> None:
    timeline = [detection(t, person(1, x=0), person(2, x=60)) for t in seconds(0, 2)]
    assert [ids for _, _, ids in run(timeline, **BASE)] == [(1, 2)]


def test_per_person_gives_each_event_its_own_caption() -> None:
    timeline = [detection(t, person(1, x=0), person(2, x=60)) for t in seconds(0, 3)]
    chosen = run(timeline, **{**BASE, "per_person": True})
    assert sorted(ids for _, _, ids in chosen) == [(1,), (2,)]


def test_long_event_is_recaptioned_per_interval_not_per_frame() -> None:
    timeline = [detection(t, person(1)) for t in seconds(0, 20)]
    chosen = run(timeline, **{**BASE, "recaption_interval_s": 5.0})
    assert [reason for _, reason, _ in chosen] == ["new-event", "recaption", "recaption", "recaption"]
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(chosen)]
    assert all(5.0 <= gap <= 5.0 + 0.3 + 0.1 + 1e-9 for gap in gaps), gaps


def test_best_frame_of_the_window_is_chosen() -> None:
    # Same person, growing bigger for three frames of the window, then shrinking.
    sizes = [20, 20, 20, 24, 28, 40, 22, 20, 20, 20]
    timeline = [detection(i / 10, person(1, size=s)) for i, s in enumerate(sizes)]
    chosen = run(timeline, **{**BASE, "best_frame_window_s": 0.4})
    assert [t for t, _, _ in chosen] == [0.5]


def test_minimum_interval_and_rate_cap_space_out_captions() -> None:
    # A new person every second: without limits every one would be captioned at once.
    timeline = [detection(t, *(person(i + 1, x=i * 20, size=10) for i in range(int(t) + 1))) for t in seconds(0, 6)]
    free = run(timeline, **BASE)
    capped = run(timeline, **{**BASE, "max_captions_per_minute": 20.0})  # one per 3 s
    assert len(free) == 6
    assert len(capped) < len(free)
    selector = EventSelector(SelectionConfig(**{**BASE, "max_captions_per_minute": 20.0}))
    sent = [d.frame.offset_s for d in timeline for _ in selector.offer(d)]
    # Requests are spaced by 3 s of video; the frame each shows may be from earlier in its window.
    assert all(b - a >= 3.0 - 1e-9 for a, b in itertools.pairwise(sent)), sent
    covered = {i for _, _, ids in capped for i in ids}
    assert covered == {1, 2, 3, 4, 5, 6}, "rate limits delay events, they never drop them"


def test_people_leaving_triggers_a_recaption_of_those_who_stay() -> None:
    both = [detection(t, person(1, x=0), person(2, x=60)) for t in seconds(0, 2)]
    alone = [detection(t, person(1, x=0)) for t in seconds(2, 6)]
    chosen = run(both + alone, **{**BASE, "event_end_s": 1.0})
    assert [(reason, ids) for _, reason, ids in chosen] == [("new-event", (1, 2)), ("people-left", (1,))]
    assert chosen[1][0] >= 2.9  # once person 2 has been gone for event_end_s


def test_large_movement_triggers_a_recaption() -> None:
    timeline = [detection(t, person(1, x=25 * max(0.0, t - 2))) for t in seconds(0, 6)]
    chosen = run(timeline, **{**BASE, "movement_threshold": 0.25})
    assert [reason for _, reason, _ in chosen][:2] == ["new-event", "movement"]


def test_stream_end_flushes_a_held_frame() -> None:
    timeline = [detection(t, person(1)) for t in seconds(0, 0.4)]  # stable at 0.2, window 0.3 never passes
    assert [reason for _, reason, _ in run(timeline, **BASE)] == ["new-event"]


@pytest.mark.parametrize(("width", "height"), [(1920, 1080), (640, 480), (100, 3000), (5000, 20)])
@pytest.mark.parametrize("budget", [16, 256, 1280])
def test_images_fit_the_token_budget(width: int, height: int, budget: int) -> None:
    w, h = fit_tokens(width, height, budget, 28)
    assert image_tokens(w, h, 28) <= budget
    if image_tokens(width, height, 28) <= budget:
        assert (w, h) == (width, height)
    else:
        assert image_tokens(w, h, 28) >= budget * 0.8 or min(w, h) < 56, "not shrunk far more than needed"


def test_qwen_token_count_of_a_vga_frame() -> None:
    # Measured on vLLM with the tiny Qwen2-VL: 640x480 -> 644x476 -> 23 x 17 = 391 image tokens.
    assert image_tokens(640, 480, 28) == 391


def test_encode_jpeg_downscales_and_reports_tokens() -> None:
    frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    image = encode_jpeg(frame, max_tokens=128, token_size=28, quality=80)
    assert image.image_tokens == image_tokens(image.width, image.height, 28) <= 128
    decoded = cv2.imdecode(np.frombuffer(image.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape[:2] == (image.height, image.width)


def test_frames_of_an_event_share_one_budget() -> None:
    rng = np.random.default_rng(1)
    frames = [rng.integers(0, 255, (h, w, 3), dtype=np.uint8) for h, w in ((720, 1280), (1280, 720), (64, 64))]
    images = encode_frames(frames, max_tokens=300)
    assert [image.image_tokens <= 100 for image in images] == [True] * 3
    assert images[2].width == 64  # a small frame is not enlarged to its share
    assert encode_frames([], 300) == []
    with pytest.raises(ValueError, match="cannot be shared by 3 frames"):
        encode_frames(frames, max_tokens=11)


def test_crop_and_boxes_modes() -> None:
    frame = np.zeros((100, 200, 3), np.uint8)
    people = (PersonBox(50, 20, 70, 80, 0.9, 0), PersonBox(100, 30, 120, 90, 0.9, 0))
    crop = compose(frame, people, ImageMode.CROP, padding=0.1)
    assert crop.shape[:2] == ((90 + 7) - (20 - 7), (120 + 7) - (50 - 7))
    boxed = compose(frame, people, ImageMode.BOXES)
    assert boxed.shape == frame.shape and boxed.any() and not frame.any()
    assert compose(frame, people, ImageMode.FULL) is frame


@pytest.mark.parametrize("count_change", [True, False])
def test_state_stays_bounded_however_many_people_pass(count_change: bool) -> None:
    """Months of traffic: 300 people come and go one after another; what the selector keeps stays a handful."""
    selector = EventSelector(
        SelectionConfig(**{**BASE, "per_person": True, "recaption_on_count_change": count_change, "event_end_s": 0.5})
    )
    t = 0.0
    for track in range(300):
        for _ in range(6):  # in view for 0.6 s, long enough to be an event and be captioned
            selector.offer(detection(t, person(track)))
            t = round(t + 0.1, 3)
        for _ in range(7):  # gone for 0.7 s, longer than event_end_s
            selector.offer(detection(t))
            t = round(t + 0.1, 3)
    assert selector.events_started == 300
    assert len(selector._tracks) <= 1 and len(selector._last_caption_ids) <= 2
