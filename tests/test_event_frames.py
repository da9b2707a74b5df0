"""The frames an event is described from, on real video: a generated clip of a real person (the packaged detector
finds them) walking into a zone, through the detector, the tracker, the selector and the event frames kept."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from helpers import PERSON_DETECTOR
from test_zones import DOOR, read_clip, walk  # noqa: F401  (the fixture)
from videos import FPS

from visioncap.caption.encode import encode_jpeg
from visioncap.config.caption import EventDescriptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.detect import PersonDetector
from visioncap.detect.tracking import PersonTracker
from visioncap.frames import Detection, EncodedImage, FinishedEvent, Frame, PersonBox, SelectedFrame
from visioncap.select import event_frames
from visioncap.select.event_frames import EventFrames
from visioncap.select.events import EventSelector

pytestmark = pytest.mark.detector


def encode(frame: Frame, person: PersonBox, tokens: int) -> EncodedImage:
    return encode_jpeg(frame.image, tokens)


def describe_clip(
    path: Path, selection: SelectionConfig, events: EventDescriptionConfig
) -> tuple[list[SelectedFrame], list[FinishedEvent], int]:
    """Selected frames and finished events of a clip (flushed at its end), and how many frames it has."""
    detector = PersonDetector(
        DetectorConfig(weights=PERSON_DETECTOR, person_classes=[0, 1], image_size=320, confidence=0.35)
    )
    tracker = PersonTracker("bytetrack", FPS, keep_lost_s=selection.event_end_s)
    selector = EventSelector(selection)
    recorder = EventFrames(events, selector, selection.event_end_s, encode)
    frames = read_clip(path)
    selected: list[SelectedFrame] = []
    finished: list[FinishedEvent] = []
    for detection in detector.detect(frames):
        tracked = tracker.update(detection)
        selected += selector.offer(tracked)
        finished += recorder.offer(tracked)
    return selected + selector.flush(), finished + recorder.flush(), len(frames)


def test_an_event_keeps_its_first_best_zone_entry_and_last_frames_within_its_budget(walk: Path) -> None:  # noqa: F811
    events = EventDescriptionConfig(enabled=True, max_frames=4, max_image_tokens=400)
    selected, finished, count = describe_clip(walk, SelectionConfig(zones=[DOOR], min_interval_s=0.5), events)
    [event] = finished
    [entry] = [frame for frame in selected if frame.reason == "zone-entry"]
    assert event.track_id in entry.event_ids and event.event_key == f"yard:{event.track_id}"
    roles = [role for frame in event.frames for role in frame.role.split("+")]
    assert {"first", "best", "last", "zone:door"} <= set(roles), roles
    offsets = [frame.offset_s for frame in event.frames]
    assert offsets == sorted(offsets) and len(event.frames) <= 4
    # First seen at the clip's start, last seen at its end (the stream ended), the zone entry where the selector
    # saw it; every frame within its share of the budget (400 / 4).
    first, last = event.frames[0], event.frames[-1]
    assert first.offset_s < 0.5 and "first" in first.role
    assert last.frame_index == count - 1 and "last" in last.role and event.ended_s == last.offset_s
    [door] = [frame for frame in event.frames if "zone:door" in frame.role]
    assert door.frame_index == entry.detection.frame.index
    assert all(0 < frame.image.image_tokens <= 100 for frame in event.frames)
    assert event.main in event.frames and "best" in event.main.role
    # The time spent in the door zone: from the entry to the clip's end (2 s standing there, and the last steps).
    [stay] = event.zones
    assert stay.zone == "door" and stay.entered_s == door.offset_s
    assert stay.dwell_s == pytest.approx(last.offset_s - door.offset_s)
    assert event.final and event.part == 0


def test_a_long_stay_is_described_in_parts_and_short_or_unstable_tracks_not_at_all(walk: Path) -> None:  # noqa: F811
    parts = EventDescriptionConfig(enabled=True, max_duration_s=2.5, min_duration_s=0.5)
    _, finished, _ = describe_clip(walk, SelectionConfig(zones=[DOOR]), parts)
    # 6.5 s of one person: parts of 2.5 s, each described when it ends, the last at the clip's end.
    assert [(event.part, event.final) for event in finished] == [(0, False), (1, False), (2, True)]
    assert len({event.track_id for event in finished}) == 1
    for earlier, later in itertools.pairwise(finished):
        assert later.started_s > earlier.ended_s and later.frames[0].offset_s == later.started_s
    # The door is entered in the second part: the first has no zone, the later ones have it.
    assert finished[0].zones == () and all(event.zones[0].zone == "door" for event in finished[2:])
    too_long = EventDescriptionConfig(enabled=True, min_duration_s=60)
    assert describe_clip(walk, SelectionConfig(), too_long)[1] == []
    # A track that never becomes an event (it would need more frames than the clip has) is not described.
    assert describe_clip(walk, SelectionConfig(stable_frames=1000), EventDescriptionConfig(enabled=True))[1] == []


def test_the_frame_budget_must_fit_the_frames() -> None:
    with pytest.raises(ValueError, match="cannot be shared by 16 frames"):
        EventDescriptionConfig(max_frames=16, max_image_tokens=32)
    assert EventDescriptionConfig(max_frames=4, max_image_tokens=1024).frame_tokens == 256


def test_tracks_beyond_the_bound_are_counted_once_while_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A camera keeps frames of MAX_TRACKS tracks at once; each track refused beyond them counts once while it stays
    in view (the pipeline exports the count as `visioncap_event_tracks_undescribed_total`), and a kept track's
    frames are still kept."""
    monkeypatch.setattr(event_frames, "MAX_TRACKS", 2)
    selection = SelectionConfig()
    recorder = EventFrames(EventDescriptionConfig(enabled=True), EventSelector(selection), 60.0, encode)
    image = np.zeros((48, 64, 3), dtype=np.uint8)

    def offer(index: int, *tracks: int) -> int:
        people = tuple(PersonBox(4, 4, 20, 40, 0.9, 0, track) for track in tracks)
        recorder.offer(Detection(Frame("cam", index, index / 10, image), people))
        return recorder.untracked

    assert offer(0, 1, 2, 3) == 1  # 3 refused
    assert offer(1, 1, 2, 3) == 1  # still the same refusal
    assert offer(2, 1, 2, 4) == 2  # 4 refused; 3 left view
    assert offer(3, 1, 2, 3, 4) == 3  # 3 back: refused anew, 4 still counted once
    assert offer(4) == 3
