"""Which person frames are worth a caption: person events (tracks) and when to describe them."""

from __future__ import annotations

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel
from visioncap.config.zones import Mask, Zone


class SelectionConfig(StrictModel):
    """Each person event (a track) is captioned once it is stable, from the best frame of a short window, and
    again after an interval or a significant change; per-camera limits bound how often any of this happens."""

    stable_frames: int = Field(
        default=3, ge=1, description="Analysed frames a track must be seen in before it counts as a person event."
    )
    best_frame_window_s: float = Field(
        default=1.0,
        ge=0,
        description="Once an event is due, the best frame (confidence x box area x sharpness) seen within this "
        "many seconds is the one captioned.",
    )
    recaption_interval_s: float | None = Field(
        default=60.0, gt=0, description="Describe people still in view again after this many seconds; None: never."
    )
    recaption_on_count_change: bool = Field(
        default=True,
        description="Describe the scene again when people leave while others stay (arrivals are new events anyway).",
    )
    movement_threshold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Describe again when a person's box centre moved this fraction of the frame diagonal since "
        "their last caption; None: never.",
    )
    min_interval_s: float = Field(
        default=2.0, ge=0, description="Least seconds between two captions of one camera (video time)."
    )
    max_captions_per_minute: float | None = Field(
        default=None, gt=0, description="Most captions per minute for one camera (a token bucket); None: no cap."
    )
    per_person: bool = Field(
        default=False,
        description="One caption per person event; by default several people in view share one caption.",
    )
    event_end_s: float = Field(
        default=2.0, gt=0, description="A track not seen for this many seconds has left; its event is over."
    )
    zones: list[Zone] = Field(
        default_factory=list,
        max_length=64,
        description="Named places (normalised polygons); a person is in a zone when the bottom-centre of their box is.",
    )
    masks: list[Mask] = Field(
        default_factory=list,
        max_length=64,
        description="Regions detection ignores: a person whose box centre lies in one is dropped before tracking.",
    )
    required_zones: list[str] = Field(
        default_factory=list,
        description="Only people inside one of these zones make events; empty: people anywhere do.",
    )
    zone_entry: bool = Field(
        default=True, description="Describe a person again when they enter a zone (a zone-entry frame)."
    )

    @model_validator(mode="after")
    def _required_zones_exist(self) -> SelectionConfig:
        names = {zone.name for zone in self.zones}
        if unknown := sorted(set(self.required_zones) - names):
            raise ValueError(f"required_zones: {', '.join(unknown)} not among the zones ({', '.join(sorted(names))})")
        return self
