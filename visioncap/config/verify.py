"""Watch rules: the `verify` section of an alert rule (a question the VLM answers about each candidate caption) and
the alerts file's `vlm` section (where that VLM is)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, Strict
from pydantic.json_schema import SkipJsonSchema

from visioncap.config.base import PlainText, StrictModel

MAX_REASON_CHARS = 200  # the answer's `reason`, bounded in the guided-decoding schema so every answer ends


class ForcedAnswer(StrictModel):
    """The one answer guided decoding may produce (for tests: a random-weight model's answers are noise)."""

    match: Annotated[bool, Strict()] = Field(description="Whether the forced answer is a match.")
    reason: str = Field(default="forced", max_length=MAX_REASON_CHARS, description="The forced answer's reason.")


class VerifySpec(StrictModel):
    """Ask the VLM a question about each caption that meets the rule's other conditions (the cheap pre-filter);
    only a `match` answer fires the alert."""

    question: PlainText = Field(
        min_length=1, max_length=500, description="The condition in plain language, e.g. 'someone climbs the fence'."
    )
    max_frames: int = Field(
        default=1,
        ge=1,
        le=6,
        description="Most stored frames sent: the caption's own JPEG, then the newest others of its event.",
    )
    deadline_s: Annotated[float, Strict()] = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Longest wait for the answer, from when the engine asks; past it the decision is stored with "
        "an error and nothing fires (not retried: see the README's Alerts section).",
    )
    min_similarity: Annotated[float, Strict()] | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="An extra pre-filter: least cosine similarity (all-MiniLM-L6-v2) of the caption text to "
        "`question`; unset: every caption the other conditions pass is asked about.",
    )
    # Left out of the JSON schema (the API's document) and of dumps (API answers, stored rules): the API refuses it,
    # only the alerts file may set it.
    force_answer: SkipJsonSchema[ForcedAnswer | None] = Field(
        default=None,
        exclude=True,
        description="For tests only: guided decoding is given a choice of this one answer, so the model must "
        "write it (the request still goes to the VLM, frames and all).",
    )


class VlmEndpoint(StrictModel):
    """The OpenAI-compatible server (vLLM, or the gateway in front of it) that answers watch rules."""

    base_url: str | None = Field(
        default=None,
        pattern=r"^https?://",
        description="Base URL ending in /v1; unset: VISIONCAP_VLM_BASE_URL.",
    )
    model: str | None = Field(
        default=None, max_length=256, description="Model name sent; unset: the first the server lists."
    )
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the API key; unset: VISIONCAP_VLM_API_KEY."
    )
    max_tokens: int = Field(
        default=160, ge=16, le=2048, description="Most tokens of an answer (the schema bounds `reason` too)."
    )
