"""What is asked of the VLM for each selected frame."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel

DEFAULT_PROMPT = (
    "Describe the people in this camera frame: how many, what they look like and what they are doing. "
    "One or two sentences."
)


class ImageMode(StrEnum):
    """What picture of a selected frame is sent with the prompt."""

    FULL = "full"  # the whole frame
    BOXES = "boxes"  # the whole frame with the people boxed
    CROP = "crop"  # the people's region only, padded by crop_padding


class CaptionConfig(StrictModel):
    """The prompt, the image sent with it, and the shape of the answer."""

    prompt: str = Field(default=DEFAULT_PROMPT, min_length=1, description="Instruction sent with each frame.")
    max_tokens: int = Field(default=96, ge=1, le=8192, description="Most tokens a caption may have.")
    temperature: float = Field(default=0.0, ge=0.0, le=2.0, description="Sampling temperature; 0 is greedy.")
    max_image_tokens: int = Field(
        default=256,
        ge=4,
        le=16384,
        description="Image tokens one frame may cost; frames are downscaled to fit, using the model's pixels per "
        "token (vlm.image_token_size).",
    )
    image_mode: ImageMode = Field(
        default=ImageMode.FULL,
        description="`full` frame, `boxes`: full frame with the people boxed, `crop`: the people's region only.",
    )
    crop_padding: float = Field(
        default=0.15,
        ge=0,
        le=2,
        description="With image_mode crop: margin around the people, as a share of their size.",
    )
    jpeg_quality: int = Field(default=85, ge=30, le=100, description="JPEG quality of the frame sent.")
    structured: bool = Field(
        default=False,
        description="Ask for JSON (people count, activities, attributes, summary) enforced by the server's guided "
        "decoding and validated; the summary becomes the caption text. Needs max_tokens of about 800 to be safe.",
    )

    @model_validator(mode="after")
    def _room_for_json(self) -> CaptionConfig:
        from visioncap.caption.structured import WORST_CASE_TOKENS

        if self.structured and self.max_tokens < WORST_CASE_TOKENS:
            raise ValueError(
                f"structured captions need max_tokens >= {WORST_CASE_TOKENS} (the longest JSON the schema admits)"
            )
        return self
