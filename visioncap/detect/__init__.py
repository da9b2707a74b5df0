"""Person detection with Ultralytics YOLO."""

from visioncap.detect.weights import resolve_weights
from visioncap.detect.yolo import PersonDetector

__all__ = ["PersonDetector", "resolve_weights"]
