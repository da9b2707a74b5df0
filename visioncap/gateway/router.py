"""Routes: thin wrappers that hand each request to the app's Gateway.

Each route reads its body itself (hostile input is refused before it is parsed), so the request bodies and the
answers are described here for the OpenAPI document only (`visioncap.gateway.protocol`).
"""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from visioncap.gateway.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingsRequest,
    ErrorResponse,
    ResponsesRequest,
    TokenizeRequest,
    request_body,
)
from visioncap.gateway.serving import Endpoint, Gateway

router = APIRouter()

# Documentation only: every route but /healthz, /readyz and /metrics checks the key itself (`Gateway._authenticate`).
SECURED: list[dict[str, list[str]]] = [{"bearer": []}]
_ANY_JSON = {"application/json": {"schema": {"type": "object"}}}
# One server-sent event, as vLLM sends them: chat and completion chunks as `data` (JSON, the last `[DONE]`), the
# Responses API's with an `event` name too.
SSE_EVENT = {
    "type": "object",
    "properties": {
        "event": {"type": "string", "description": "The event's name (Responses API), e.g. response.created."},
        "data": {"type": "string", "description": "A JSON chunk of the answer, or [DONE]."},
    },
    "required": ["data"],
}


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


# What the keyed routes may answer, by the part of the gateway that answers it.
KEYED: dict[int | str, dict[str, Any]] = {401: _error("Missing or unknown key (`Authorization: Bearer KEY`).")}
UPSTREAM: dict[int | str, dict[str, Any]] = {
    502: _error("vLLM is unreachable (`upstream_unavailable`)."),
    504: _error("vLLM did not answer in time (`upstream_timeout`)."),
}
_HOSTILE = (
    "vLLM refused the request (its validation: `BadRequestError`), or the gateway did: the body is not JSON, is "
    "nested deeper than 128, holds a number beyond 4,300 digits, invalid UTF-8, or a NUL character in a key, "
    "`model` or `user` (`invalid_request_error`)."
)
BODY: dict[int | str, dict[str, Any]] = {
    400: _error(_HOSTILE),
    404: {
        "description": "vLLM does not serve this model (`NotFoundError`), or this endpoint for it.",
        "content": _ANY_JSON,
    },
    413: _error("The body is larger than the key's class allows (`request_too_large`)."),
    422: _error(
        "The body is not an object of the documented shape (`invalid_request_error`; `param` names the field)."
    ),
    429: _error("The key is over its request rate limit (`rate_limit_exceeded`); Retry-After says when to retry."),
}
# Routes that generate: a key's class queues and paces them.
GENERATION: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "vLLM's answer: JSON, or server-sent events with `stream: true`.",
        "content": {**_ANY_JSON, "text/event-stream": {"schema": SSE_EVENT}},
    },
    **KEYED,
    **BODY,
    **UPSTREAM,
    400: _error(
        f"{_HOSTILE} Also the gateway's: an image beyond the model's largest (`image_too_large`); a media URL that "
        "is neither a data: URI nor of an allow-listed host (`media_url_not_allowed`), on every route; text that "
        "cannot be encoded as UTF-8 (a lone surrogate); a background key asking for more than one answer (`n` or "
        "`best_of` above 1, or a list of several prompts); a bad X-Visioncap-Deadline-Ms."
    ),
    403: _error("A background key named a camera it may not (`camera_not_allowed`)."),
    408: _error("A background request waited in the queue past its deadline (`deadline_exceeded`)."),
    429: _error(
        "Over the key's rate limit (`rate_limit_exceeded`), the background queue is full (`queue_full`), or so is "
        "the memory budget of waiting background bodies (`body_budget_full`); Retry-After says when to retry."
    ),
}


def _generation(summary: str, body: type[Any]) -> dict[str, Any]:
    return {"summary": summary, "responses": GENERATION, "openapi_extra": {**request_body(body), "security": SECURED}}


def _utility(summary: str, body: type[Any]) -> dict[str, Any]:
    return {
        "summary": summary,
        "responses": {200: {"description": "vLLM's answer.", "content": _ANY_JSON}, **KEYED, **BODY, **UPSTREAM},
        "openapi_extra": {**request_body(body), "security": SECURED},
    }


def _gateway(request: Request) -> Gateway:
    return cast(Gateway, request.app.state.gateway)


# The generation routes, by path: `visioncap.gateway.app.GenerationFastPath` serves these without FastAPI's
# routing and middleware (a third of the gateway's own time to first token); the routes below describe them in the
# OpenAPI document and serve them wherever the router is used without the fast path.
GENERATION_PATHS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}


@router.post(
    "/v1/chat/completions", **_generation("Chat completion (OpenAI), queued by the key's class", ChatCompletionRequest)
)
async def chat_completions(request: Request) -> Response:
    return await _gateway(request).generate(request, "chat")


@router.post("/v1/completions", **_generation("Completion (OpenAI), queued by the key's class", CompletionRequest))
async def completions(request: Request) -> Response:
    return await _gateway(request).generate(request, "completions")


@router.post("/v1/responses", **_generation("Responses API (OpenAI), queued by the key's class", ResponsesRequest))
async def responses(request: Request) -> Response:
    return await _gateway(request).generate(request, "responses")


@router.post("/v1/embeddings", **_generation("Embeddings (OpenAI), queued by the key's class", EmbeddingsRequest))
async def embeddings(request: Request) -> Response:
    return await _gateway(request).generate(request, "embeddings")


@router.post("/tokenize", **_utility("vLLM's tokenizer, for any valid key (neither queued nor paced)", TokenizeRequest))
async def tokenize(request: Request) -> Response:
    return await _gateway(request).utility(request, "/tokenize")


@router.post(
    "/detokenize", **_utility("vLLM's detokenizer, for any valid key (neither queued nor paced)", DetokenizeRequest)
)
async def detokenize(request: Request) -> Response:
    return await _gateway(request).utility(request, "/detokenize")


@router.get(
    "/v1/models",
    summary="vLLM's models, for any valid key",
    responses={200: {"description": "vLLM's model list.", "content": _ANY_JSON}, **KEYED, **UPSTREAM},
    openapi_extra={"security": SECURED},
)
async def models(request: Request) -> Response:
    return await _gateway(request).models(request)


@router.get(
    "/metrics",
    summary="Prometheus metrics of the gateway (no key)",
    response_class=Response,
    responses={200: {"description": "Prometheus text format.", "content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(request: Request) -> Response:
    return Response(_gateway(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get(
    "/healthz",
    summary="Liveness and each upstream's state (no key; vLLM's addresses and errors only to a valid key)",
    responses={200: {"description": "The gateway answers.", "content": _ANY_JSON}},
)
async def healthz(request: Request) -> Response:
    return _gateway(request).health(request)


@router.get(
    "/readyz",
    summary="Readiness: at least one upstream passes its health checks (no key)",
    responses={
        200: {"description": "At least one upstream is in; which are in and out.", "content": _ANY_JSON},
        503: {"description": "No upstream is in.", "content": _ANY_JSON},
    },
)
async def readyz(request: Request) -> Response:
    return _gateway(request).readiness(request)
