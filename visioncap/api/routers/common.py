"""What every router shares: the service of the app, and the security schemes shown in the OpenAPI document."""

from __future__ import annotations

import difflib
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, cast, get_origin

import anyio
from fastapi import Depends, HTTPException, Request, Security
from fastapi._compat import ModelField
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from visioncap.api.auth import bearer_scheme, header_scheme
from visioncap.api.errors import bad_param
from visioncap.api.protocol import ErrorResponse
from visioncap.api.serving import ApiService

_SEQUENCES = (list, tuple, set, frozenset)


class ClosingStreamingResponse(StreamingResponse):
    """A streamed answer whose generator is closed when the response ends, however it ends; then `on_close`.

    Starlette stops reading a generator when the client goes, but does not close it: one cancelled while
    suspended at a `yield` (the send of a chunk in flight) ran its `finally` only when garbage-collected. Ask's
    request to the VLM then stayed open, and vLLM generated the whole answer for nobody (seen as the gateway's
    `completed` for an answer whose client left after its first chunk). `on_close` covers what the generator
    would close but never got to: one closed before its first chunk runs no `finally`."""

    def __init__(
        self, content: AsyncGenerator[str, None], on_close: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self._generator = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._generator.aclose()
                if self._on_close is not None:
                    await self._on_close()


def _query_fields(dependant: Dependant) -> list[ModelField]:
    return dependant.query_params + [field for sub in dependant.dependencies for field in _query_fields(sub)]


def _takes_one(field: ModelField) -> bool:
    return get_origin(field.field_info.annotation) not in _SEQUENCES


def _moment(field: ModelField, raw: str) -> datetime | None:
    """`raw` read as the route reads it (naive: UTC); None when the route will refuse it itself."""
    value, errors = field.validate(raw)
    if errors or not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def checked_query(request: Request) -> None:
    """What every route's query must be besides each parameter's schema, checked in one place for all of them.

    No parameter the route does not declare: FastAPI would ignore it, so `?cameras=lobby` (for `camera`) listed
    every camera, as the config files refuse unknown keys. A parameter that takes one value given once: FastAPI
    would keep the last, so `q=a&q=b` searched for b alone. And a window's `until` after its `since`, on every
    route that has one (one answered 422, another 200 and nothing)."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    fields = {field.alias: field for field in _query_fields(route.dependant)}
    unknown = [name for name in dict.fromkeys(request.query_params) if name not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        known = f"this route takes {', '.join(fields)}" if fields else "this route takes none"
        raise bad_param(unknown[0], f"unknown query parameter ({known}){hint}")
    for name, field in fields.items():
        if _takes_one(field) and len(request.query_params.getlist(name)) > 1:
            raise bad_param(name, "given more than once; it takes one value")
    if "since" in request.query_params and "until" in request.query_params:
        since = _moment(fields["since"], request.query_params["since"])
        until = _moment(fields["until"], request.query_params["until"])
        try:
            backwards = since is not None and until is not None and since >= until
        except OverflowError:  # at the ends of the calendar; the route says which is out of range
            backwards = False
        if backwards:
            raise bad_param("until", "must be after since")


class SharedPathRoute(APIRoute):
    """A 405 whose `Allow` names every method of the path: Starlette names only those of the first route that
    matched it, and a resource's collection (GET, POST) or item (PATCH, DELETE) is served by several routes."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            allowed = {
                method
                for route in scope["app"].router.routes
                if isinstance(route, APIRoute) and route.path_format == self.path_format
                for method in route.methods or ()
            }
            raise HTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(allowed))})
        await super().handle(scope, receive, send)


# Declares the schemes for /docs (the AuthMiddleware enforces them on every request), and checks every route's
# query (checked_query).
SECURED = [Security(bearer_scheme), Security(header_scheme), Depends(checked_query)]

# What FastAPI's `responses=` takes: status code -> the response's model and description.
Responses = dict[int | str, dict[str, Any]]

ERRORS: Responses = {
    401: {"model": ErrorResponse, "description": "Missing or unknown API key."},
    403: {
        "model": ErrorResponse,
        "description": "The key lacks the scope (read for GET and POST /v1/chat/completions, write otherwise).",
    },
    422: {
        "model": ErrorResponse,
        "description": "A malformed parameter; `param` names it. Besides each parameter's schema: no parameter the "
        "operation does not list (the message names the closest one it takes); a parameter "
        "that takes one value may not be given more than once; no text parameter may hold a NUL character; "
        "`camera` names at most 50 cameras of at most 64 characters each (commas separate cameras within a value), "
        "`zone` at most 32 zones of at most 64 characters each (the same way); "
        "`until` must be after `since`; `cursor` must be a `next_cursor` the API returned.",
    },
}
BAD_BODY: Responses = {
    400: {"model": ErrorResponse, "description": "The body is not JSON, not UTF-8, or holds a lone surrogate."},
    413: {
        "model": ErrorResponse,
        "description": "The body is larger than the operation's limit (VISIONCAP_API_MAX_BODY_BYTES, Ask's "
        "VISIONCAP_ASK_MAX_BODY_BYTES); refused before it is read.",
    },
}
NOT_FOUND: Responses = {404: {"model": ErrorResponse, "description": "No caption with this id."}}


def service(request: Request) -> ApiService:
    return cast(ApiService, request.app.state.api)
