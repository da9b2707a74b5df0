"""A camera as data: its source config plus per-camera overrides, stored in the database and run by a worker.

The API and `visioncap cameras` write these; `visioncap run` seeds them from its pipeline file. Secrets never
enter the database: a URL names them as `${VISIONCAP_CAMERA_SECRET_NAME}` references (the whole password or the
whole value of a credential parameter), resolved from the worker's environment only when it opens the source
(`resolve_references`; the rule in `visioncap.config.secret_references`).

A submitted camera (the API, `visioncap cameras`) is a network camera: a file, folder or webcam would let whoever
may add cameras make the worker read any file it can open, so those kinds come from the pipeline file alone.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, Strict, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from visioncap.config.base import PlainText, StrictModel
from visioncap.config.caption import CaptionConfig
from visioncap.config.secret_references import (
    CAMERA_SECRET_PREFIX,
    EXAMPLE,
    REFERENCE,
    reference_problem,
    resolve_references,
)
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import STREAM_SCHEMES, SourceConfig, StreamSourceConfig
from visioncap.redact import secret_values

__all__ = ["REFERENCE", "CameraChange", "CameraConfig", "SubmittedCamera", "has_inline_secret", "resolve_references"]

# The kinds a camera submitted through the API or the CLI may have: those that open a network URL.
SUBMITTED_KINDS = tuple(STREAM_SCHEMES)

# Caption settings that apply frame by frame (how the image is made); the prompt and token limits belong to the
# pipeline's one VLM client and stay pipeline-wide.
CAPTION_OVERRIDES = frozenset({"image_mode", "crop_padding", "max_image_tokens", "jpeg_quality"})

INLINE_SECRET = (
    "holds a password or credential inline; the database and API never keep secrets: put it in an environment "
    f"variable of the worker named {CAMERA_SECRET_PREFIX}* and reference it as ${{NAME}} ({EXAMPLE})"
)


def has_inline_secret(url: str) -> bool:
    """Whether `url` carries a secret that is not wholly a `${NAME}` reference (an empty password is none)."""
    return any(value and not REFERENCE.fullmatch(value) for value in secret_values(url))


class CameraConfig(StrictModel):
    """One camera a worker runs: where its frames come from and what it does differently from its pipeline."""

    pipeline: PlainText = Field(min_length=1, max_length=128, description="Name of the pipeline whose worker runs it.")
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
    """A camera as a client submits it: a network camera, its secrets referenced only as the rule allows and none
    inline. (The host allow-list needs the process's settings: the API and the CLI check it after this.)"""

    # The document's example is a camera the API accepts (clients, and the schema fuzzer, start from it).
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "pipeline": "main",
                    "source": {
                        "camera": "door",
                        "kind": "rtsp",
                        "url": f"rtsp://viewer:${{{CAMERA_SECRET_PREFIX}DOOR}}@192.0.2.10:554/stream1",
                    },
                }
            ]
        }
    )

    @field_validator("source")
    @classmethod
    def _network_camera_without_inline_secret(cls, source: SourceConfig) -> SourceConfig:
        if source.kind not in SUBMITTED_KINDS or not isinstance(source, StreamSourceConfig):
            raise _source_error(
                "kind",
                "source_kind",
                f"{source.kind} sources come from a pipeline file only (the worker would open any path it can "
                "read); cameras added through the API or `visioncap cameras` are network cameras: "
                f"{' or '.join(SUBMITTED_KINDS)}",
                source.kind,
            )
        if problem := reference_problem(source.url):
            raise _source_error("url", "secret_reference", problem, source.url)
        if has_inline_secret(source.url):
            raise _source_error("url", "inline_secret", INLINE_SECRET, source.url)
        return source


def _source_error(field: str, kind: str, message: str, value: str) -> ValidationError:
    # Raised inside the validator of `source`, its errors are located under it (source.url), as the field at fault.
    return ValidationError.from_exception_data(
        "SubmittedCamera", [InitErrorDetails(type=PydanticCustomError(kind, message), loc=(field,), input=value)]
    )


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
        # A source whose kind, URL and path are left as they are may be a pipeline file's: its URL stored masked (its
        # secret stays in the file), or a file, folder or webcam. Only a new place to read from is held to the rules
        # of a submitted camera.
        before = current.model_dump(mode="json")["source"]
        kept = all(data["source"].get(name) == before.get(name) for name in ("kind", "url", "path"))
        return (CameraConfig if kept else SubmittedCamera).model_validate(data)
