"""Where frames come from."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from visioncap.config.base import StrictModel

CAMERA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class FileSourceConfig(StrictModel):
    """A video file read with OpenCV from start to end."""

    kind: Literal["file"] = Field(default="file", description="Source type; `file` reads a video file.")
    camera: str = Field(
        pattern=CAMERA_ID_PATTERN,
        description="Camera id stored with every caption (letters, digits, `_`, `.`, `-`).",
    )
    path: Path = Field(description="Video file; a relative path is taken from the pipeline file's folder.")
    analyze_fps: float | None = Field(
        default=None,
        gt=0,
        description="Frames per second of video to run the detector on; None analyses every frame.",
    )
