"""A camera as data: its source config plus per-camera overrides, stored in the database and run by a worker.

The API and `visioncap cameras` write these; `visioncap run` seeds them from its pipeline file. Secrets never
enter the database: a URL names them as `${VARIABLE}` references (in the password or a credential parameter),
resolved from the worker's environment only when it opens the source (`resolve_references`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, Strict, field_validator
from pydantic_core import PydanticCustomError

from visioncap.config.base import StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig, FolderSourceConfig, SourceConfig, StreamSourceConfig
from visioncap.errors import ConfigError
from visioncap.redact import secret_values

REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# Caption settings that apply frame by frame (how the image is made); the prompt and token limits belong to the
# pipeline's one VLM client and stay pipeline-wide.
CAPTION_OVERRIDES = frozenset({"image_mode", "crop_padding", "max_image_tokens", "jpeg_quality"})

INLINE_SECRET = (
    "holds a password or credential inline; the database and API never keep secrets: put it in an environment "
    "variable of the worker and reference it as ${NAME} (user:${CAM_PASSWORD}@ in place of user:password@)"
)


def has_inline_secret(url: str) -> bool:
    """Whether `url` carries a secret that is not wholly a `${NAME}` reference (an empty password is none)."""
    return any(value and not REFERENCE.fullmatch(value) for value in secret_values(url))


def resolve_references(url: str, environ: Mapping[str, str] | None = None) -> str:
    """`url` with each `${NAME}` replaced by that environment variable; ConfigError naming a missing one."""
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in env:
            raise ConfigError(f"environment variable {name} (referenced by the camera URL) is not set")
        return env[name]

    return REFERENCE.sub(value, url)


class CameraConfig(StrictModel):
    """One camera a worker runs: where its frames come from and what it does differently from its pipeline."""

    pipeline: str = Field(min_length=1, max_length=128, description="Name of the pipeline whose worker runs it.")
    source: SourceConfig = Field(description="The source, as in a pipeline file's `sources` (its `camera` is the id).")
    selection: dict[str, Any] = Field(
        default_factory=dict, description="Selection settings that replace the pipeline's for this camera."
    )
    caption: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Image settings for this camera's captions ({', '.join(sorted(CAPTION_OVERRIDES))}).",
    )
    # Strict: a JSON body's 0 or "no" is refused, as its schema (a boolean) says, not read as false.
    paused: Annotated[bool, Strict()] = Field(default=False, description="A paused camera is kept but not read.")

    @field_validator("selection")
    @classmethod
    def _selection_fits(cls, value: dict[str, Any]) -> dict[str, Any]:
        SelectionConfig.model_validate(value)
        return value

    @field_validator("caption")
    @classmethod
    def _caption_fits(cls, value: dict[str, Any]) -> dict[str, Any]:
        if unknown := sorted(set(value) - CAPTION_OVERRIDES):
            raise ValueError(f"{', '.join(unknown)}: not per camera (only {', '.join(sorted(CAPTION_OVERRIDES))})")
        CaptionConfig.model_validate(value)
        return value

    @property
    def camera(self) -> str:
        return self.source.camera

    def selection_for(self, pipeline: SelectionConfig) -> SelectionConfig:
        return SelectionConfig.model_validate({**pipeline.model_dump(), **self.selection})

    def caption_for(self, pipeline: CaptionConfig) -> CaptionConfig:
        return CaptionConfig.model_validate({**pipeline.model_dump(), **self.caption})


class SubmittedCamera(CameraConfig):
    """A camera as a client submits it: no inline secrets, and local paths absolute (no pipeline file anchors them)."""

    @field_validator("source")
    @classmethod
    def _no_inline_secret(cls, source: SourceConfig) -> SourceConfig:
        if isinstance(source, StreamSourceConfig) and has_inline_secret(source.url):
            raise PydanticCustomError("inline_secret", f"url {INLINE_SECRET}")
        if isinstance(source, FileSourceConfig | FolderSourceConfig) and not source.path.is_absolute():
            raise PydanticCustomError("relative_path", "path must be absolute (the worker opens it)")
        return source


class CameraChange(StrictModel):
    """What a PATCH changes; a field left out keeps its value, `source` fields are merged into the stored ones."""

    source: dict[str, Any] | None = Field(default=None, description="Source fields to change (not `camera`).")
    selection: dict[str, Any] | None = Field(default=None, description="Replaces the selection overrides.")
    caption: dict[str, Any] | None = Field(default=None, description="Replaces the caption overrides.")
    paused: Annotated[bool, Strict()] | None = Field(default=None, description="Pause or resume the camera.")

    @field_validator("source")
    @classmethod
    def _same_camera(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and "camera" in value:
            raise ValueError("camera: a camera's id cannot change (remove it and add a new one)")
        return value

    def applied_to(self, current: CameraConfig) -> CameraConfig:
        """The camera with this change made, validated as a submission; ValidationError when it does not fit."""
        data = current.model_dump(mode="json")
        if self.source is not None:
            if "kind" in self.source and self.source["kind"] != data["source"]["kind"]:
                # Another kind has other fields: start from the id only rather than mixing the two.
                data["source"] = {"camera": current.camera}
            data["source"] = {**data["source"], **self.source}
        for name in ("selection", "caption", "paused"):
            if (value := getattr(self, name)) is not None:
                data[name] = value
        # A URL left as it is may be a pipeline file's, stored masked (its secret stays in the file): only a new
        # URL is held to the no-inline-secret rule.
        url_kept = data["source"].get("url") == current.model_dump()["source"].get("url")
        return (CameraConfig if url_kept else SubmittedCamera).model_validate(data)
