"""Person events and when to describe them.

A person event is a track. It is due for its first caption once seen in `stable_frames` analysed frames, and
again after `recaption_interval_s`, after moving far, or when people it was described with have left. While
something is due, the best frame of a short window is kept; it is emitted when the window has passed and the
camera's rate limits allow. By default one caption covers everyone in that frame; `per_person` gives each
event its own.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from visioncap.config.selection import SelectionConfig
from visioncap.config.zones import Zone
from visioncap.frames import Detection, PersonBox, SelectedFrame, SelectionReason, ZoneStay
from visioncap.select.scoring import frame_score
from visioncap.select.zones import ZoneVisit, zones_of

# Finished zone visits kept for reading (tests, metrics); older ones are forgotten.
FINISHED_VISITS = 1000


@dataclass
class _Track:
    last_s: float
    frames: int = 0
    started: bool = False
    captioned_s: float | None = None
    captioned_center: tuple[float, float] | None = None
    box: PersonBox | None = None
    visits: list[ZoneVisit] = field(default_factory=list)
    inside: set[str] = field(default_factory=set)
    entered: bool = False  # entered a zone since its last caption


@dataclass
class _Candidate:
    detection: Detection
    people: tuple[PersonBox, ...]
    score: float


class EventSelector:
    """Selection state of one camera; feed it every analysed, tracked detection in time order."""

    def __init__(self, config: SelectionConfig) -> None:
        self._config = config
        self._tracks: dict[int, _Track] = {}
        self._window_start: float | None = None
        self._window_reasons: list[SelectionReason] = []
        self._window_focus: int | None = None  # per_person: the event the window is for
        self._best: _Candidate | None = None
        self._last_emit_s: float | None = None
        self._last_caption_ids: set[int] = set()
        self.events_started = 0
        self._diagonal = 1.0
        self._required = set(config.required_zones)
        self._camera = ""
        self._zones: list[Zone] = []
        self._loiter_limits: dict[str, float] = {}
        self._use_camera("")
        self.finished_visits: deque[ZoneVisit] = deque(maxlen=FINISHED_VISITS)
        self._now = 0.0
        spacing = 60.0 / config.max_captions_per_minute if config.max_captions_per_minute else 0.0
        self._min_gap_s = max(config.min_interval_s, spacing)

    def offer(self, detection: Detection) -> list[SelectedFrame]:
        """Frames to caption now (usually none, sometimes one)."""
        now = self._now = detection.frame.offset_s
        height, width = detection.frame.image.shape[:2]
        self._diagonal = math.hypot(width, height)
        self._update_tracks(detection, now, width, height)
        due = self._due_ids(now)
        reasons = self._due_reasons(due)
        if reasons and self._window_start is None:
            self._window_start = now
            self._window_reasons = reasons
            self._window_focus = self._focus(due) if self._config.per_person else None
        elif reasons:
            self._window_reasons = sorted(set(self._window_reasons) | set(reasons), key=_REASON_ORDER.index)
        if self._window_start is not None:
            self._consider(detection, due)
        if self._ready(now):
            return [self._emit()]
        return []

    def flush(self) -> list[SelectedFrame]:
        """At the end of a stream: whatever is held is captioned, so no event is lost to the rate limits."""
        if self._best is None:
            return []
        return [self._emit(final=True)]

    # -- tracks ----------------------------------------------------------------------------------

    def zone_shapes(self, camera: str) -> dict[str, list[list[float]]]:
        """The polygons of the zones that apply to `camera` (normalised points), as a caption records them."""
        zones = [zone for zone in self._config.zones if zone.applies_to(camera)]
        return {zone.name: [list(point) for point in zone.points] for zone in zones}

    def zone_visits(self, track_id: int) -> tuple[ZoneVisit, ...]:
        """A live track's zone visits, oldest first."""
        track = self._tracks.get(track_id)
        return tuple(track.visits) if track else ()

    def is_event(self, track_id: int) -> bool:
        """Whether a live track counts as a person event (seen `stable_frames` times, inside a required zone then)."""
        track = self._tracks.get(track_id)
        return track is not None and track.started

    def _use_camera(self, camera: str) -> None:
        """The zones of `camera` and their loiter limits, worked out once per camera, not per track and frame."""
        self._camera = camera
        self._zones = [zone for zone in self._config.zones if zone.applies_to(camera)]
        self._loiter_limits = {zone.name: zone.loiter_s for zone in self._zones if zone.loiter_s is not None}

    def _loiter_s(self, zone: str) -> float:
        return self._loiter_limits.get(zone, math.inf)

    def _loitering(self, track: _Track) -> list[ZoneVisit]:
        """The track's current stays that reached their zone's `loiter_s` and have had no zone-dwell frame."""
        limits = self._loiter_limits
        return [
            visit
            for visit in track.visits
            if visit.exited_s is None
            and not visit.loitered
            and visit.zone in limits
            and visit.dwell_s >= limits[visit.zone]
        ]

    def _update_zones(self, track: _Track, person: PersonBox, now: float, width: int, height: int) -> None:
        zones = self._zones
        inside = zones_of(person, zones, width, height) if zones else set()
        for visit in track.visits:
            if visit.exited_s is None and visit.zone in inside:
                visit.last_seen_s = now
            elif visit.exited_s is None:
                visit.exited_s = now
        for name in sorted(inside - track.inside):
            track.visits.append(ZoneVisit(zone=name, entered_s=now, last_seen_s=now))
            track.entered = True
        track.inside = inside

    def _eligible(self, track: _Track) -> bool:
        return not self._required or bool(track.inside & self._required)

    def _update_tracks(self, detection: Detection, now: float, width: int, height: int) -> None:
        if detection.frame.camera != self._camera:
            self._use_camera(detection.frame.camera)
        seen = set()
        for person in detection.people:
            if person.track_id is None:
                continue
            seen.add(person.track_id)
            track = self._tracks.setdefault(person.track_id, _Track(last_s=now))
            track.frames += 1
            track.last_s = now
            track.box = person
            self._update_zones(track, person, now, width, height)
        for track_id, track in list(self._tracks.items()):
            if track_id not in seen:
                track.box = None
                if now - track.last_s > self._config.event_end_s:
                    del self._tracks[track_id]
                    for visit in track.visits:
                        if visit.exited_s is None:
                            visit.exited_s = visit.last_seen_s
                        self.finished_visits.append(visit)
                    if not self._config.recaption_on_count_change:
                        # Read only to notice people leaving: without that, a pipeline running for months would
                        # keep every track id it ever captioned (per_person adds them up).
                        self._last_caption_ids.discard(track_id)
                    continue
            if not track.started and track.frames >= self._config.stable_frames and self._eligible(track):
                track.started = True
                self.events_started += 1

    def _visible(self) -> dict[int, _Track]:
        return {tid: t for tid, t in self._tracks.items() if t.box is not None and t.started and self._eligible(t)}

    def _due_ids(self, now: float) -> dict[int, SelectionReason]:
        due: dict[int, SelectionReason] = {}
        for tid, track in self._visible().items():
            if track.captioned_s is None:
                due[tid] = SelectionReason.NEW_EVENT
            elif (
                self._config.recaption_interval_s is not None
                and now - track.captioned_s >= self._config.recaption_interval_s
            ):
                due[tid] = SelectionReason.RECAPTION
            elif self._config.zone_entry and track.entered:
                due[tid] = SelectionReason.ZONE_ENTRY
            elif self._loitering(track):
                due[tid] = SelectionReason.ZONE_DWELL
            elif self._config.movement_threshold is not None and track.captioned_center and track.box:
                cx, cy = track.box.center
                px, py = track.captioned_center
                if math.hypot(cx - px, cy - py) >= self._config.movement_threshold * self._diagonal:
                    due[tid] = SelectionReason.MOVEMENT
        return due

    def _due_reasons(self, due: dict[int, SelectionReason]) -> list[SelectionReason]:
        reasons = set(due.values())
        if self._config.recaption_on_count_change and self._last_caption_ids:
            gone = self._last_caption_ids - set(self._tracks)
            if gone and self._visible():
                reasons.add(SelectionReason.PEOPLE_LEFT)
                # Counted once: the people who left are not waited for again.
                self._last_caption_ids -= gone
        return sorted(reasons, key=_REASON_ORDER.index)

    @staticmethod
    def _focus(due: dict[int, SelectionReason]) -> int | None:
        return min(due, key=lambda tid: (_REASON_ORDER.index(due[tid]), tid)) if due else None

    # -- window ----------------------------------------------------------------------------------

    def _consider(self, detection: Detection, due: dict[int, SelectionReason]) -> None:
        if self._window_focus is not None:
            people = tuple(p for p in detection.people if p.track_id == self._window_focus)
        else:
            # Everyone tracked in the frame is in the picture, stable or not yet: one caption covers them all.
            people = tuple(p for p in detection.people if p.track_id is not None)
        if self._required:
            # People outside the required zones make no events and are not what the caption is about.
            people = tuple(p for p in people if p.track_id in self._tracks and self._eligible(self._tracks[p.track_id]))
        if not people:
            return
        wanted = set(due) if SelectionReason.PEOPLE_LEFT not in self._window_reasons else {p.track_id for p in people}
        covered = len(wanted & {p.track_id for p in people})
        if not covered and self._window_focus is None:
            return
        score = frame_score(detection.frame.image, people)
        if self._best is not None:
            best_covered = len(wanted & {p.track_id for p in self._best.people})
            # A frame that shows more of the people who are due beats a prettier one that shows fewer.
            if (covered, score) <= (best_covered, self._best.score):
                return
        self._best = _Candidate(detection=detection, people=people, score=score)

    def _ready(self, now: float) -> bool:
        if self._window_start is None or self._best is None:
            return False
        if now - self._window_start < self._config.best_frame_window_s:
            return False
        # The limits space out requests to the VLM (when captions are sent), not the moments they show: a frame
        # held back by them is still the best one of its window, and no event is dropped to honour them.
        return self._last_emit_s is None or now - self._last_emit_s >= self._min_gap_s

    def _emit(self, final: bool = False) -> SelectedFrame:
        best = self._best
        assert best is not None
        frame = best.detection.frame
        ids = tuple(sorted(p.track_id for p in best.people if p.track_id is not None))
        stays: list[ZoneStay] = []
        for tid in ids:
            track = self._tracks.get(tid)
            if track is not None:
                track.captioned_s = frame.offset_s
                track.captioned_center = next(p.center for p in best.people if p.track_id == tid)
                track.entered = False
                for visit in self._loitering(track):
                    # Done once the picture shows the stay that long; the window's best frame may be older.
                    visit.loitered = visit.loitered or frame.offset_s - visit.entered_s >= self._loiter_s(visit.zone)
                stays += [
                    ZoneStay(visit.zone, tid, visit.entered_s, frame.offset_s - visit.entered_s)
                    for visit in track.visits
                    if visit.holds(frame.offset_s)
                ]
        self._last_caption_ids = set(ids) if not self._config.per_person else self._last_caption_ids | set(ids)
        self._last_emit_s = self._now
        reason = (
            self._window_reasons[0]
            if self._window_reasons
            else (SelectionReason.STREAM_END if final else SelectionReason.NEW_EVENT)
        )
        selected = SelectedFrame(
            detection=Detection(frame=frame, people=best.people),
            reason=reason,
            event_ids=ids,
            score=best.score,
            zones=tuple(sorted(stays, key=lambda stay: (stay.zone, stay.track_id))),
        )
        self._window_start = None
        self._window_reasons = []
        self._window_focus = None
        self._best = None
        return selected


_REASON_ORDER = list(SelectionReason)  # its members are declared in order of precedence
