"""Immutable records passed from one pipeline stage to the next."""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def as_dict(self) -> dict[str, float | int]:
        return {
            "x1": round(self.x1, 1),
            "y1": round(self.y1, 1),
            "x2": round(self.x2, 1),
            "y2": round(self.y2, 1),
            "confidence": round(self.confidence, 4),
            "class_id": self.class_id,
        }


@dataclass(frozen=True, slots=True)
class Detection:
    """A frame and the people found in it (possibly none)."""

    frame: Frame
    people: tuple[PersonBox, ...]


@dataclass(frozen=True, slots=True)
class SelectedFrame:
    """A person frame chosen for captioning, with the reason it was chosen."""

    detection: Detection
    reason: str


@dataclass(frozen=True, slots=True)
class EncodedImage:
    """A JPEG ready to send, and the size it was encoded at."""

    jpeg: bytes = field(repr=False)
    width: int
    height: int


@dataclass(frozen=True, slots=True)
class Caption:
    """What the VLM answered for one frame."""

    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
