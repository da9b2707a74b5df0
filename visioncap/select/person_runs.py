"""Selects the first frame of each run of person frames, then at most one per interval while it lasts."""

from __future__ import annotations

from visioncap.config.selection import SelectionConfig
from visioncap.frames import Detection, SelectedFrame


class PersonRunSelector:
    """Selection state of one camera; feed it every analysed detection in order."""

    def __init__(self, config: SelectionConfig) -> None:
        self._config = config
        self._last_person_s: float | None = None
        self._last_selected_s: float | None = None

    def offer(self, detection: Detection) -> SelectedFrame | None:
        """The frame to caption, or None when the policy skips it."""
        if not detection.people:
            return None
        now = detection.frame.offset_s
        new_run = self._last_person_s is None or now - self._last_person_s > self._config.gap_s
        self._last_person_s = now
        if new_run:
            reason = "run-start"
        elif self._last_selected_s is not None and now - self._last_selected_s >= self._config.interval_s:
            reason = "interval"
        else:
            return None
        self._last_selected_s = now
        return SelectedFrame(detection=detection, reason=reason)
