"""Exported detector formats load by pointing detector.weights at them (ONNX here, exported offline)."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import pytest
from helpers import PERSON_DETECTOR, require_module

from visioncap.config.detector import DetectorConfig
from visioncap.demo_video import SEGMENTS
from visioncap.detect import PersonDetector, resolve_weights
from visioncap.frames import Frame

pytestmark = pytest.mark.detector


@pytest.fixture(scope="module")
def onnx_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Ultralytics' ONNX export needs the onnx package (a dev dependency of this project).
    require_module("onnx", "pip install -e '.[dev]'")
    from ultralytics import YOLO

    # Export writes beside the weights: work on a copy, never inside the installed package.
    copy = tmp_path_factory.mktemp("weights") / "person.pt"
    shutil.copy(resolve_weights(PERSON_DETECTOR), copy)
    exported = YOLO(str(copy)).export(format="onnx", imgsz=320, dynamic=False, simplify=False)
    return Path(exported)


def test_onnx_export_finds_the_same_people(onnx_weights: Path, demo_video: tuple[Path, object]) -> None:
    video, _ = demo_video
    capture = cv2.VideoCapture(str(video))
    frames = []
    index = 0
    while True:
        ok, image = capture.read()
        if not ok:
            break
        if index % 5 == 0:
            frames.append(Frame(camera="c", index=index, offset_s=index / 10, image=image))
        index += 1
    config = {"person_classes": [0, 1], "image_size": 320, "confidence": 0.35}
    torch_model = PersonDetector(DetectorConfig(weights=PERSON_DETECTOR, **config))
    onnx_model = PersonDetector(DetectorConfig(weights=str(onnx_weights), **config))
    by_torch = [len(d.people) for d in torch_model.detect(frames)]
    by_onnx = [len(d.people) for d in onnx_model.detect(frames)]
    has_people = [any(s.start <= f.index < s.end and s.has_people for s in SEGMENTS) for f in frames]
    assert [n > 0 for n in by_onnx] == has_people
    # Same frames with people; counts may differ by one where a score sits at the confidence threshold.
    assert all(abs(a - b) <= 1 for a, b in zip(by_torch, by_onnx, strict=True)), (by_torch, by_onnx)
