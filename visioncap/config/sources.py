"""Where frames come from: video files, live streams (RTSP, HTTP, webcams) and image folders."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Discriminator, Field, Tag, ValidationInfo, field_validator

from visioncap.config.base import StrictModel
from visioncap.config.loading import file_kind, one_line
from visioncap.config.secret_references import reference_problem
from visioncap.redact import mask_credentials

CAMERA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

# URL schemes each stream kind opens: FFmpeg's rtsp demuxer takes rtsp and rtsps (RTSP over TLS), its http
# protocol http and https; anything else (ftp, rtmp, udp, file) is a mistake or another kind of source.
STREAM_SCHEMES: dict[str, tuple[str, ...]] = {"rtsp": ("rtsp", "rtsps"), "http": ("http", "https")}
# A webcam is an OpenCV device index or a V4L2 device path.
_WEBCAM = re.compile(r"[0-9]{1,4}|/dev/\S+")
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def webcam_problem(device: str) -> str | None:
    """Why a webcam's `device` (an index or a device path) would open something else than a device, or None:
    /dev/../data/x.mp4 is a video file under a device's name."""
    text = device.strip()
    if text.startswith("/") and not os.path.normpath(text).startswith("/dev/"):
        return "a webcam's device path must stay under /dev/ (no `..` out of it)"
    return None


def url_problem(url: str, schemes: tuple[str, ...], user: str = "here") -> str | None:
    """Why `url` is not a usable URL with one of `schemes` and a host, or None; `user` ("for kind rtsp") says
    who refuses another scheme.

    Messages never repeat the URL: it may hold a password.
    """
    wanted = " or ".join(f"{scheme}://" for scheme in schemes)
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        return "contains spaces or control characters (percent-encode them: a space is %20)"
    try:
        parts = urlsplit(url)
    except ValueError:
        return "is not a valid URL (unbalanced [ ] around an IPv6 address)"
    if "://" not in url or not parts.scheme:
        return f"is not a URL; expected {wanted}, as in {schemes[0]}://host/path"
    if parts.scheme not in schemes:
        other = [kind for kind, accepted in STREAM_SCHEMES.items() if parts.scheme in accepted]
        hint = f" (for {parts.scheme}:// use `kind: {other[0]}`)" if other else ""
        return f"scheme {parts.scheme}:// is not accepted {user}, expected {wanted}{hint}"
    try:
        port = parts.port  # urlsplit checks the port only when asked
    except ValueError:
        port = 0
    if port == 0:
        return "has an invalid port (must be 1-65535; percent-encode @ : / ? # in a user name or password)"
    if not parts.hostname:
        return "has no host name"
    return None


def _path_not_blank(value: Any) -> Any:
    # Path("") is ".", which would quietly mean the pipeline file's own folder.
    if isinstance(value, str) and not value.strip():
        raise ValueError("must not be empty")
    # A camera URL under `path` (`kind` left out, so `file`) would be reported as a missing file, naming it: as a
    # Path its "//" is gone, so no masking would recognise it as a URL and its password would be shown.
    if isinstance(value, str) and _URL_START.match(value.strip()):
        raise ValueError(
            "is a URL, not a file or folder; a network camera needs `kind: rtsp` or `kind: http` and its URL "
            "under `url:`"
        )
    if "\0" in str(value):
        raise ValueError("contains a NUL character")
    return value


SourcePath = Annotated[Path, BeforeValidator(_path_not_blank)]


class SourceConfigBase(StrictModel):
    """What every source config has; each subclass adds `kind`, a Literal of the config kinds it reads."""

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

    @property
    def description(self) -> str:
        """Where the frames come from, as logs, stored rows, the API and the CLI may show it: credentials masked."""
        raise NotImplementedError(f"{type(self).__name__} does not say where its frames come from")

    def anchored_at(self, folder: Path) -> Self:
        """This source as a pipeline file's: its local paths taken from `folder` (the file's) and checked now, so
        that a run fails before the detector loads rather than when the source is first opened, and what else only
        a file's source is held to. Raises ValueError as "FIELD: problem". A kind without local paths is returned
        as it is."""
        return self

    def _with_path_checked(self, path: Path, folder: Path, as_folder: bool) -> Self:
        resolved = path if path.is_absolute() else (folder / path).resolve()
        if problem := _path_problem(resolved, as_folder):
            raise ValueError(f"path: {problem}")
        return self.model_copy(update={"path": resolved})


class FileSourceConfig(SourceConfigBase):
    """A video file read with OpenCV from start to end; every due frame is analysed, none dropped."""

    kind: Literal["file"] = Field(default="file", description="Source type; `file` reads a video file.")
    path: SourcePath = Field(description="Video file; a relative path is taken from the pipeline file's folder.")

    @property
    def description(self) -> str:
        return str(self.path)

    def anchored_at(self, folder: Path) -> Self:
        return self._with_path_checked(self.path, folder, as_folder=False)


class StreamSourceConfig(SourceConfigBase):
    """A live camera: only the newest frame matters, stale frames are dropped, and a lost stream is reopened."""

    kind: Literal["rtsp", "http", "webcam"] = Field(
        description="`rtsp` (rtsp:// or rtsps:// URL), `http` (http:// or https://: MJPEG or what FFmpeg opens over "
        "HTTP), `webcam` (a device index such as 0, or a device path such as /dev/video0)."
    )
    url: str = Field(
        min_length=1,
        description="Stream URL, or the device index for `webcam`. Credentials are allowed, as user:password@ or "
        "as query parameters (pwd, password, token, key, ...); they are masked wherever the URL is shown or stored. "
        "A credential may be a reference ${VISIONCAP_CAMERA_SECRET_NAME} to the worker's environment, as the whole "
        "password or the whole value of a credential parameter (nowhere else, and to no other variable).",
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

    @property
    def description(self) -> str:
        return mask_credentials(self.url)

    def anchored_at(self, folder: Path) -> Self:
        # Here rather than in the field's validator: rows stored by older versions are read back with this model,
        # and a reference there is refused when the worker resolves it instead of failing every read of the table.
        problem = reference_problem(self.url)
        if problem is None and self.kind == "webcam":
            problem = webcam_problem(self.url)
        if problem:
            raise ValueError(f"url: {problem}")
        return self

    @field_validator("url")
    @classmethod
    def _url_fits_kind(cls, url: str, info: ValidationInfo) -> str:
        kind = info.data.get("kind")
        if kind == "webcam":
            if not _WEBCAM.fullmatch(url.strip()):
                raise ValueError(
                    "a webcam is a device index such as 0 or a device path such as /dev/video0; "
                    "a network camera needs `kind: rtsp` or `kind: http`"
                )
            return url
        if kind not in STREAM_SCHEMES:
            return url  # kind itself failed validation and is reported on its own
        problem = url_problem(url, STREAM_SCHEMES[kind], user=f"for kind {kind}")
        if problem:
            raise ValueError(problem)
        # FFmpeg matches protocol names case-sensitively: RTSP://cam/x would fail only when opened.
        scheme = urlsplit(url).scheme
        return scheme + url[len(scheme) :]


class FolderSourceConfig(SourceConfigBase):
    """A folder of images, analysed in file-name order as if they were frames of a video."""

    kind: Literal["folder"] = Field(description="Source type; `folder` reads the images in a folder.")
    path: SourcePath = Field(description="Folder of .jpg/.jpeg/.png/.bmp/.webp images; relative to the pipeline file.")

    @property
    def description(self) -> str:
        return str(self.path)

    def anchored_at(self, folder: Path) -> Self:
        return self._with_path_checked(self.path, folder, as_folder=True)

    fps: float = Field(default=1.0, gt=0, description="Frame rate the images stand for (sets their timestamps).")


def config_kinds(model: type[SourceConfigBase]) -> tuple[str, ...]:
    """The `kind` values a source config model accepts (the arguments of its `kind` Literal)."""
    return get_args(model.model_fields["kind"].annotation)


# Members of the union are tagged by model, not by kind (one model may take several kinds); the tags show in
# validation error locations (sources.0.stream.url).
_SourceUnion = (
    Annotated[FileSourceConfig, Tag("file")]
    | Annotated[StreamSourceConfig, Tag("stream")]
    | Annotated[FolderSourceConfig, Tag("folder")]
)

SOURCE_CONFIGS: tuple[type[SourceConfigBase], ...] = tuple(get_args(member)[0] for member in get_args(_SourceUnion))
"""Every source config model, in the order of the union."""

# Read from the union, so that a new kind needs only its model and its entry there.
_TAG_OF_KIND: dict[str, str] = {
    kind: tag.tag
    for member in get_args(_SourceUnion)
    for model, tag in [get_args(member)]
    for kind in config_kinds(model)
}

SOURCE_KINDS: tuple[str, ...] = tuple(_TAG_OF_KIND)
"""Every `kind` a source may have, as the pipeline file spells it."""

SOURCE_TAGS: frozenset[str] = frozenset(_TAG_OF_KIND.values())
"""The union's tags, which pydantic puts into error locations (sources.0.stream.url) and error messages leave out."""


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as the user wrote the field: without the source union's tags, which name a model
    (`sources.0.stream.url` and `source.stream.url` are `sources.0.url` and `source.url`); a field that only shares
    a tag's name (Ask's `stream`) stays."""
    parts: list[str] = []
    for index, part in enumerate(loc):
        of_a_source = loc[index - 1 : index] == ("source",) or (
            index >= 2 and loc[index - 2] == "sources" and isinstance(loc[index - 1], int)
        )
        if not (part in SOURCE_TAGS and of_a_source):
            parts.append(str(part))
    return ".".join(parts)


def _source_kind(value: Any) -> str | None:
    # `kind` may be left out for video files, the common case and the first one supported.
    kind = value.get("kind", "file") if isinstance(value, dict) else getattr(value, "kind", None)
    return _TAG_OF_KIND.get(kind) if isinstance(kind, str) else None


SourceConfig = Annotated[
    _SourceUnion,
    Discriminator(
        _source_kind,
        custom_error_type="source_kind",
        custom_error_message=f"kind must be one of {', '.join(SOURCE_KINDS)}",
    ),
]


def _path_problem(resolved: Path, folder: bool) -> str | None:
    """Why a source's video file or image folder cannot be used, or None; checked here so the run fails before
    the detector loads rather than when the source is first opened."""
    what = f"image folder {resolved}" if folder else f"video file {resolved}"
    try:
        info = resolved.stat()
    except FileNotFoundError:
        if resolved.is_symlink():
            return f"{what} is a broken symbolic link"
        return f"{what} does not exist"
    except OSError as exc:
        return f"{what} cannot be read: {one_line(exc.strerror or str(exc))}"
    if folder:
        if stat.S_ISREG(info.st_mode):
            return f"{what} is a file, not a folder (a video file needs `kind: file`)"
        if not stat.S_ISDIR(info.st_mode):
            return f"{what} is {file_kind(info.st_mode)}, not a folder"
        try:
            with os.scandir(resolved):
                pass
        except OSError as exc:
            return f"{what} cannot be listed: {one_line(exc.strerror or str(exc))}"
        return None
    if stat.S_ISDIR(info.st_mode):
        return f"{what} is a directory, not a video file (a folder of images needs `kind: folder`)"
    if not stat.S_ISREG(info.st_mode):
        return f"{what} is {file_kind(info.st_mode)}, not a regular file"
    if info.st_size == 0:
        return f"{what} is empty"
    try:
        with resolved.open("rb"):
            pass
    except OSError as exc:
        return f"{what} cannot be read: {one_line(exc.strerror or str(exc))}"
    return None
