"""Summaries of a window of captions, written by the VLM, and the scheduled digests."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from visioncap.config.base import StrictModel, TimeZoneName


class DigestSchedule(StrictModel):
    """One camera's digest: a summary of each hour or day once it is over."""

    camera: str = Field(min_length=1, max_length=64, description="Camera id the digest covers.")
    every: Literal["hourly", "daily"] = Field(
        description="`hourly`: each clock hour; `daily`: each calendar day, both in `time_zone`."
    )


class SummariesConfig(StrictModel):
    """How windows of captions are cut to fit the model's context, and which digests are written."""

    context_tokens: int = Field(
        default=4096,
        ge=512,
        description="The model's context (vLLM's --max-model-len): every request's prompt plus `max_tokens` fits it.",
    )
    max_tokens: int = Field(
        default=256, ge=16, le=4096, description="Most tokens the VLM writes per request (a part's or the summary)."
    )
    prompt_overhead_tokens: int = Field(
        default=256,
        ge=0,
        description="Tokens kept free beyond the estimated instructions and heading: the chat template and the "
        "estimate's error.",
    )
    chars_per_token: float = Field(
        default=2.0,
        gt=0.5,
        le=8.0,
        description="Characters a prompt token holds at least, digits and non-ASCII characters aside (counted a "
        "token each); English text: about 4 with a large vocabulary, 2 with a small one (the tiny test model). How "
        "the size of a part is estimated without the model's tokenizer; a part the server still finds too long "
        "is halved and sent again.",
    )
    max_caption_chars: int = Field(
        default=400, ge=32, description="A caption longer than this is cut in the prompt (the stored one is not)."
    )
    max_captions: int = Field(
        default=20000,
        ge=1,
        description="Most captions one summary reads; a window with more is refused (ask for a shorter one).",
    )
    max_depth: int = Field(
        default=4, ge=1, le=8, description="Most levels of summaries of summaries before the window is refused."
    )
    temperature: float = Field(default=0.2, ge=0.0, le=2.0, description="Sampling temperature of the VLM.")
    timeout_s: float = Field(default=120.0, gt=0, description="Seconds one VLM request may take.")
    time_zone: TimeZoneName = Field(
        default="UTC", description="IANA time zone of the digests' hours and days and of the times in prompts."
    )
    digests: list[DigestSchedule] = Field(default_factory=list, description="Scheduled digests, per camera.")

    @model_validator(mode="after")
    def _parts_shrink(self) -> SummariesConfig:
        # Each level must at least halve what it summarises, or the hierarchy would never reach one request.
        if self.input_tokens < 2 * self.max_tokens + 512:  # 512: about what the instructions and heading take
            raise ValueError(
                "context_tokens must leave at least twice max_tokens, plus 512 for the instructions, after "
                "prompt_overhead_tokens "
                f"(context {self.context_tokens}, max_tokens {self.max_tokens}, overhead "
                f"{self.prompt_overhead_tokens})"
            )
        return self

    @property
    def input_tokens(self) -> int:
        """Tokens of captions (or part summaries) one request may hold."""
        return self.context_tokens - self.max_tokens - self.prompt_overhead_tokens


class SummariesSettings(BaseSettings):
    """The API's summaries, from VISIONCAP_SUMMARIES_* variables; the VLM is VISIONCAP_VLM_BASE_URL reached with
    VISIONCAP_VLM_API_KEY, the pipeline's background key, so that summaries are background work at the gateway."""

    model_config = SettingsConfigDict(env_prefix="VISIONCAP_SUMMARIES_", env_file=".env", extra="ignore")

    model: str | None = Field(
        default=None, description="Model the VLM serves for summaries; unset: VISIONCAP_ASK_MODEL, else refused."
    )
    config: SummariesConfig = Field(
        default_factory=SummariesConfig, description="JSON of SummariesConfig: context, sizes, time zone, digests."
    )
    max_window_s: int = Field(
        default=7 * 86_400, ge=60, description="Longest window POST /v1/summaries accepts, in seconds."
    )
