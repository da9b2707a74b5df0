"""A pipeline file: sources -> detector -> selection -> caption -> VLM, validated as one model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from visioncap.config.base import StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.loading import load_yaml_model
from visioncap.config.outbox import OutboxConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import SourceConfig, field_path, url_problem
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


def _location(loc: Sequence[int | str]) -> str:
    return field_path(loc) or "(top level)"


def load_pipeline(path: Path) -> PipelineConfig:
    """Parse and validate a pipeline file; every problem becomes one ConfigError line naming file and field."""
    config = load_yaml_model(path, PipelineConfig, "pipeline file", location=_location)
    if config.vlm.base_url is not None and (problem := url_problem(config.vlm.base_url, ("http", "https"))):
        # VlmConfig only checks the scheme, and "http://" alone would fail only when the first caption is sent.
        raise ConfigError(f"{path}: vlm.base_url: {problem}")
    return _resolve_paths(config, path)


def _resolve_paths(config: PipelineConfig, path: Path) -> PipelineConfig:
    """Each source's local paths anchored at the pipeline file's folder and checked (its kind knows which)."""
    sources = []
    for index, source in enumerate(config.sources):
        try:
            sources.append(source.anchored_at(path.parent))
        except ValueError as exc:
            raise ConfigError(f"{path}: sources.{index}.{exc}") from None
    return config.model_copy(update={"sources": sources})
