"""What every router shares: the service of the app, and the security schemes shown in the OpenAPI document."""

from __future__ import annotations

from fastapi import Request, Security

from visioncap.api.auth import bearer_scheme, header_scheme
from visioncap.api.protocol import ErrorResponse
from visioncap.api.serving import ApiService

# Declares the schemes for /docs; the AuthMiddleware enforces them on every request.
SECURED = [Security(bearer_scheme), Security(header_scheme)]

ERRORS = {
    401: {"model": ErrorResponse, "description": "Missing or unknown API key."},
    403: {"model": ErrorResponse, "description": "The key lacks the scope (read for GET, write otherwise)."},
    422: {
        "model": ErrorResponse,
        "description": "A malformed parameter; `param` names it. Besides each parameter's schema: no text parameter "
        "may hold a NUL character; `camera` names at most 50 cameras of at most 64 characters each (commas separate "
        "cameras within a value); `until` must be after `since`; `cursor` must be a `next_cursor` the API returned.",
    },
}
NOT_FOUND = {404: {"model": ErrorResponse, "description": "No caption with this id."}}


def service(request: Request) -> ApiService:
    return request.app.state.api
