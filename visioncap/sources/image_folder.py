"""Folders of images, read as if they were the frames of a video."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import cv2
import numpy as np

from visioncap.config.sources import FolderSourceConfig
from visioncap.errors import SourceError
from visioncap.frames import Frame
from visioncap.sources.base import FrameSource
from visioncap.sources.registry import register_source
from visioncap.sources.state import StateListener

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})

_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key that orders numbered names as people do: frame2 before frame10."""
    # Numbers and text are tagged so that they never compare with each other, whatever the names look like.
    return tuple((0, int(part)) if part.isdigit() else (1, part.casefold()) for part in _DIGITS.split(name) if part)


def image_files(folder: Path) -> list[Path]:
    """The images directly in `folder`, in natural file-name order."""
    files = [p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
    return sorted(files, key=lambda p: (natural_key(p.name), p.name))


@register_source(FolderSourceConfig)
class ImageFolderSource(FrameSource):
    """Yields the images of a folder in file-name order; image i stands at i / fps seconds.

    Unreadable images are skipped with a warning and counted in `frames_skipped`; they keep their place in time,
    so the timestamps of the others do not shift.
    """

    _config: FolderSourceConfig

    def __init__(self, config: FolderSourceConfig, on_state: StateListener | None = None) -> None:
        super().__init__(config, on_state)
        self.frames_skipped = 0
        self._stopping = threading.Event()
        self._anchor: datetime | None = None

    @property
    def description(self) -> str:
        return self._config.description

    def time_anchor(self) -> datetime:
        """The newest image stands for the last frame, `count / fps` seconds after the first (as for a video file,
        the same on every run over the same folder)."""
        if self._anchor is None:
            folder = self._config.path
            images = [p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]
            newest = max((p.stat().st_mtime for p in images), default=folder.stat().st_mtime)
            self._anchor = datetime.fromtimestamp(newest, UTC) - timedelta(seconds=len(images) / self._config.fps)
        return self._anchor

    def _full_rate(self) -> float:
        return self._config.fps

    def stop(self) -> None:
        self._stopping.set()

    def frames(self) -> Iterator[Frame]:
        folder = self._config.path
        if not folder.is_dir():
            raise SourceError(f"camera {self.camera}: image folder {folder} does not exist")
        paths = image_files(folder)
        if not paths:
            suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
            raise SourceError(f"camera {self.camera}: no images ({suffixes}) in {folder}")
        fps = self._config.fps
        # The same analysis clock as video files, so that analyze_fps picks evenly spaced images; images that are
        # not due are never decoded.
        step = 1.0 if self._config.analyze_fps is None else min(1.0, self._config.analyze_fps / fps)
        next_due = 0.0
        for index, path in enumerate(paths):
            if self._stopping.is_set():
                return  # cut short on purpose: not a folder without readable images
            if index < next_due - 1e-9:
                continue
            next_due += 1.0 / step
            image = self._decode(path)
            if image is None:
                self.frames_skipped += 1
                log.warning("camera %s: skipping unreadable image %s", self.camera, path)
                continue
            self.frames_read += 1
            yield Frame(camera=self.camera, index=index, offset_s=index / fps, image=image)
        if self.frames_read == 0:
            raise SourceError(f"camera {self.camera}: none of the images due for analysis in {folder} could be read")

    @staticmethod
    def _decode(path: Path) -> np.ndarray | None:
        try:
            data = np.fromfile(path, dtype=np.uint8)
        except OSError:
            return None
        if data.size == 0:
            return None
        # imdecode rather than imread: it takes the bytes whatever the path's encoding, and IMREAD_COLOR gives the
        # 3-channel BGR every other source yields, for grey and transparent images too.
        return cv2.imdecode(data, cv2.IMREAD_COLOR)
