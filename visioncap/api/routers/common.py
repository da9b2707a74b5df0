"""What every router shares: the service of the app, and the security schemes shown in the OpenAPI document."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import get_origin

import anyio
from fastapi import Depends, HTTPException, Request, Security
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


def _single_valued(dependant: Dependant) -> list[str]:
    names = [f.alias for f in dependant.query_params if get_origin(f.field_info.annotation) not in _SEQUENCES]
    return names + [name for sub in dependant.dependencies for name in _single_valued(sub)]


def one_value_each(request: Request) -> None:
    """Refuses a parameter that takes one value when it is given more than once. FastAPI would quietly keep the
    last one, so `q=a&q=b` searched for b alone: a client (or a proxy appending parameters) got an answer to
    a question it did not ask, and the schema says the parameter is a single value."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    for name in _single_valued(route.dependant):
        if len(request.query_params.getlist(name)) > 1:
            raise bad_param(name, "given more than once; it takes one value")


class SharedPathRoute(APIRoute):
    """A 405 whose `Allow` names every method of the path: Starlette names only those of the first route that
    matched it, and a resource's collection (GET, POST) or item (PATCH, DELETE) is served by several routes."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.methods and scope["method"] not in self.methods:
            allowed = {
                method
                for route in scope["app"].router.routes
                if isinstance(route, APIRoute) and route.path_format == self.path_format
                for method in route.methods
            }
            raise HTTPException(405, "Method Not Allowed", headers={"Allow": ", ".join(sorted(allowed))})
        await super().handle(scope, receive, send)


# Declares the schemes for /docs (the AuthMiddleware enforces them on every request), and refuses repeated
# single-valued parameters on every route.
SECURED = [Security(bearer_scheme), Security(header_scheme), Depends(one_value_each)]

ERRORS = {
    401: {"model": ErrorResponse, "description": "Missing or unknown API key."},
    403: {
        "model": ErrorResponse,
        "description": "The key lacks the scope (read for GET and POST /v1/chat/completions, write otherwise).",
    },
    422: {
        "model": ErrorResponse,
        "description": "A malformed parameter; `param` names it. Besides each parameter's schema: a parameter "
        "that takes one value may not be given more than once; no text parameter may hold a NUL character; "
        "`camera` names at most 50 cameras of at most 64 characters each (commas separate cameras within a value); "
        "`until` must be after `since`; `cursor` must be a `next_cursor` the API returned.",
    },
}
BAD_BODY = {400: {"model": ErrorResponse, "description": "The body is not JSON."}}
NOT_FOUND = {404: {"model": ErrorResponse, "description": "No caption with this id."}}


def service(request: Request) -> ApiService:
    return request.app.state.api
