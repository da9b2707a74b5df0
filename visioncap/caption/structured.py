"""The JSON shape of a structured caption, enforced by the server's guided decoding and validated here."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class StructuredCaption(BaseModel):
    """What a structured caption holds; `summary` doubles as the caption text."""

    model_config = ConfigDict(extra="forbid")

    people_count: int = Field(ge=0, le=999, description="How many people are visible.")
    activities: list[str] = Field(max_length=5, description="What the people are doing, a few words each.")
    attributes: list[str] = Field(max_length=5, description="Notable clothing, items or features.")
    summary: str = Field(max_length=400, description="One or two sentences describing the scene.")


def _bounded_schema() -> dict[str, Any]:
    schema = StructuredCaption.model_json_schema()
    # Length bounds on every string keep guided decoding finite even for a model that never wants to stop.
    for name in ("activities", "attributes"):
        schema["properties"][name]["items"] = {"type": "string", "maxLength": 60}
    schema["properties"]["summary"]["maxLength"] = 400
    return schema


def response_format() -> dict[str, Any]:
    """The `response_format` argument for an OpenAI-compatible chat completion."""
    return {"type": "json_schema", "json_schema": {"name": "caption", "schema": _bounded_schema(), "strict": True}}
