"""A pipeline file: sources -> detector -> selection -> caption -> VLM, validated as one model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.loading import load_yaml_model
from visioncap.config.outbox import OutboxConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig, FolderSourceConfig, SourceConfig
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

    @model_validator(mode="after")
    def _unique_cameras(self) -> PipelineConfig:
        seen: set[str] = set()
        for source in self.sources:
            if source.camera in seen:
                raise ValueError(f"camera id {source.camera!r} is used by more than one source")
            seen.add(source.camera)
        return self


# Tags of the sources union, which pydantic puts into error locations (sources.0.stream.url).
_UNION_TAGS = {"file", "stream", "folder"}


def _location(loc: Sequence[int | str]) -> str:
    parts = [str(part) for i, part in enumerate(loc) if not (i == 2 and loc[0] == "sources" and part in _UNION_TAGS)]
    return ".".join(parts) or "(top level)"


def load_pipeline(path: Path) -> PipelineConfig:
    """Parse and validate a pipeline file; every problem becomes one ConfigError line naming file and field."""
    config = load_yaml_model(path, PipelineConfig, "pipeline file", location=_location)
    return _resolve_paths(config, path)


def _resolve_paths(config: PipelineConfig, path: Path) -> PipelineConfig:
    """Anchor relative file and folder paths at the pipeline file's folder and check that they exist."""
    sources = []
    for index, source in enumerate(config.sources):
        if isinstance(source, FileSourceConfig | FolderSourceConfig):
            resolved = source.path if source.path.is_absolute() else (path.parent / source.path).resolve()
            if isinstance(source, FileSourceConfig) and not resolved.is_file():
                raise ConfigError(f"{path}: sources.{index}.path: video file {resolved} does not exist")
            if isinstance(source, FolderSourceConfig) and not resolved.is_dir():
                raise ConfigError(f"{path}: sources.{index}.path: image folder {resolved} does not exist")
            source = source.model_copy(update={"path": resolved})
        sources.append(source)
    return config.model_copy(update={"sources": sources})
