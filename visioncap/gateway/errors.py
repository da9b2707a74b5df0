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
    INTERNAL = "internal"  # the gateway failed itself (a body-check worker died)


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
    return {"error": {"message": _encodable(message), "type": error_type, "param": _encodable(param), "code": status}}


def _encodable(text: str | None) -> str | None:
    """`text` with any lone surrogate written as its escape: a refusal may quote a caller's key or value, and the
    answer is UTF-8, which cannot hold one (the refusal of such text would itself fail)."""
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in a body-check worker process (`visioncap.gateway.body_check`) and re-raised here: pickled whole.
        fields = (self.status, self.error_type, self.message, self.reason, self.param, self.headers)
        return _rebuild, (type(self), fields)

    def response(self) -> JSONResponse:
        return JSONResponse(
            error_body(self.status, self.error_type, self.message, self.param),
            status_code=self.status,
            headers=self.headers,
        )


def _rebuild(kind: type[GatewayError], fields: tuple[Any, ...]) -> GatewayError:
    status, error_type, message, reason, param, headers = fields
    return kind(status, error_type, message, reason=reason, param=param, headers=headers)


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
