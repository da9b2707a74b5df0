"""What is asked of the VLM for each selected frame."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field, model_validator

from visioncap.config.base import StrictModel

DEFAULT_PROMPT = (
    "Describe the people in this camera frame: how many, what they look like and what they are doing. "
    "One or two sentences."
)
DEFAULT_EVENT_PROMPT = (
    "These frames show one person at a camera, oldest first. Describe in one or two sentences what the person did "
    "and where they went, from the first frame to the last."
)
# Most frames an event description may be written from (and the API's `frame` bound).
MAX_DESCRIPTION_FRAMES = 16
# The Qwen processors' least image: 4 tokens (56 x 56 pixels at 28 pixels a token).
MIN_FRAME_TOKENS = 4


class ImageMode(StrEnum):
    """What picture of a selected frame is sent with the prompt."""

    FULL = "full"  # the whole frame
    BOXES = "boxes"  # the whole frame with the people boxed
    CROP = "crop"  # the people's region only, padded by crop_padding


class EventDescriptionConfig(StrictModel):
    """An event described once it ends, from several frames of its track sent as the images of one request: what
    the person did and where, beside the early single-frame caption (which alerts need at once)."""

    enabled: bool = Field(
        default=False,
        description="Describe each person event when it ends (and every max_duration_s of a long stay); one more "
        "VLM request per event.",
    )
    max_frames: int = Field(
        default=4,
        ge=2,
        le=MAX_DESCRIPTION_FRAMES,
        description="Most frames a description is written from: the first seen, the best, the last seen, and the "
        "frames where the person entered zones. The VLM server must take this many images a prompt "
        "(vLLM's --limit-mm-per-prompt; the profiles' limit_mm_per_prompt).",
    )
    max_image_tokens: int = Field(
        default=1024,
        ge=2 * MIN_FRAME_TOKENS,
        le=65536,
        description="Image tokens one description may cost, shared equally by its frames: each frame is kept at "
        "max_image_tokens / max_frames tokens (never enlarged).",
    )
    min_duration_s: float = Field(
        default=3.0,
        ge=0,
        description="Events shorter than this (first to last seen, video seconds) are not described: their caption "
        "says it all.",
    )
    max_duration_s: float = Field(
        default=300.0,
        gt=0,
        description="A stay longer than this is described in parts, one when each part of this length ends, so a "
        "person who stays all day is described during the day.",
    )
    prompt: str = Field(
        default=DEFAULT_EVENT_PROMPT, min_length=1, description="Instruction sent with an event's frames."
    )
    max_tokens: int = Field(default=160, ge=1, le=8192, description="Most tokens a description may have.")

    @property
    def frame_tokens(self) -> int:
        """Image tokens each kept frame may cost."""
        return self.max_image_tokens // self.max_frames

    @model_validator(mode="after")
    def _frames_fit_the_budget(self) -> EventDescriptionConfig:
        if self.frame_tokens < MIN_FRAME_TOKENS:
            raise ValueError(
                f"max_image_tokens {self.max_image_tokens} cannot be shared by {self.max_frames} frames: each needs "
                f"at least {MIN_FRAME_TOKENS}"
            )
        return self


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
    events: EventDescriptionConfig = Field(
        default_factory=EventDescriptionConfig,
        description="Events described once they end from several of their frames (off by default).",
    )

    @model_validator(mode="after")
    def _room_for_json(self) -> CaptionConfig:
        from visioncap.caption.structured import WORST_CASE_TOKENS

        if self.structured and self.max_tokens < WORST_CASE_TOKENS:
            raise ValueError(
                f"structured captions need max_tokens >= {WORST_CASE_TOKENS} (the longest JSON the schema admits)"
            )
        return self
