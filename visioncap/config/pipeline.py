"""A pipeline file: sources -> detector -> selection -> caption -> VLM, validated as one model."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from visioncap.config.base import StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig
from visioncap.config.vlm import VlmConfig
from visioncap.errors import ConfigError


class PipelineConfig(StrictModel):
    """Everything one `visioncap run` needs besides process-wide settings."""

    name: str = Field(min_length=1, description="Pipeline name, shown in logs.")
    sources: list[FileSourceConfig] = Field(min_length=1, description="Cameras or videos to watch.")
    detector: DetectorConfig = Field(default_factory=DetectorConfig, description="Person detector.")
    selection: SelectionConfig = Field(default_factory=SelectionConfig, description="Frame selection policy.")
    caption: CaptionConfig = Field(default_factory=CaptionConfig, description="Prompt and image size.")
    vlm: VlmConfig = Field(description="Endpoint and model that write the captions.")

    @model_validator(mode="after")
    def _unique_cameras(self) -> PipelineConfig:
        seen: set[str] = set()
        for source in self.sources:
            if source.camera in seen:
                raise ValueError(f"camera id {source.camera!r} is used by more than one source")
            seen.add(source.camera)
        return self


def _location(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def load_pipeline(path: Path) -> PipelineConfig:
    """Parse and validate a pipeline file; every problem becomes one ConfigError line naming file and field."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read pipeline file: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a pipeline file must be a mapping of fields, got {type(raw).__name__}")
    try:
        config = PipelineConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{_location(err['loc'])}: {err['msg']}" for err in exc.errors())
        raise ConfigError(f"{path}: {problems}") from exc
    return _resolve_paths(config, path)


def _resolve_paths(config: PipelineConfig, path: Path) -> PipelineConfig:
    """Anchor relative source paths at the pipeline file's folder and check that the files exist."""
    sources = []
    for index, source in enumerate(config.sources):
        resolved = source.path if source.path.is_absolute() else (path.parent / source.path).resolve()
        if not resolved.is_file():
            raise ConfigError(f"{path}: sources.{index}.path: video file {resolved} does not exist")
        sources.append(source.model_copy(update={"path": resolved}))
    return config.model_copy(update={"sources": sources})
