"""Folders of images, read as if they were the frames of a video."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np

from visioncap.config.sources import FolderSourceConfig
from visioncap.errors import SourceError
from visioncap.frames import Frame

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


class ImageFolderSource:
    """Yields the images of a folder in file-name order; image i stands at i / fps seconds.

    Unreadable images are skipped with a warning and counted in `frames_skipped`; they keep their place in time,
    so the timestamps of the others do not shift.
    """

    def __init__(self, config: FolderSourceConfig) -> None:
        self.camera = config.camera
        self._config = config
        self.frames_read = 0
        self.frames_skipped = 0

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
