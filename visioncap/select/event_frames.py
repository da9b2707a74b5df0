"""The frames an event is described from once it ends: per track, the first seen, the best, the zone entries and the
last seen, kept as small JPEGs.

Each frame is encoded when it is kept, at its share of the description's image-token budget
(`EventDescriptionConfig.frame_tokens`), so what a camera holds is bounded by `MAX_TRACKS` x `max_frames` small
JPEGs plus a reference to the newest frame (the one every visible person was last seen in): never a track's
full-size frames. A track's best frame is looked at once per `BEST_EVERY_S` at most (its score needs the Laplacian
of the person's region).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from visioncap.config.caption import EventDescriptionConfig
from visioncap.frames import Detection, EncodedImage, EventFrame, FinishedEvent, Frame, PersonBox, ZoneStay
from visioncap.select.events import EventSelector
from visioncap.select.scoring import frame_score
from visioncap.select.zones import ZoneVisit

log = logging.getLogger(__name__)

# Tracks one camera keeps frames of at once; a crowd beyond it is described by its captions alone.
MAX_TRACKS = 256
BEST_EVERY_S = 0.5

# Encodes a person's frame at a token budget: the camera's picture (full frame, boxed or cropped) as a JPEG.
Encoder = Callable[[Frame, PersonBox, int], EncodedImage]


@dataclass
class _Kept:
    camera: str
    started_s: float
    last_s: float
    first: EventFrame
    best: EventFrame | None = None
    best_score: float = -1.0
    best_checked_s: float = float("-inf")
    entries: list[EventFrame] = field(default_factory=list)
    last: EventFrame | None = None
    # The newest frame the person was seen in, encoded only once they are not in the next one (or at the end).
    seen: tuple[Frame, PersonBox] | None = None
    visits: tuple[ZoneVisit, ...] = ()
    visits_seen: int = 0  # visits already looked at for zone entries (of all the track's visits)
    event: bool = False  # the selector counts the track as a person event
    part: int = 0


class EventFrames:
    """Keeps the frames of one camera's tracks and says which events ended; feed it what the selector was fed,
    right after it (the selector knows which tracks are events and their zone visits)."""

    def __init__(self, config: EventDescriptionConfig, selector: EventSelector, end_s: float, encode: Encoder) -> None:
        self._config = config
        self._selector = selector
        self._end_s = end_s
        self._encode = encode
        self._kept: dict[int, _Kept] = {}
        # Tracks refused because MAX_TRACKS were kept already (their events get no description); a track counts
        # once while it stays refused from frame to frame. `_refused` holds the previous frame's, so its bound is
        # the people in one frame.
        self.untracked = 0
        self._refused: set[int] = set()

    def offer(self, detection: Detection) -> list[FinishedEvent]:
        """The events (or parts of long stays) that ended by this frame."""
        frame = detection.frame
        now = frame.offset_s
        finished: list[FinishedEvent] = []
        seen: set[int] = set()
        refused: set[int] = set()
        for person in detection.people:
            if person.track_id is None:
                continue
            seen.add(person.track_id)
            kept = self._kept.get(person.track_id)
            if kept is None:
                if len(self._kept) >= MAX_TRACKS:
                    refused.add(person.track_id)
                    self.untracked += person.track_id not in self._refused
                    continue
                kept = self._kept[person.track_id] = _Kept(frame.camera, now, now, self._keep("first", frame, person))
            elif now - kept.started_s >= self._config.max_duration_s:
                if (event := self._finish(person.track_id, kept, final=False)) is not None:
                    finished.append(event)
                kept = self._kept[person.track_id] = _Kept(
                    frame.camera, now, now, self._keep("first", frame, person), event=kept.event, part=kept.part + 1
                )
            self._see(person.track_id, kept, frame, person)
        for track_id, kept in list(self._kept.items()):
            if track_id in seen:
                continue
            if kept.seen is not None:
                kept.last = self._keep("last", *kept.seen)
                kept.seen = None
            if now - kept.last_s > self._end_s:
                del self._kept[track_id]
                if (event := self._finish(track_id, kept, final=True)) is not None:
                    finished.append(event)
        self._refused = refused
        return finished

    def flush(self) -> list[FinishedEvent]:
        """At the end of a stream (or a camera's stop): every track's event ends here."""
        finished = [event for track_id, kept in self._kept.items() if (event := self._finish(track_id, kept, True))]
        self._kept.clear()
        return finished

    def _keep(self, role: str, frame: Frame, person: PersonBox) -> EventFrame:
        height, width = frame.image.shape[:2]
        image = self._encode(frame, person, self._config.frame_tokens)
        return EventFrame(role, frame.index, frame.offset_s, image, person, width, height)

    def _see(self, track_id: int, kept: _Kept, frame: Frame, person: PersonBox) -> None:
        now = frame.offset_s
        kept.last_s = now
        kept.seen = (frame, person)
        kept.last = None
        kept.event = kept.event or self._selector.is_event(track_id)
        visits = self._selector.zone_visits(track_id)
        # A part of a long stay looks at the visits since it began (the older ones were the earlier part's).
        fresh = [visit for visit in visits[kept.visits_seen :] if visit.entered_s >= kept.started_s]
        kept.visits_seen = len(visits)
        kept.visits = tuple(visit for visit in visits if visit.last_seen_s >= kept.started_s)
        for visit in fresh:
            if len(kept.entries) < self._config.max_frames:
                kept.entries.append(self._keep(f"zone:{visit.zone}", frame, person))
        # Scored only once the track is an event: a flicker that never becomes one costs its first frame only.
        if kept.event and now - kept.best_checked_s >= BEST_EVERY_S:
            kept.best_checked_s = now
            score = frame_score(frame.image, (person,))
            if score > kept.best_score:
                kept.best_score = score
                kept.best = self._keep("best", frame, person)

    def _finish(self, track_id: int, kept: _Kept, final: bool) -> FinishedEvent | None:
        """The event's description frames, or None when it is not described (not an event, too short, one frame)."""
        if kept.seen is not None:
            kept.last = self._keep("last", *kept.seen)
            kept.seen = None
        if not kept.event or kept.last_s - kept.started_s < self._config.min_duration_s:
            return None
        frames = _choose(kept, self._config.max_frames)
        if len(frames) < 2:
            return None
        return FinishedEvent(
            camera=kept.camera,
            track_id=track_id,
            started_s=kept.started_s,
            ended_s=kept.last_s,
            frames=frames,
            zones=_stays(track_id, kept),
            part=kept.part,
            final=final,
        )


def _choose(kept: _Kept, most: int) -> tuple[EventFrame, ...]:
    """Up to `most` distinct frames, taken first seen, last seen, best, then zone entries in time order, and
    returned oldest first; a frame kept in two roles is one frame with both."""
    chosen: dict[int, EventFrame] = {}
    for frame in (kept.first, kept.last, kept.best, *kept.entries):
        if frame is None:
            continue
        held = chosen.get(frame.frame_index)
        if held is not None:
            if frame.role not in held.role.split("+"):
                chosen[frame.frame_index] = replace(held, role=f"{held.role}+{frame.role}")
        elif len(chosen) < most:
            chosen[frame.frame_index] = frame
    return tuple(sorted(chosen.values(), key=lambda frame: (frame.offset_s, frame.frame_index)))


def _stays(track_id: int, kept: _Kept) -> tuple[ZoneStay, ...]:
    """Each zone the person was in during the event (or this part of it): when first entered, and the time spent
    in it over all their visits."""
    dwell: dict[str, float] = defaultdict(float)
    entered: dict[str, float] = {}
    for visit in kept.visits:
        since = max(visit.entered_s, kept.started_s)
        until = visit.exited_s if visit.exited_s is not None else visit.last_seen_s
        dwell[visit.zone] += max(0.0, min(until, kept.last_s) - since)
        entered.setdefault(visit.zone, since)
    return tuple(ZoneStay(zone, track_id, entered[zone], dwell[zone]) for zone in sorted(dwell))
