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
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Retries of a caption after a connection error, timeout or 5xx answer, with backoff.",
    )
    concurrency: int = Field(default=2, ge=1, le=64, description="Caption requests in flight at once.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra request fields passed to the server, e.g. vLLM's `priority` or `ignore_eos`.",
    )
