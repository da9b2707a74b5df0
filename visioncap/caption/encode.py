"""Frame to JPEG within a pixel budget (the budget bounds the VLM's image tokens)."""

from __future__ import annotations

import math

import cv2
import numpy as np

from visioncap.frames import EncodedImage


def fit_within(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The largest size with the same aspect ratio and at most max_pixels pixels (never upscaled)."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    # Flooring both sides keeps the product under the budget even after rounding.
    return new_w, new_h


def encode_jpeg(image: np.ndarray, max_pixels: int, quality: int = 85) -> EncodedImage:
    """Downscale a BGR frame to the pixel budget and encode it as JPEG."""
    height, width = image.shape[:2]
    new_w, new_h = fit_within(width, height, max_pixels)
    if (new_w, new_h) != (width, height):
        # INTER_AREA avoids the aliasing that other filters give when shrinking.
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return EncodedImage(jpeg=buffer.tobytes(), width=new_w, height=new_h)
