"""How Qwen2-VL, Qwen2.5-VL and Qwen3-VL processors size an image (their `smart_resize`); standard library only,
so that the cost model and the gateway count an image's tokens the same way vLLM's processor does."""

from __future__ import annotations

import math


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) the processor resizes to: sides rounded to multiples of `factor` (pixels per language
    token side: patch size x merge size), the area brought within [min_pixels, max_pixels], the aspect kept."""
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar
