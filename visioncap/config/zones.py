"""Zones and masks: named polygons over a camera's picture, in coordinates normalised to its width and height.

A zone is where a person is (the bottom-centre of their box: their feet); a mask is a region detection ignores
(a screen, a poster, the street beyond the fence), tested with a box's centre. Either may name the one camera it
belongs to; without one it applies to every camera of the pipeline.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator

from visioncap.config.base import StrictModel

Point = tuple[float, float]
ZONE_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
ZoneName = Annotated[str, Field(pattern=ZONE_NAME_PATTERN)]


def point_in_polygon(x: float, y: float, points: list[Point] | tuple[Point, ...]) -> bool:
    """Even-odd ray casting: whether (x, y) lies inside the polygon (a point exactly on an edge may go either way)."""
    inside = False
    count = len(points)
    for i in range(count):
        x1, y1 = points[i]
        x2, y2 = points[(i + 1) % count]
        if (y1 > y) != (y2 > y) and x < x1 + (y - y1) * (x2 - x1) / (y2 - y1):
            inside = not inside
    return inside


class Region(StrictModel):
    """A polygon over the picture; its points are (x, y) with 0,0 the top-left corner and 1,1 the bottom-right."""

    name: str = Field(pattern=ZONE_NAME_PATTERN, description="The region's name.")
    points: list[tuple[float, float]] = Field(
        min_length=3,
        max_length=64,
        description="Corners in order, each [x, y] as fractions of the frame's width and height (0 to 1).",
    )
    camera: str | None = Field(
        default=None, max_length=128, description="The camera it belongs to; none: every camera of the pipeline."
    )

    @field_validator("points")
    @classmethod
    def _normalised(cls, value: list[tuple[float, float]]) -> list[tuple[float, float]]:
        for x, y in value:
            if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
                raise ValueError(f"[{x}, {y}]: coordinates are fractions of the frame, from 0 to 1")
        return value

    def applies_to(self, camera: str) -> bool:
        return self.camera is None or self.camera == camera

    def contains(self, x: float, y: float, width: int, height: int) -> bool:
        """Whether the pixel position (x, y) of a `width` x `height` frame lies inside."""
        return point_in_polygon(x / width, y / height, self.points)


class Zone(Region):
    """A named place people enter and leave (a door, a yard); entries, exits and dwell are kept per track."""

    loiter_s: float | None = Field(
        default=None,
        gt=0,
        le=86_400,
        description="Describe a person again once they have stayed this many seconds in the zone (a zone-dwell "
        "frame, once per stay); none: dwell is recorded but selects no frame.",
    )


class Mask(Region):
    """A region ignored by detection: people whose box centre lies inside are dropped before tracking."""
