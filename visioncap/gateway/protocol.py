"""The parts of OpenAI requests the gateway reads; everything else passes to vLLM untouched.

Only what the gateway itself relies on is checked here (so that it can route, measure and estimate);
vLLM validates the rest and its errors reach the caller unchanged.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from visioncap.gateway.errors import GatewayError


class _View(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessageView(_View):
    role: str = Field(description="Message author.")
    content: str | list[dict[str, Any]] | None = Field(default=None, description="Text or content parts.")


class ChatCompletionView(_View):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageView] = Field(min_length=1, description="The conversation.")
    stream: StrictBool | None = Field(default=False, description="Server-sent events when true.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")


class CompletionView(_View):
    """POST /v1/completions."""

    prompt: Any = Field(description="Text, token ids, or lists of either.")
    stream: StrictBool | None = Field(default=False, description="Server-sent events when true.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")


def parse_body(raw: bytes, view: type[_View]) -> tuple[dict[str, Any], _View]:
    """The JSON object (to forward) and its checked view; 400 for invalid JSON, 422 for a wrong shape."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GatewayError(
            400, "invalid_request_error", f"request body is not valid JSON: {exc}", reason="bad_request"
        ) from exc
    if not isinstance(body, dict):
        raise GatewayError(422, "invalid_request_error", "request body must be a JSON object", reason="bad_request")
    try:
        return body, view.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise GatewayError(422, "invalid_request_error", message, reason="bad_request", param=where) from exc
