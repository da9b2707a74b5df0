"""How good a frame is for a caption: confident, large and sharp people."""

from __future__ import annotations

import math
from collections.abc import Sequence

import cv2
import numpy as np

from visioncap.frames import PersonBox

# Laplacian variance at which sharpness counts half; typical in-focus camera crops score several hundred.
SHARPNESS_HALF = 100.0
SHARPNESS_WIDTH = 256


def sharpness(image: np.ndarray, people: Sequence[PersonBox]) -> float:
    """Variance of the Laplacian over the people's region (at a fixed width, so sizes compare)."""
    x1 = max(0, math.floor(min(p.x1 for p in people)))
    y1 = max(0, math.floor(min(p.y1 for p in people)))
    x2 = min(image.shape[1], math.ceil(max(p.x2 for p in people)))
    y2 = min(image.shape[0], math.ceil(max(p.y2 for p in people)))
    region = image[y1:y2, x1:x2]
    if region.size == 0:
        return 0.0
    gray = cv2.cvtColor(region, cv2.COLOR_BGR2GRAY) if region.ndim == 3 else region
    if gray.shape[1] > SHARPNESS_WIDTH:
        scale = SHARPNESS_WIDTH / gray.shape[1]
        gray = cv2.resize(gray, (SHARPNESS_WIDTH, max(1, round(gray.shape[0] * scale))), interpolation=cv2.INTER_AREA)
    return float(cv2.Laplacian(gray, cv2.CV_64F).var())


def frame_score(image: np.ndarray, people: Sequence[PersonBox]) -> float:
    """confidence x box area x sharpness, each in [0, 1]; 0 for a frame without the people."""
    if not people:
        return 0.0
    frame_area = float(image.shape[0] * image.shape[1])
    confidence = sum(p.confidence for p in people) / len(people)
    area = math.sqrt(min(1.0, sum(p.area for p in people) / frame_area))
    sharp = sharpness(image, people)
    return confidence * area * (sharp / (sharp + SHARPNESS_HALF))
