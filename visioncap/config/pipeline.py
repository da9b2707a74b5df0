"""A pipeline file: sources -> detector -> selection -> caption -> VLM, validated as one model."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from visioncap.config.base import StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.loading import file_kind, load_yaml_model, one_line
from visioncap.config.outbox import OutboxConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig, FolderSourceConfig, SourceConfig, url_problem
from visioncap.config.vlm import VlmConfig
from visioncap.errors import ConfigError


class PipelineConfig(StrictModel):
    """Everything one `visioncap run` needs besides process-wide settings."""

    name: str = Field(min_length=1, description="Pipeline name, shown in logs.")
    sources: list[SourceConfig] = Field(min_length=1, description="Cameras, streams, videos or image folders to watch.")
    detector: DetectorConfig = Field(default_factory=DetectorConfig, description="Person detector.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="Frame selection policy.")
    caption: CaptionConfig = Field(default_factory=CaptionConfig, description="Prompt and image size.")
    vlm: VlmConfig = Field(description="Endpoint and model that write the captions.")
    outbox: OutboxConfig = Field(
        default_factory=OutboxConfig, description="Queue and retries between selection and VLM."
    )

    @field_validator("sources", mode="before")
    @classmethod
    def _sources_are_mappings(cls, value: Any) -> Any:
        # Without this a bare URL or path as a list item is reported as a wrong `kind`, which it is not.
        if isinstance(value, list):
            for index, item in enumerate(value):
                if not isinstance(item, dict):
                    raise ValueError(
                        f"item {index} must be a mapping (camera: ..., path: ... or kind: ..., url: ...), "
                        f"got {type(item).__name__}"
                    )
        return value

    @field_validator("sources")
    @classmethod
    def _unique_cameras(cls, sources: list[SourceConfig]) -> list[SourceConfig]:
        first: dict[str, int] = {}
        for index, source in enumerate(sources):
            if source.camera in first:
                raise ValueError(
                    f"camera id {source.camera!r} is used by more than one source "
                    f"(sources.{first[source.camera]} and sources.{index}); captions are stored by camera id"
                )
            first[source.camera] = index
        return sources


# Tags of the sources union, which pydantic puts into error locations (sources.0.stream.url).
_UNION_TAGS = {"file", "stream", "folder"}


def _location(loc: Sequence[int | str]) -> str:
    parts = [str(part) for i, part in enumerate(loc) if not (i == 2 and loc[0] == "sources" and part in _UNION_TAGS)]
    return ".".join(parts) or "(top level)"


def load_pipeline(path: Path) -> PipelineConfig:
    """Parse and validate a pipeline file; every problem becomes one ConfigError line naming file and field."""
    config = load_yaml_model(path, PipelineConfig, "pipeline file", location=_location)
    if config.vlm.base_url is not None and (problem := url_problem(config.vlm.base_url, ("http", "https"))):
        # VlmConfig only checks the scheme, and "http://" alone would fail only when the first caption is sent.
        raise ConfigError(f"{path}: vlm.base_url: {problem}")
    return _resolve_paths(config, path)


def _resolve_paths(config: PipelineConfig, path: Path) -> PipelineConfig:
    """Anchor relative file and folder paths at the pipeline file's folder and check that they can be read."""
    sources = []
    for index, source in enumerate(config.sources):
        if isinstance(source, FileSourceConfig | FolderSourceConfig):
            resolved = source.path if source.path.is_absolute() else (path.parent / source.path).resolve()
            problem = _path_problem(resolved, folder=isinstance(source, FolderSourceConfig))
            if problem:
                raise ConfigError(f"{path}: sources.{index}.path: {problem}")
            source = source.model_copy(update={"path": resolved})
        sources.append(source)
    return config.model_copy(update={"sources": sources})


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
