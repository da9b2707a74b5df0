"""Errors the API answers: one JSON shape (`ErrorResponse`) for all of them."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from sqlalchemy.exc import SQLAlchemyError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from visioncap.config.sources import field_path
from visioncap.store.safety import describe, is_unavailable

log = logging.getLogger(__name__)

RETRY_AFTER_S = "5"  # seconds; a PostgreSQL restart or fail-over takes a few

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found",
    405: "invalid_request_error",
    409: "conflict",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "unavailable",
}


def error_body(status: int, message: str, param: str | None = None, error_type: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": error_type or _TYPES.get(status, "error"), "param": param, "code": status}
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    error_type: str | None = None,
) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, error_type), status_code=status, headers=headers)


class ApiError(Exception):
    """A request the API refuses."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.headers = headers
        self.error_type = error_type


def bad_param(param: str, message: str) -> ApiError:
    return ApiError(422, f"{param}: {message}", param=param)


def validation_problem(errors: Sequence[Any]) -> ApiError:
    """The first of pydantic's errors as a 422 naming its field: the parameter, or a body field's dotted path
    (source.url). Only the message is kept, never the input, which may hold a secret."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    where = tuple(first.get("loc", ()))
    if where[:1] == ("body",):
        param = field_path(where[1:]) or None
    else:
        loc = [str(part) for part in where if part not in ("query", "path", "header")]
        param = loc[0] if loc else None
    message = str(first.get("msg", "invalid value"))
    return ApiError(422, f"{param}: {message}" if param else message, param)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.headers, exc.error_type)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problem = validation_problem(exc.errors())
        return error_response(problem.status, problem.message, problem.param)

    @app.exception_handler(SQLAlchemyError)
    async def database_error(request: Request, exc: SQLAlchemyError) -> JSONResponse:
        if not is_unavailable(exc):
            return await unexpected(request, exc)
        # The database is restarting or unreachable: a client should come back, not treat it as a bug of ours.
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, describe(exc))
        return error_response(
            503, "the caption database is unavailable; try again shortly", headers={"Retry-After": RETRY_AFTER_S}
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return error_response(500, "internal error; the server log has the details")
