"""Immutable records passed from one pipeline stage to the next."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded video frame (BGR, as OpenCV gives it) and where it came from."""

    camera: str
    index: int
    offset_s: float
    image: np.ndarray = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class PersonBox:
    """A detected person in pixel coordinates of the original frame."""

    x1: float
    y1: float
    x2: float
    y2: float
    confidence: float
    class_id: int
    track_id: int | None = None

    @property
    def area(self) -> float:
        return max(0.0, self.x2 - self.x1) * max(0.0, self.y2 - self.y1)

    @property
    def center(self) -> tuple[float, float]:
        return (self.x1 + self.x2) / 2, (self.y1 + self.y2) / 2

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "x1": round(self.x1, 1),
            "y1": round(self.y1, 1),
            "x2": round(self.x2, 1),
            "y2": round(self.y2, 1),
            "confidence": round(self.confidence, 4),
            "class_id": self.class_id,
            "track_id": self.track_id,
        }


@dataclass(frozen=True, slots=True)
class Detection:
    """A frame and the people found in it (possibly none)."""

    frame: Frame
    people: tuple[PersonBox, ...]


class SelectionReason(StrEnum):
    """Why a frame was chosen for a caption; in order of precedence when several apply."""

    NEW_EVENT = "new-event"  # a person event became stable and has no caption yet
    PEOPLE_LEFT = "people-left"  # people the last caption described have left
    MOVEMENT = "movement"  # a captioned person moved far
    ZONE_ENTRY = "zone-entry"  # a captioned person entered a zone
    ZONE_DWELL = "zone-dwell"  # a person has stayed in a zone for its `loiter_s` (once per stay)
    RECAPTION = "recaption"  # the recaption interval of a captioned person passed
    STREAM_END = "stream-end"  # the stream ended with a frame held back by the rate limits
    EVENT_END = "event-end"  # an event described from several of its frames once it ended (never a window's)


@dataclass(frozen=True, slots=True)
class ZoneStay:
    """A person in a zone at the moment of a frame: since when (video seconds) and for how long so far."""

    zone: str
    track_id: int
    entered_s: float
    dwell_s: float

    def as_dict(self) -> dict[str, str | int | float]:
        return {"zone": self.zone, "track_id": self.track_id, "dwell_s": round(self.dwell_s, 1)}


@dataclass(frozen=True, slots=True)
class SelectedFrame:
    """A person frame chosen for captioning: why, for which person events (track ids), how good it is, and the
    zones its people stand in."""

    detection: Detection
    reason: SelectionReason
    event_ids: tuple[int, ...] = ()
    score: float = 0.0
    zones: tuple[ZoneStay, ...] = ()

    @property
    def event_key(self) -> str:
        """Frames with the same key describe the same event and may replace each other in a full queue."""
        first = min(self.event_ids) if self.event_ids else self.detection.frame.index
        return f"{self.detection.frame.camera}:{first}"


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """A JPEG ready to send, the size it was encoded at, and the image tokens the VLM will spend on it."""

    jpeg: bytes = field(repr=False)
    width: int
    height: int
    image_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EventFrame:
    """One frame kept of a track for its event description, already encoded at its share of the budget."""

    role: str  # first, best, last, or zone:<name> (entered there); several joined by "+" when one frame is both
    frame_index: int
    offset_s: float
    image: EncodedImage
    person: PersonBox
    frame_width: int
    frame_height: int

    def as_dict(self) -> dict[str, str | int | float]:
        """The frame as a description row lists it (the outbox adds the path of its file)."""
        return {
            "role": self.role,
            "frame_index": self.frame_index,
            "offset_s": round(self.offset_s, 3),
            "width": self.image.width,
            "height": self.image.height,
            "image_tokens": self.image.image_tokens,
        }


@dataclass(frozen=True, slots=True)
class FinishedEvent:
    """A person event (one track) that ended, or a part of a long stay that did, with the frames to describe it."""

    camera: str
    track_id: int
    started_s: float
    ended_s: float
    frames: tuple[EventFrame, ...]  # oldest first
    zones: tuple[ZoneStay, ...]  # each zone visited, with the time spent in it
    part: int = 0  # 0 for an event's first description; long stays get one per max_duration_s
    final: bool = True  # False: a part of a stay that goes on

    @property
    def event_key(self) -> str:
        """The key of the track's own captions (SelectedFrame.event_key of a frame of this person alone)."""
        return f"{self.camera}:{self.track_id}"

    @property
    def main(self) -> EventFrame:
        """The frame that stands for the description (its image, its person box): the best one."""
        return next((frame for frame in self.frames if "best" in frame.role.split("+")), self.frames[-1])


@dataclass(frozen=True, slots=True)
class Caption:
    """What the VLM answered for one frame."""

    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    structured: dict[str, Any] | None = None
