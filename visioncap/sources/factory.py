"""Source configs to frame sources, and when each source's time starts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import cv2

from visioncap.config.sources import FileSourceConfig, FolderSourceConfig, SourceConfig, StreamSourceConfig
from visioncap.sources.base import FrameSource
from visioncap.sources.image_folder import IMAGE_SUFFIXES

if TYPE_CHECKING:
    from visioncap.sources.state import StateListener


def open_source(config: SourceConfig, on_state: StateListener | None = None) -> FrameSource:
    if isinstance(config, FileSourceConfig):
        from visioncap.sources.video_file import VideoFileSource

        return VideoFileSource(config)
    if isinstance(config, StreamSourceConfig):
        from visioncap.sources.stream import StreamSource

        return StreamSource(config, on_state=on_state)
    from visioncap.sources.image_folder import ImageFolderSource

    return ImageFolderSource(config)


def time_anchor(config: SourceConfig) -> datetime:
    """The wall-clock time of offset 0.

    Live streams start when first read; their source reports that (`started_at`) and this is only a fallback.
    A recording ends at its file's modification time, so it started its duration earlier: capture times are
    then the same on every run over the same file, which is how a re-run recognises frames it already stored.
    """
    if isinstance(config, StreamSourceConfig):
        return datetime.now(UTC)
    if isinstance(config, FileSourceConfig):
        capture = cv2.VideoCapture(str(config.path))
        try:
            count = capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0.0
            fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
        finally:
            capture.release()
        duration = count / fps if fps > 0 and count > 0 else 0.0
        modified = datetime.fromtimestamp(config.path.stat().st_mtime, UTC)
        return modified - timedelta(seconds=duration)
    assert isinstance(config, FolderSourceConfig)
    images = [p for p in config.path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
    newest = max((p.stat().st_mtime for p in images), default=config.path.stat().st_mtime)
    return datetime.fromtimestamp(newest, UTC) - timedelta(seconds=len(images) / config.fps)


def analyse_rate(config: SourceConfig) -> float:
    """Frames per second the detector sees from this source (for the tracker's memory in frames)."""
    if config.analyze_fps is not None:
        return config.analyze_fps
    if isinstance(config, FileSourceConfig):
        capture = cv2.VideoCapture(str(config.path))
        try:
            fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
        finally:
            capture.release()
        return fps if fps > 0 else 25.0
    if isinstance(config, FolderSourceConfig):
        return config.fps
    return 10.0
