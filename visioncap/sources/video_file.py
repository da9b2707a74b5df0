"""Video files read with OpenCV."""

from __future__ import annotations

import math
from collections.abc import Iterator

import cv2

from visioncap.config.sources import FileSourceConfig
from visioncap.errors import SourceError
from visioncap.frames import Frame

# Containers that do not record a frame rate report 0 (or NaN); timestamps then assume this.
FALLBACK_FPS = 25.0


class VideoFileSource:
    """Reads a video file from start to end, yielding the frames due at the configured analysis rate."""

    def __init__(self, config: FileSourceConfig) -> None:
        self.camera = config.camera
        self._config = config
        self.frames_read = 0

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
            while True:
                due = index >= next_due - 1e-9
                # grab() skips the colour conversion of frames that are not analysed.
                ok, image = capture.read() if due else (capture.grab(), None)
                if not ok:
                    break
                self.frames_read += 1
                if due:
                    next_due += 1.0 / step
                    yield Frame(camera=self.camera, index=index, offset_s=index / fps, image=image)
                index += 1
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
