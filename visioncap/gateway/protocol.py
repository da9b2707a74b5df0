"""The parts of OpenAI requests the gateway reads; everything else passes to vLLM untouched.

Only what the gateway itself relies on is checked here (so that it can route, measure and estimate);
vLLM validates the rest and its errors reach the caller unchanged.
"""

from __future__ import annotations

import json
from copy import deepcopy
from typing import Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from visioncap.gateway.errors import invalid_request


class _View(BaseModel):
    model_config = ConfigDict(extra="allow")


class ChatMessageView(_View):
    role: str = Field(description="Message author.")
    content: str | list[dict[str, Any]] | None = Field(default=None, description="Text or content parts.")


# Answers per request. Strict: vLLM's models coerce "5" and true to integers, so a looser type here would let a
# background key past the one-answer rule (`visioncap.gateway.body_check`) with a string.
_N = Field(default=None, description="Answers to generate (vLLM reads it as an integer).")
_BEST_OF = Field(default=None, description="Candidates to generate, the best returned.")


class ChatCompletionView(_View):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageView] = Field(min_length=1, description="The conversation.")
    stream: StrictBool | None = Field(default=False, description="Server-sent events when true.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")
    n: StrictInt | None = _N
    best_of: StrictInt | None = _BEST_OF


class CompletionView(_View):
    """POST /v1/completions."""

    prompt: Any = Field(description="Text, token ids, or lists of either.")
    stream: StrictBool | None = Field(default=False, description="Server-sent events when true.")
    user: str | None = Field(default=None, description="End-user id; names the camera of background requests.")
    n: StrictInt | None = _N
    best_of: StrictInt | None = _BEST_OF


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
    if not isinstance(value, dict | list):
        return 1, nul
    # Only containers are visited (scalars are most of a large body's values), and a dict's keys are searched as
    # one string: a body of millions of values is walked in a fraction of the time of its parsing.
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        deepest = max(deepest, depth + 1 if item else depth)  # a scalar child is a level too
        if isinstance(item, dict):
            nul = nul or "\x00" in "".join(item)
            children = item.values()
        else:
            children = item
        kinds = set(map(type, children))
        if dict in kinds or list in kinds:
            pending.extend([(child, depth + 1) for child in children if isinstance(child, dict | list)])
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
        raise invalid_request(f"request body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise invalid_request("request body is nested too deeply") from exc
    except ValueError as exc:  # int() of a number with too many digits (sys.get_int_max_str_digits)
        raise invalid_request(f"request body holds a number out of range: {exc}") from exc
    depth, nul = _depth_and_nul(body)
    if depth > MAX_DEPTH:
        raise invalid_request(f"request body is nested deeper than {MAX_DEPTH}")
    if nul:
        # Valid JSON, but logs, metric scrapers and anything written in C cut a name at a NUL.
        raise invalid_request("a key, `model` or `user` holds a NUL character (\\u0000)")
    if not isinstance(body, dict):
        raise invalid_request("request body must be a JSON object", 422)
    try:
        return body, view.model_validate(body)
    except RecursionError as exc:
        raise invalid_request("request body is nested too deeply") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or None
        message = f"{where}: {first['msg']}" if where else first["msg"]
        raise invalid_request(message, 422, param=where) from exc


# -- the OpenAPI document ----------------------------------------------------------------------------------------
# The request bodies as the gateway documents them: what it reads (the views above) and the OpenAI fields a client
# commonly sends, which pass to vLLM unchanged. Documentation only: requests are checked by the views, and vLLM
# validates the rest (its 400s reach the caller). Every object allows further fields, none with a NUL in its name.

NO_NUL = "^[^\\u0000]*$"  # a JSON Schema pattern: no NUL character (the gateway refuses one in keys, model, user)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="allow", json_schema_extra={"propertyNames": {"pattern": NO_NUL}})


_MODEL = Field(default=None, description="A model vLLM serves; another is answered 404.", pattern=NO_NUL)
_STREAM = Field(default=False, description="Server-sent events (text/event-stream) when true.")
_USER = Field(
    default=None,
    description="End-user id; for a background key, the camera whose round-robin turn the request takes.",
    pattern=NO_NUL,
)
_MAX_TOKENS = Field(default=None, ge=1, description="Most tokens to generate.")
_TEMPERATURE = Field(default=None, ge=0, le=2, description="Sampling temperature.")
_PRIORITY = Field(default=None, description="Any value: replaced by the priority of the key's traffic class.")


class TextPart(_Doc):
    """Text in a message."""

    type: Literal["text"] = Field(description="text")
    text: str = Field(description="The text.")


class ImageUrl(_Doc):
    url: str = Field(
        description="A data: URI (data:image/jpeg;base64,...), or an http(s) URL of a host in the gateway's "
        "`images.allowed_hosts` (vLLM fetches it); any other URL is refused with 400 `media_url_not_allowed`."
    )


class ImagePart(_Doc):
    """An image in a message; its estimated tokens count against the background image-token cap."""

    type: Literal["image_url"] = Field(description="image_url")
    image_url: ImageUrl = Field(description="Where the image is.")


class ChatMessage(_Doc):
    """One message of the conversation."""

    role: Literal["system", "user", "assistant"] = Field(description="Message author.")
    content: str | list[TextPart | ImagePart] = Field(description="Text, or text and image parts.")


class ChatCompletionRequest(_Doc):
    """POST /v1/chat/completions: OpenAI's chat completion request."""

    model: str | None = _MODEL
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation.")
    stream: bool | None = _STREAM
    user: str | None = _USER
    max_tokens: int | None = _MAX_TOKENS
    max_completion_tokens: int | None = _MAX_TOKENS
    temperature: float | None = _TEMPERATURE
    priority: Any = _PRIORITY


TokenIds = list[int]


class CompletionRequest(_Doc):
    """POST /v1/completions: OpenAI's (legacy) completion request."""

    model: str | None = _MODEL
    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        description="Text, token ids, or lists of either; a list of several prompts is that many requests (refused "
        "for background keys, which ask for one answer a request)."
    )
    stream: bool | None = _STREAM
    user: str | None = _USER
    max_tokens: int | None = _MAX_TOKENS
    temperature: float | None = _TEMPERATURE
    priority: Any = _PRIORITY


class InputText(_Doc):
    type: Literal["input_text"] = Field(description="input_text")
    text: str = Field(description="The text.")


class InputImage(_Doc):
    type: Literal["input_image"] = Field(description="input_image")
    image_url: str = Field(description="As `image_url.url` of a chat message: a data: URI or an allow-listed URL.")


class InputMessage(_Doc):
    """One input item of the Responses API."""

    role: Literal["system", "user", "assistant"] = Field(description="Message author.")
    content: str | list[InputText | InputImage] = Field(description="Text, or text and image parts.")


class ResponsesRequest(_Doc):
    """POST /v1/responses: OpenAI's Responses API request."""

    model: str | None = _MODEL
    input: str | list[InputMessage] = Field(description="Text, or a list of input messages.")
    stream: bool | None = _STREAM
    user: str | None = _USER
    max_output_tokens: int | None = _MAX_TOKENS
    temperature: float | None = _TEMPERATURE
    priority: Any = _PRIORITY


class EmbeddingsRequest(_Doc):
    """POST /v1/embeddings: OpenAI's embeddings request (answered by vLLM when it serves an embedding model)."""

    model: str | None = _MODEL
    input: str | list[str] | TokenIds | list[TokenIds] = Field(description="Text, token ids, or lists of either.")
    user: str | None = _USER


class TokenizeRequest(_Doc):
    """POST /tokenize: vLLM's tokenizer, for a prompt or a conversation."""

    model: str | None = _MODEL
    prompt: str | None = Field(default=None, description="Text to tokenize (or send `messages`).")
    messages: list[ChatMessage] | None = Field(default=None, description="A conversation to tokenize.")


class DetokenizeRequest(_Doc):
    """POST /detokenize: vLLM's detokenizer."""

    model: str | None = _MODEL
    tokens: TokenIds = Field(description="Token ids.")


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong.")
    type: str = Field(
        description="The gateway's own: authentication_error, invalid_request_error, request_too_large, "
        "image_too_large, media_url_not_allowed, camera_not_allowed, rate_limit_exceeded, queue_full, "
        "body_budget_full, deadline_exceeded, upstream_unavailable, upstream_timeout, internal_error; vLLM's pass "
        "unchanged (e.g. BadRequestError, NotFoundError)."
    )
    param: str | None = Field(description="The request field at fault, if known.")
    code: int = Field(description="The HTTP status.")


class ErrorResponse(BaseModel):
    """Every error, the gateway's own and vLLM's: OpenAI's error shape."""

    error: ErrorDetail = Field(description="The error.")


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON Schema with its definitions written in place: a request body in the OpenAPI document, whose
    `$ref`s would otherwise point at `#/$defs` of the document, which has none."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(value: Any) -> Any:
        if isinstance(value, dict):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(deepcopy(definitions[ref.removeprefix("#/$defs/")]))
            return {key: inline(child) for key, child in value.items()}
        if isinstance(value, list):
            return [inline(child) for child in value]
        return value

    return cast(dict[str, Any], inline(schema))


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` of a route that reads its body itself (to refuse hostile input before parsing it)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema(model)}}}}
