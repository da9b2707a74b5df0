"""Frame to JPEG within an image-token budget.

Qwen2/2.5/3-VL style processors round each side to a multiple of the token size (patch x merge) and spend one
token per square; a frame is downscaled until that count fits the budget, so the cost of every caption is known
before it is sent.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence

import cv2
import numpy as np

from visioncap.config.caption import MIN_FRAME_TOKENS, ImageMode
from visioncap.frames import EncodedImage, PersonBox

BOX_COLOUR = (0, 200, 255)  # BGR amber: visible on most scenes


def image_tokens(width: int, height: int, token_size: int) -> int:
    """Tokens a processor that rounds sides to multiples of token_size spends on a width x height image."""
    grid_w = max(1, round(width / token_size))
    grid_h = max(1, round(height / token_size))
    return grid_w * grid_h


def fit_tokens(width: int, height: int, max_tokens: int, token_size: int) -> tuple[int, int]:
    """The largest size with the same aspect ratio whose token count fits max_tokens (never upscaled)."""
    if image_tokens(width, height, token_size) <= max_tokens:
        return width, height
    scale = math.sqrt(max_tokens * token_size * token_size / (width * height))
    new_w, new_h = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))
    # Rounding to the grid can still land one row or column over: shrink in small steps until it fits.
    while image_tokens(new_w, new_h, token_size) > max_tokens and (new_w > 1 or new_h > 1):
        new_w, new_h = max(1, math.floor(new_w * 0.97)), max(1, math.floor(new_h * 0.97))
    return new_w, new_h


def people_region(people: Sequence[PersonBox], width: int, height: int, padding: float) -> tuple[int, int, int, int]:
    """The padded box around all people, clipped to the frame."""
    x1 = min(p.x1 for p in people)
    y1 = min(p.y1 for p in people)
    x2 = max(p.x2 for p in people)
    y2 = max(p.y2 for p in people)
    pad_x, pad_y = (x2 - x1) * padding, (y2 - y1) * padding
    return (
        max(0, math.floor(x1 - pad_x)),
        max(0, math.floor(y1 - pad_y)),
        min(width, math.ceil(x2 + pad_x)),
        min(height, math.ceil(y2 + pad_y)),
    )


def compose(image: np.ndarray, people: Sequence[PersonBox], mode: ImageMode, padding: float = 0.15) -> np.ndarray:
    """The picture to send: the full frame, the frame with people boxed, or a padded crop of the people."""
    if mode is ImageMode.FULL or not people:
        return image
    if mode is ImageMode.BOXES:
        boxed = image.copy()
        thickness = max(2, round(min(image.shape[:2]) / 200))
        for person in people:
            top_left = (round(person.x1), round(person.y1))
            bottom_right = (round(person.x2), round(person.y2))
            cv2.rectangle(boxed, top_left, bottom_right, BOX_COLOUR, thickness)
        return boxed
    if mode is ImageMode.CROP:
        x1, y1, x2, y2 = people_region(people, image.shape[1], image.shape[0], padding)
        return image[y1:y2, x1:x2]
    raise ValueError(f"unknown image mode {mode!r}")


def encode_jpeg(image: np.ndarray, max_tokens: int, token_size: int = 28, quality: int = 85) -> EncodedImage:
    """Downscale a BGR picture to the token budget and encode it as JPEG."""
    height, width = image.shape[:2]
    new_w, new_h = fit_tokens(width, height, max_tokens, token_size)
    if (new_w, new_h) != (width, height):
        # INTER_AREA avoids the aliasing that other filters give when shrinking.
        image = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError("JPEG encoding failed")
    return EncodedImage(
        jpeg=buffer.tobytes(), width=new_w, height=new_h, image_tokens=image_tokens(new_w, new_h, token_size)
    )


# Qwen-VL processors enlarge a picture to at least 56 x 56 pixels (min_pixels): four tokens, whatever is sent.
MIN_IMAGE_TOKENS = MIN_FRAME_TOKENS


def encode_frames(
    images: Sequence[np.ndarray], max_tokens: int, token_size: int = 28, quality: int = 85
) -> list[EncodedImage]:
    """Several pictures of one event within one image-token budget: each downscaled (aspect kept, never
    upscaled) to an equal share, so that the request's image tokens are known before it is sent."""
    if not images:
        return []
    share = max_tokens // len(images)
    if share < MIN_IMAGE_TOKENS:
        raise ValueError(
            f"{max_tokens} image tokens cannot be shared by {len(images)} frames: each needs {MIN_IMAGE_TOKENS}"
        )
    return [encode_jpeg(image, share, token_size, quality) for image in images]


def jpeg_data_uri(jpeg: bytes) -> str:
    """A JPEG as a data: URI, the form an OpenAI-compatible chat message carries an image in."""
    return "data:image/jpeg;base64," + base64.b64encode(jpeg).decode("ascii")
