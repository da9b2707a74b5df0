"""Errors the gateway answers itself, in the OpenAI error shape that vLLM uses too."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse


class RefusalReason(StrEnum):
    """Why the gateway refused a request itself: the `reason` label of the rejections metric."""

    UNAUTHORIZED = "unauthorized"  # no API key, or one the gateway does not know
    BAD_REQUEST = "bad_request"  # a body or header the gateway cannot accept (malformed, too deep, n > 1, ...)
    CAMERA_NOT_ALLOWED = "camera_not_allowed"  # the key may not name that camera
    IMAGE_TOO_LARGE = "image_too_large"  # an image costs more tokens than the gateway allows
    MEDIA_URL_REFUSED = "media_url_refused"  # a media URL that is neither a data: URI nor of an allowed host
    RATE_LIMITED = "rate_limited"  # the key is over its request rate
    QUEUE_FULL = "queue_full"  # the background queue has no room
    DEADLINE = "deadline"  # a background request waited past its deadline
    BODY_BUDGET_FULL = "body_budget_full"  # the memory budget of waiting background bodies is spent
    BODY_TOO_LARGE = "body_too_large"  # the body is larger than the key's class allows
    UPSTREAM = "upstream"  # vLLM is unreachable or did not answer in time
    CLIENT_GONE = "client_gone"  # the caller left while its background request waited (nobody is answered)


class ErrorType(StrEnum):
    """The `type` of the OpenAI-shaped error bodies the gateway writes itself (what clients match on)."""

    AUTHENTICATION = "authentication_error"
    INVALID_REQUEST = "invalid_request_error"
    CAMERA_NOT_ALLOWED = "camera_not_allowed"
    IMAGE_TOO_LARGE = "image_too_large"
    MEDIA_URL_NOT_ALLOWED = "media_url_not_allowed"
    RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
    QUEUE_FULL = "queue_full"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    BODY_BUDGET_FULL = "body_budget_full"
    REQUEST_TOO_LARGE = "request_too_large"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    INTERNAL = "internal_error"  # an unexpected failure inside the gateway (answered 500)


def error_body(status: int, error_type: ErrorType, message: str, param: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`: vLLM's ErrorResponse, so clients parse one shape."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": status}}


class GatewayError(Exception):
    """A request the gateway refuses; becomes an OpenAI-shaped JSON error response."""

    def __init__(
        self,
        status: int,
        error_type: ErrorType,
        message: str,
        *,
        reason: RefusalReason,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.message = message
        self.reason = reason
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
        ErrorType.AUTHENTICATION,
        "missing or unknown API key (send Authorization: Bearer KEY)",
        reason=RefusalReason.UNAUTHORIZED,
        headers={"WWW-Authenticate": "Bearer"},
    )


def invalid_request(message: str, status: int = 400, param: str | None = None) -> GatewayError:
    """A body or header the gateway cannot accept (malformed, too deep, against a rule of its own)."""
    return GatewayError(status, ErrorType.INVALID_REQUEST, message, reason=RefusalReason.BAD_REQUEST, param=param)
