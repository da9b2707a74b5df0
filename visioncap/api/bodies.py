"""Request bodies: a size limit per route, enforced before a byte beyond it is read, and text that is Unicode.

One ASGI middleware, so that no route, present or future, reads a body of any size: FastAPI reads the whole body
into memory before validating it (four 50 MB bodies took the API from 152 to 522 MiB). A declared Content-Length
over the route's limit is refused before anything is read; a chunked body is counted as it arrives and refused
at the first chunk past the limit. A body within it is handed on whole.

JSON may spell a lone surrogate (`"\\ud800"`), which Python's json reads into a str that cannot be encoded: any
later encode (SQLite's, the VLM request's) failed with a 500. Refused here, for every body, with a 400.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from visioncap.api.errors import error_response

# A JSON string escape; `\\` is one escape, so the `\u` of `\\u` is not read as one.
_ESCAPE = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)
_HIGH = range(0xD800, 0xDC00)
_LOW = range(0xDC00, 0xE000)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The largest body (bytes) of each route: `by_path`'s, else `default`."""

    default: int
    by_path: Mapping[str, int] = field(default_factory=dict)

    def of(self, path: str) -> int:
        return self.by_path.get(path, self.default)


def lone_surrogate(body: bytes) -> bool:
    """Whether the JSON text `body` escapes half of a surrogate pair without the other half."""
    if b"\\u" not in body:  # the common case: no scan
        return False
    awaiting = -1  # where the low half of a pair must start, after its high half
    for match in _ESCAPE.finditer(body):
        unit = int(match[1], 16) if match[1] else None
        if awaiting >= 0:
            if match.start() != awaiting or unit is None or unit not in _LOW:
                return True
            awaiting = -1
        elif unit is not None and unit in _HIGH:
            awaiting = match.end()
        elif unit is not None and unit in _LOW:
            return True
    return awaiting >= 0


def body_problem(body: bytes) -> str | None:
    """Why `body` cannot be text of this API, or None."""
    try:
        body.decode("utf-8")  # strict: refuses surrogates encoded as UTF-8 (json would read them)
    except UnicodeDecodeError as exc:
        return f"the body is not UTF-8 (byte {exc.start})"
    if lone_surrogate(body):
        return "the body holds a lone surrogate (an unpaired \\ud800-\\udfff escape): text must be Unicode"
    return None


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if declared is None and not chunked:  # no body
            await self.app(scope, receive, send)
            return
        limit = self.limits.of(scope["path"])
        too_large = error_response(413, f"the body is larger than this route's limit of {limit} bytes")
        if declared is not None and not chunked:
            if not (declared.isascii() and declared.isdigit()):  # uvicorn refuses these first; any other server
                await error_response(400, "Content-Length is not a number")(scope, receive, send)
                return
            if len(declared.lstrip("0")) > 19 or int(declared) > limit:  # int() refuses 4,300 digits
                await too_large(scope, receive, send)
                return
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone: there is nobody to answer
            chunk = message.get("body", b"")
            if len(body) + len(chunk) > limit:
                await too_large(scope, receive, send)
                return
            body += chunk
            more = message.get("more_body", False)
        problem = body_problem(bytes(body))
        if problem is not None:
            await error_response(400, problem)(scope, receive, send)
            return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the client's own messages (a disconnect, while a response streams)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed
