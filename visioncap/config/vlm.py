"""The OpenAI-compatible endpoint that writes captions."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from visioncap.config.base import StrictModel


class VlmConfig(StrictModel):
    """A chat-completions endpoint (vLLM, or the visioncap gateway in front of it)."""

    base_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1; None uses VISIONCAP_VLM_BASE_URL.",
    )
    model: str = Field(min_length=1, description="Model name as served (vLLM's --served-model-name).")
    timeout_s: float = Field(default=60.0, gt=0, description="Seconds to wait for one caption before failing it.")
    image_token_size: int = Field(
        default=28,
        ge=1,
        description="Side in pixels of the square one image token covers: patch size x merge size (Qwen2/2.5-VL: "
        "14 x 2 = 28; Qwen3-VL: 16 x 2 = 32).",
    )
    concurrency: int = Field(default=2, ge=1, le=64, description="Caption requests in flight at once.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra request fields passed to the server, e.g. vLLM's `priority` or `ignore_eos`.",
    )
