"""Where frames come from: video files, live streams (RTSP, HTTP, webcams) and image folders."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from visioncap.config.base import StrictModel

CAMERA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class _SourceBase(StrictModel):
    camera: str = Field(
        pattern=CAMERA_ID_PATTERN,
        description="Camera id stored with every caption (letters, digits, `_`, `.`, `-`).",
    )
    analyze_fps: float | None = Field(
        default=None,
        gt=0,
        description="Frames per second to run the detector on; None analyses every frame (files) or as fast "
        "as the detector keeps up (live streams).",
    )


class FileSourceConfig(_SourceBase):
    """A video file read with OpenCV from start to end; every due frame is analysed, none dropped."""

    kind: Literal["file"] = Field(default="file", description="Source type; `file` reads a video file.")
    path: Path = Field(description="Video file; a relative path is taken from the pipeline file's folder.")


class StreamSourceConfig(_SourceBase):
    """A live camera: only the newest frame matters, stale frames are dropped, and a lost stream is reopened."""

    kind: Literal["rtsp", "http", "webcam"] = Field(
        description="`rtsp` (rtsp:// URL), `http` (MJPEG or what FFmpeg opens over HTTP), `webcam` (a device index)."
    )
    url: str = Field(
        min_length=1,
        description="Stream URL (credentials allowed; they are masked in logs), or the device index for `webcam`.",
    )
    open_timeout_s: float = Field(default=10.0, gt=0, description="Seconds to wait for the stream to open.")
    read_timeout_s: float = Field(
        default=5.0, gt=0, description="Seconds without a frame before the stream counts as lost and is reopened."
    )
    reconnect_initial_s: float = Field(default=0.5, gt=0, description="First wait before reopening a lost stream.")
    reconnect_max_s: float = Field(default=30.0, gt=0, description="Longest wait between reopening attempts.")
    rtsp_transport: Literal["tcp", "udp"] = Field(
        default="tcp", description="RTSP transport; TCP survives packet loss without smeared frames."
    )


class FolderSourceConfig(_SourceBase):
    """A folder of images, analysed in file-name order as if they were frames of a video."""

    kind: Literal["folder"] = Field(description="Source type; `folder` reads the images in a folder.")
    path: Path = Field(description="Folder of .jpg/.jpeg/.png/.bmp/.webp images; relative to the pipeline file.")
    fps: float = Field(default=1.0, gt=0, description="Frame rate the images stand for (sets their timestamps).")


def _source_kind(value: Any) -> str | None:
    # `kind` may be left out for video files, the common case and the first one supported.
    kind = value.get("kind", "file") if isinstance(value, dict) else getattr(value, "kind", None)
    if kind in ("rtsp", "http", "webcam"):
        return "stream"
    return kind if isinstance(kind, str) else None


SourceConfig = Annotated[
    Annotated[FileSourceConfig, Tag("file")]
    | Annotated[StreamSourceConfig, Tag("stream")]
    | Annotated[FolderSourceConfig, Tag("folder")],
    Discriminator(
        _source_kind,
        custom_error_type="source_kind",
        custom_error_message="kind must be one of file, rtsp, http, webcam, folder",
    ),
]
