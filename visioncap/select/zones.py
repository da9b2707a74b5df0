"""Where people are: the zones a track stands in (the bottom-centre of its box), its entries, exits and dwell."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from visioncap.config.zones import Zone
from visioncap.frames import PersonBox


@dataclass
class ZoneVisit:
    """One stay of a track in a zone, in video seconds; `exited_s` is None while it lasts."""

    zone: str
    entered_s: float
    exited_s: float | None = None
    last_seen_s: float = 0.0
    loitered: bool = False  # its zone-dwell frame was emitted

    @property
    def dwell_s(self) -> float:
        return (self.exited_s if self.exited_s is not None else self.last_seen_s) - self.entered_s

    def holds(self, moment_s: float) -> bool:
        """Whether the stay covers `moment_s` (video seconds)."""
        return self.entered_s <= moment_s and (self.exited_s is None or moment_s < self.exited_s)


def zones_of(person: PersonBox, zones: Sequence[Zone], width: int, height: int) -> set[str]:
    """The zones whose polygon holds the person's feet (the bottom-centre of the box)."""
    x, y = (person.x1 + person.x2) / 2, person.y2
    return {zone.name for zone in zones if zone.contains(x, y, width, height)}
