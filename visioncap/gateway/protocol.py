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


# Deeper than any OpenAI request (tool and response schemas included) and far below the recursion limit of the
# json module, which the gateway's own re-encoding of the body would hit.
MAX_DEPTH = 128


# Top-level strings the gateway itself writes into logs and metric labels.
_LABEL_FIELDS = ("model", "user")


def _depth_and_nul(value: Any) -> tuple[int, bool]:
    """The nesting depth of a parsed JSON value and whether a key, or a string the gateway logs, holds a NUL.

    NUL inside message text is not refused: it is valid JSON and valid text to vLLM's tokenizer, and
    `vllm bench serve`'s random prompts contain it (one of the first twelve 128-token prompts at seed 0).
    """
    deepest, nul = 0, False
    if isinstance(value, dict):
        nul = any(isinstance(value.get(name), str) and "\x00" in value[name] for name in _LABEL_FIELDS)
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        deepest = max(deepest, depth)
        if isinstance(item, dict):
            nul = nul or any("\x00" in key for key in item)
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    return deepest, nul


class AnyObjectView(_View):
    """Any JSON object (POST /tokenize, /detokenize): only the hostile-input rules apply."""


class ResponsesView(_View):
    """POST /v1/responses."""

    input: Any = Field(description="Text, or a list of input items (messages with text and image parts).")
    stream: StrictBool | None = Field(default=False, description="Server-sent events when true.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")


class EmbeddingsView(_View):
    """POST /v1/embeddings."""

    input: Any = Field(description="Text, token ids, or lists of either.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")


def parse_body(raw: bytes, view: type[_View]) -> tuple[dict[str, Any], _View]:
    """The JSON object (to forward) and its checked view; 400 for invalid or hostile JSON, 422 for a wrong shape.

    Hostile: nesting deeper than the parser's recursion allows, integers with more digits than Python converts
    (4,300 by default), invalid UTF-8, NUL characters in keys or in the fields the gateway logs and labels
    metrics with. Each is a clear 400, never a 500.
    """
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GatewayError(
            400, "invalid_request_error", f"request body is not valid JSON: {exc}", reason="bad_request"
        ) from exc
    except RecursionError as exc:
        raise GatewayError(
            400, "invalid_request_error", "request body is nested too deeply", reason="bad_request"
        ) from exc
    except ValueError as exc:  # int() of a number with too many digits (sys.get_int_max_str_digits)
        raise GatewayError(
            400, "invalid_request_error", f"request body holds a number out of range: {exc}", reason="bad_request"
        ) from exc
    depth, nul = _depth_and_nul(body)
    if depth > MAX_DEPTH:
        raise GatewayError(
            400, "invalid_request_error", f"request body is nested deeper than {MAX_DEPTH}", reason="bad_request"
        )
    if nul:
        # Valid JSON, but logs, metric scrapers and anything written in C cut a name at a NUL.
        raise GatewayError(
            400,
            "invalid_request_error",
            "a key, `model` or `user` holds a NUL character (\\u0000)",
            reason="bad_request",
        )
    if not isinstance(body, dict):
        raise GatewayError(422, "invalid_request_error", "request body must be a JSON object", reason="bad_request")
    try:
        return body, view.model_validate(body)
    except RecursionError as exc:
        raise GatewayError(
            400, "invalid_request_error", "request body is nested too deeply", reason="bad_request"
        ) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise GatewayError(422, "invalid_request_error", message, reason="bad_request", param=where) from exc
