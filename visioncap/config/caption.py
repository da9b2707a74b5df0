"""What is asked of the VLM for each selected frame."""

from __future__ import annotations

from pydantic import Field

from visioncap.config.base import StrictModel

DEFAULT_PROMPT = (
    "Describe the people in this camera frame: how many, what they look like and what they are doing. "
    "One or two sentences."
)


class CaptionConfig(StrictModel):
    """The prompt and the image sent with it."""

    prompt: str = Field(default=DEFAULT_PROMPT, min_length=1, description="Instruction sent with each frame.")
    max_tokens: int = Field(default=96, ge=1, le=8192, description="Most tokens a caption may have.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature; 0 is greedy.")
    max_image_pixels: int = Field(
        default=256 * 28 * 28,
        ge=28 * 28,
        description=(
            "Frames are downscaled to at most this many pixels before sending; it bounds image tokens "
            "(Qwen2-VL: one token per 28x28 pixels)."
        ),
    )
    jpeg_quality: int = Field(default=85, ge=30, le=100, description="JPEG quality of the frame sent.")
