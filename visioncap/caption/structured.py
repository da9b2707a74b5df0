"""The JSON shape of a structured caption, enforced by the server's guided decoding and validated here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_ITEMS = 4
MAX_ITEM_CHARS = 40
MAX_SUMMARY = 300
# The longest answer the schema admits is about this many characters, so at most this many tokens: a model
# that fills every string to its bound still finishes within caption.max_tokens when that is at least this.
WORST_CASE_TOKENS = 2 * MAX_ITEMS * (MAX_ITEM_CHARS + 3) + MAX_SUMMARY + 80


class StructuredCaption(BaseModel):
    """What a structured caption holds; `summary` doubles as the caption text."""

    model_config = ConfigDict(extra="forbid")

    people_count: int = Field(ge=0, le=999, description="How many people are visible.")
    activities: list[str] = Field(max_length=MAX_ITEMS, description="What the people are doing, a few words each.")
    attributes: list[str] = Field(max_length=MAX_ITEMS, description="Notable clothing, items or features.")
    summary: str = Field(max_length=MAX_SUMMARY, description="One or two sentences describing the scene.")


def _bounded_schema() -> dict[str, Any]:
    schema = StructuredCaption.model_json_schema()
    # Length bounds on every string keep guided decoding finite even for a model that never wants to stop.
    for name in ("activities", "attributes"):
        schema["properties"][name]["items"] = {"type": "string", "maxLength": MAX_ITEM_CHARS}
    schema["properties"]["summary"]["maxLength"] = MAX_SUMMARY
    return schema


def response_format() -> dict[str, Any]:
    """The `response_format` argument for an OpenAI-compatible chat completion."""
    return {"type": "json_schema", "json_schema": {"name": "caption", "schema": _bounded_schema(), "strict": True}}
