"""Errors the gateway answers itself, in the OpenAI error shape that vLLM uses too."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse


def error_body(status: int, error_type: str, message: str, param: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: vLLM's ErrorResponse, so clients parse one shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


class GatewayError(Exception):
    """A request the gateway refuses; becomes an OpenAI-shaped JSON error response."""

    def __init__(
        self,
        status: int,
        error_type: str,
        message: str,
        *,
        reason: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.reason = reason or error_type  # the label of the rejection metric
        self.param = param
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_body(self.status, self.error_type, self.message, self.param),
            status_code=self.status,
            headers=self.headers,
        )


def unauthorized() -> GatewayError:
    return GatewayError(
        401,
        "authentication_error",
        "missing or unknown API key (send Authorization: Bearer KEY)",
        reason="unauthorized",
        headers={"WWW-Authenticate": "Bearer"},
    )
