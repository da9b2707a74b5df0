"""Request bodies, bounded: the budget of background bodies held at once, reading one body under a size limit, and
the answer to a request refused before its body was all read (sent at once, then the rest read and dropped)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from visioncap.gateway.errors import ErrorType, GatewayError, RefusalReason


class BodyBudget:
    """Bytes of background request bodies held at once (read, parsed, or waiting for admission), bounded.

    A body holds its declared Content-Length from before it is read, or what has arrived so far; one that would
    go beyond the budget is answered 429 with Retry-After before it is read on.
    """

    def __init__(self, limit: int, retry_after_s: Callable[[], int], on_change: Callable[[int], None]) -> None:
        self.limit = limit
        self.held = 0
        self._retry_after_s = retry_after_s
        self._on_change = on_change

    @contextlib.contextmanager
    def hold(self, declared: str | None) -> Iterator[_Held]:
        held = _Held(self)
        try:
            if declared is not None and declared.isdigit():
                held.grow(int(declared))
            yield held
        finally:
            held.grow(0, releasing=True)

    def _change(self, delta: int) -> None:
        if delta > 0 and self.held + delta > self.limit:
            raise GatewayError(
                429,
                ErrorType.BODY_BUDGET_FULL,
                f"the gateway holds {self.held} bytes of waiting background bodies (budget {self.limit}); retry later",
                reason=RefusalReason.BODY_BUDGET_FULL,
                headers={"Retry-After": str(self._retry_after_s())},
            )
        self.held += delta
        self._on_change(self.held)


class _Held:
    def __init__(self, budget: BodyBudget) -> None:
        self._budget = budget
        self.bytes = 0

    def grow(self, total: int, releasing: bool = False) -> None:
        """Hold `total` bytes in all (only ever more, until released)."""
        target = 0 if releasing else max(total, self.bytes)
        if target != self.bytes:
            self._budget._change(target - self.bytes)
            self.bytes = target


class RequestBody:
    """One request's body, read at most once; `complete` once all of it is in, so that a refusal knows whether the
    caller is still sending."""

    def __init__(self, request: Request) -> None:
        self._request = request
        self.complete = False

    async def read(self, limit: int, on_read: Callable[[int], None] | None = None) -> bytes:
        """The whole body, refused with 413 above `limit` (from Content-Length before reading, else while reading);
        `on_read(total bytes so far)` after every piece, so a budget can refuse a body before all of it is in."""
        declared = self._request.headers.get("content-length")
        too_large = GatewayError(
            413,
            ErrorType.REQUEST_TOO_LARGE,
            f"request body is larger than {limit} bytes",
            reason=RefusalReason.BODY_TOO_LARGE,
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks: list[bytes] = []
        size = 0
        while not self.complete:
            message = await self._request.receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            self.complete = not message.get("more_body", False)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise too_large
            if on_read is not None:
                on_read(size)
            chunks.append(chunk)
        return b"".join(chunks)

    def answer(self, response: Response, max_bytes: int, max_s: float) -> Response:
        """`response` as it is once the whole body is in; else `response` followed by a bounded drain."""
        return response if self.complete else DrainingAnswer(response, max_bytes, max_s)


class DrainingAnswer(Response):
    """An answer to a caller that is still sending its body: the answer goes out at once, then the rest of the body
    is read and dropped (at most `max_bytes`, for at most `max_s` seconds), then the connection is closed.

    Without it the caller, still uploading, may never read the answer: uvicorn, keeping the connection alive,
    leaves the body to its HTTP parser, which drops it but under no bound (a caller that sends a piece after the
    answer and then stalls holds the connection for ever: each piece cancels the keep-alive timer for good), and a
    pause of the keep-alive timeout (5 s) closes the connection while the caller is still sending, so its next
    write fails and a client that gives up on a failed write never reads the answer; a close with bytes unread
    sends a reset. Reading in the app, before the response is complete (after it, uvicorn's `receive` says only
    http.disconnect), bounds both and makes the close come after the last byte is in (nginx's lingering close).
    `Connection: close`: the headers go out before it is known whether the drain reaches the end of the body, and
    a connection cut in the middle of one cannot carry another request.
    """

    def __init__(self, answer: Response, max_bytes: int, max_s: float) -> None:
        super().__init__(answer.body, answer.status_code, {**answer.headers, "connection": "close"})
        self.max_bytes = max_bytes
        self.max_s = max_s
        self.drained = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.max_s):
                while self.drained <= self.max_bytes:
                    message = await receive()
                    if message["type"] != "http.request":
                        break  # the caller is gone
                    self.drained += len(message.get("body", b""))  # dropped: drained bytes are never held
                    if not message.get("more_body", False):
                        break
        await send({"type": "http.response.body", "body": b"", "more_body": False})  # uvicorn closes now
