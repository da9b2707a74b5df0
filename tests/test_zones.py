"""Zones and masks on real video: a generated clip of a real person (the packaged detector finds them) walking
into a zone or standing in a mask, through the detector, the tracker and the selector."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import PERSON_DETECTOR
from pydantic import ValidationError
from videos import FPS, HEIGHT, WIDTH, _person

from visioncap.config.cameras import CameraConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.zones import point_in_polygon
from visioncap.detect import PersonDetector
from visioncap.detect.tracking import PersonTracker
from visioncap.frames import Frame, SelectedFrame, SelectionReason
from visioncap.select.events import EventSelector

# The right half of the floor: a person's feet (the bottom of the sprite, y = 460 of 480) are in it on the right.
DOOR = {"name": "door", "points": [[0.5, 0.5], [1.0, 0.5], [1.0, 1.0], [0.5, 1.0]]}


def make_walk_video(path: Path, xs: list[int]) -> Path:
    """One person at each left edge in `xs`, a frame each, on a plain wall; MPEG-4 at 10 fps."""
    sprite = _person("bus-mid")
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (WIDTH, HEIGHT))
    rng = np.random.default_rng(2)
    for x in xs:
        frame = np.full((HEIGHT, WIDTH, 3), (120, 130, 140), np.float32) + rng.normal(0, 2, (HEIGHT, WIDTH, 3))
        frame = frame.clip(0, 255).astype(np.uint8)
        frame[60 : 60 + sprite.shape[0], x : x + sprite.shape[1]] = sprite
        writer.write(frame)
    writer.release()
    return path


def read_clip(path: Path, camera: str = "yard") -> list[Frame]:
    """Every frame of a clip, as the pipeline's file source numbers and times them."""
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(Frame(camera=camera, index=len(frames), offset_s=len(frames) / FPS, image=image))
    capture.release()
    return frames


def run_clip(path: Path, selection: SelectionConfig) -> tuple[EventSelector, list[SelectedFrame]]:
    detector = PersonDetector(
        DetectorConfig(weights=PERSON_DETECTOR, person_classes=[0, 1], image_size=320, confidence=0.35)
    )
    tracker = PersonTracker("bytetrack", FPS, keep_lost_s=selection.event_end_s, masks=selection.masks)
    selector = EventSelector(selection)
    frames = read_clip(path)
    selected: list[SelectedFrame] = []
    for detection in detector.detect(frames):
        selected += selector.offer(tracker.update(detection))
    return selector, selected + selector.flush()


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # 1.5 s standing on the left, a 3 s walk to the right half (slow enough to keep one track), 2 s there.
    sprite_width = _person("bus-mid").shape[1]
    right = WIDTH - sprite_width - 20
    xs = [20] * 15 + list(np.linspace(20, right, 30).astype(int)) + [right] * 20
    return make_walk_video(tmp_path_factory.mktemp("zones") / "walk.mp4", xs)


def test_entering_a_zone_is_recorded_with_its_dwell_and_selects_a_frame(walk: Path) -> None:
    selector, selected = run_clip(walk, SelectionConfig(zones=[DOOR], min_interval_s=0.0, recaption_interval_s=None))
    reasons = [s.reason for s in selected]
    assert reasons[0] == SelectionReason.NEW_EVENT
    assert SelectionReason.ZONE_ENTRY in reasons
    entry = next(s for s in selected if s.reason == SelectionReason.ZONE_ENTRY)
    # The frame chosen shows the person with their feet inside the door zone, after their first caption.
    person = entry.detection.people[0]
    assert (person.x1 + person.x2) / 2 / WIDTH > 0.5
    visits = [v for tid in entry.event_ids for v in selector.zone_visits(tid)]
    assert [v.zone for v in visits] == ["door"]
    # Entered during the walk (1.5-4.5 s), still inside at the end of the clip (6.4 s): over two seconds' dwell.
    assert 1.5 <= visits[0].entered_s <= 4.5
    assert visits[0].exited_s is None
    assert visits[0].dwell_s == pytest.approx(6.4 - visits[0].entered_s)
    assert visits[0].dwell_s >= 1.9
    # The frame carries the stay as it was then (what its caption stores): entered just now.
    assert [(stay.zone, stay.track_id) for stay in entry.zones] == [("door", entry.event_ids[0])]
    assert entry.zones[0].entered_s == visits[0].entered_s
    assert entry.zones[0].dwell_s == pytest.approx(entry.detection.frame.offset_s - visits[0].entered_s)
    assert selected[0].zones == ()  # first described on the left, outside the zone


def test_a_stay_of_loiter_s_selects_one_zone_dwell_frame(walk: Path) -> None:
    """A zone with `loiter_s`: once the person has stood in it that long, one zone-dwell frame (not one per
    analysed frame after), whose stay is at least that long."""
    door = {**DOOR, "loiter_s": 1.0}
    _, selected = run_clip(walk, SelectionConfig(zones=[door], min_interval_s=0.0, recaption_interval_s=None))
    dwell = [s for s in selected if s.reason == SelectionReason.ZONE_DWELL]
    assert len(dwell) == 1, [s.reason for s in selected]
    (stay,) = dwell[0].zones
    assert stay.zone == "door" and stay.dwell_s >= 1.0
    # Without loiter_s the same clip has no zone-dwell frame.
    _, plain = run_clip(walk, SelectionConfig(zones=[DOOR], min_interval_s=0.0, recaption_interval_s=None))
    assert SelectionReason.ZONE_DWELL not in [s.reason for s in plain]


def test_required_zones_make_events_only_of_people_inside(walk: Path) -> None:
    selector, selected = run_clip(
        walk, SelectionConfig(zones=[DOOR], required_zones=["door"], min_interval_s=0.0, recaption_interval_s=None)
    )
    assert selected, "the person in the door zone makes an event"
    # Nothing is captioned while they stand on the left, outside the required zone.
    assert min(s.detection.frame.offset_s for s in selected) >= 1.5
    assert selector.events_started == 1


def test_people_whose_box_centre_is_in_a_mask_are_dropped_before_tracking(tmp_path: Path) -> None:
    # The left third is masked (a poster): the person stands there for 2 s, their box wholly inside it, then
    # stands in the middle, their box partly over the mask but its centre outside.
    sprite_width = _person("bus-mid").shape[1]
    partly = round(WIDTH / 3 - sprite_width / 3)
    clip = make_walk_video(tmp_path / "mask.mp4", [20] * 20 + [partly] * 20)
    poster = {"name": "poster", "points": [[0, 0], [1 / 3, 0], [1 / 3, 1], [0, 1]]}
    selector, selected = run_clip(clip, SelectionConfig(masks=[poster], min_interval_s=0.0))
    assert selected and all(s.detection.frame.offset_s >= 2.0 for s in selected)
    assert all(p.x1 < WIDTH / 3 < p.x2 for s in selected for p in s.detection.people)
    assert selector.events_started == 1
    # The same clip without the mask: the person on the left is an event from the start.
    _, unmasked = run_clip(clip, SelectionConfig(min_interval_s=0.0))
    assert min(s.detection.frame.offset_s for s in unmasked) < 2.0


def test_point_in_polygon_and_zone_config() -> None:
    square = [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0), (0.0, 1.0)]
    triangle = [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0)]
    assert point_in_polygon(0.5, 0.5, square) and not point_in_polygon(1.5, 0.5, square)
    assert point_in_polygon(0.2, 0.2, triangle) and not point_in_polygon(0.8, 0.8, triangle)
    with pytest.raises(ValidationError, match="fractions of the frame"):
        SelectionConfig(zones=[{"name": "door", "points": [[0, 0], [2, 0], [0, 1]]}])
    with pytest.raises(ValidationError, match="required_zones: yard not among the zones"):
        SelectionConfig(zones=[DOOR], required_zones=["yard"])
    # Zones and masks are camera data: a stored camera carries them in its selection overrides.
    camera = CameraConfig.model_validate(
        {
            "pipeline": "main",
            "source": {"camera": "yard", "kind": "rtsp", "url": "rtsp://192.0.2.1/s"},
            "selection": {"zones": [DOOR], "masks": [{"name": "street", "points": [[0, 0], [1, 0], [1, 0.2]]}]},
        }
    )
    merged = camera.selection_for(SelectionConfig())
    assert [z.name for z in merged.zones] == ["door"] and [m.name for m in merged.masks] == ["street"]
    with pytest.raises(ValidationError):
        CameraConfig.model_validate(
            {
                "pipeline": "main",
                "source": {"camera": "yard", "kind": "rtsp", "url": "rtsp://192.0.2.1/s"},
                "selection": {"zones": [{"name": "x", "points": [[0, 0], [1, 1]]}]},
            }
        )
