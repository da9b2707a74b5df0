"""Person tracks: Ultralytics' own trackers (ByteTrack, BoT-SORT), one instance per camera."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from visioncap.config.zones import Mask
from visioncap.frames import Detection, PersonBox


def unmasked(detection: Detection, masks: Sequence[Mask]) -> Detection:
    """The detection without the people whose box centre lies in one of the camera's masks."""
    masks = [mask for mask in masks if mask.applies_to(detection.frame.camera)]
    if not masks or not detection.people:
        return detection
    height, width = detection.frame.image.shape[:2]
    people = tuple(p for p in detection.people if not any(mask.contains(*p.center, width, height) for mask in masks))
    return detection if len(people) == len(detection.people) else Detection(frame=detection.frame, people=people)


class PersonTracker:
    """Gives each detected person a track id that stays the same while they remain in view."""

    def __init__(self, kind: str, analyse_fps: float, keep_lost_s: float, masks: Sequence[Mask] = ()) -> None:
        self._masks = tuple(masks)
        from ultralytics.trackers.track import TRACKER_MAP
        from ultralytics.utils import YAML, IterableSimpleNamespace
        from ultralytics.utils.checks import check_yaml

        args = IterableSimpleNamespace(**YAML.load(check_yaml(f"{kind}.yaml")))  # type: ignore[no-untyped-call]
        # track_buffer counts frames; the pipeline thinks in seconds, whatever rate it analyses at.
        args.track_buffer = max(1, math.ceil(keep_lost_s * analyse_fps))
        self._tracker: Any = TRACKER_MAP[kind](args=args)

    def update(self, detection: Detection) -> Detection:
        """The detection with track ids; people whose track is not yet confirmed, or who stand in a mask, are left
        out (masked ones before tracking, so that a poster never holds a track)."""
        from ultralytics.engine.results import Boxes

        detection = unmasked(detection, self._masks)
        image = detection.frame.image
        people = detection.people
        data = np.array([[p.x1, p.y1, p.x2, p.y2, p.confidence, p.class_id] for p in people], dtype=np.float32).reshape(
            -1, 6
        )
        tracks = self._tracker.update(Boxes(data, image.shape[:2]), image)
        tracked = []
        for row in tracks:
            # Columns: x1, y1, x2, y2, track id, score, class, index of the detection it matched.
            source = people[int(row[7])]
            tracked.append(
                PersonBox(
                    x1=source.x1,
                    y1=source.y1,
                    x2=source.x2,
                    y2=source.y2,
                    confidence=source.confidence,
                    class_id=source.class_id,
                    track_id=int(row[4]),
                )
            )
        tracked.sort(key=lambda p: p.track_id or 0)
        return Detection(frame=detection.frame, people=tuple(tracked))
