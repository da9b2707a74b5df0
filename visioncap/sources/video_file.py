"""Video files read with OpenCV."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import cv2

from visioncap.config.sources import FileSourceConfig
from visioncap.errors import SourceError
from visioncap.frames import Frame
from visioncap.sources.base import FrameSource
from visioncap.sources.registry import register_source
from visioncap.sources.state import StateListener

# Containers that do not record a frame rate report 0 (or NaN); timestamps then assume this.
FALLBACK_FPS = 25.0


def _frame_count_and_rate(path: Path) -> tuple[float, float]:
    """What the container says: frame count and frames per second, 0 where it does not say."""
    capture = cv2.VideoCapture(str(path))
    try:
        return capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0.0, capture.get(cv2.CAP_PROP_FPS) or 0.0
    finally:
        capture.release()


@register_source(FileSourceConfig)
class VideoFileSource(FrameSource):
    """Reads a video file from start to end, yielding the frames due at the configured analysis rate."""

    _config: FileSourceConfig

    def __init__(self, config: FileSourceConfig, on_state: StateListener | None = None) -> None:
        super().__init__(config, on_state)
        self._stopping = threading.Event()
        self._anchor: datetime | None = None

    @property
    def description(self) -> str:
        return self._config.description

    def time_anchor(self) -> datetime:
        """A recording ends at its file's modification time, so it started its duration earlier: capture times
        are then the same on every run over the same file, which is how a re-run recognises frames it already
        stored."""
        if self._anchor is None:
            count, fps = _frame_count_and_rate(self._config.path)
            duration = count / fps if fps > 0 and count > 0 else 0.0
            modified = datetime.fromtimestamp(self._config.path.stat().st_mtime, UTC)
            self._anchor = modified - timedelta(seconds=duration)
        return self._anchor

    def _full_rate(self) -> float:
        _, fps = _frame_count_and_rate(self._config.path)
        return fps if fps > 0 else FALLBACK_FPS

    def stop(self) -> None:
        self._stopping.set()

    def frames(self) -> Iterator[Frame]:
        path = self._config.path
        capture = cv2.VideoCapture(str(path))
        if not capture.isOpened():
            raise SourceError(f"camera {self.camera}: cannot open video file {path}")
        try:
            fps = capture.get(cv2.CAP_PROP_FPS)
            if not fps or math.isnan(fps) or fps <= 0:
                fps = FALLBACK_FPS
            # Analyse a frame whenever the analysis clock ticks over, so that any analyze_fps
            # below the video's rate picks evenly spaced frames.
            step = 1.0 if self._config.analyze_fps is None else min(1.0, self._config.analyze_fps / fps)
            index = 0
            next_due = 0.0
            while not self._stopping.is_set():
                due = index >= next_due - 1e-9
                # grab() skips the colour conversion of frames that are not analysed.
                ok, image = capture.read() if due else (capture.grab(), None)
                if not ok:
                    break
                self.frames_read += 1
                if due and image is not None:
                    next_due += 1.0 / step
                    yield Frame(camera=self.camera, index=index, offset_s=index / fps, image=image)
                index += 1
            if self._stopping.is_set():
                return  # cut short on purpose: neither empty nor truncated
            if self.frames_read == 0:
                raise SourceError(f"camera {self.camera}: no frame could be decoded from {path}")
            expected = int(capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
            if expected > 0 and self.frames_read < expected:
                # OpenCV just stops at a broken or missing tail; the frames before it were used, but the
                # camera's run is incomplete and must say so.
                raise SourceError(
                    f"camera {self.camera}: video file {path} ended after {self.frames_read} of {expected} frames "
                    "(truncated or corrupt)"
                )
        finally:
            capture.release()
