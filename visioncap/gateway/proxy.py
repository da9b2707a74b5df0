"""Forwards requests to vLLM and passes its answers back as they arrive (no buffering of whole responses).

The upstream response's status, body bytes and content headers reach the caller unchanged, so vLLM's own
errors keep their shape and status. A caller that disconnects mid-stream closes the upstream connection too,
which makes vLLM abort the request. `on_close` runs exactly once, whatever happens, so admission slots and
in-flight counts are always given back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from visioncap.config.gateway import UpstreamConfig
from visioncap.gateway.errors import GatewayError
from visioncap.gateway.sse import CountingTransport, StreamObserver

log = logging.getLogger(__name__)

# Headers of vLLM's answer that are not about the body, or that uvicorn sets itself.
DROPPED_RESPONSE_HEADERS = {"connection", "keep-alive", "transfer-encoding", "date", "server"}
# Caller headers forwarded to vLLM besides the body's content type.
FORWARDED_REQUEST_HEADERS = ("x-request-id", "accept", "traceparent", "tracestate")


@dataclass
class Outcome:
    """How a proxied exchange ended, for metrics."""

    status: int
    completed: bool  # the whole body reached the caller
    disconnected: bool = False
    error: str | None = None

    @property
    def how(self) -> str:
        """completed, caller_gone, upstream_error or gateway_error (a fault of the gateway's own code)."""
        if self.completed:  # uvicorn reports a disconnect once the last byte is sent, too
            return "completed"
        if self.disconnected:
            return "caller_gone"
        if self.error is not None:
            return "gateway_error" if self.error.startswith("gateway:") else "upstream_error"
        return "caller_gone"


class Upstream:
    """One shared connection pool to vLLM."""

    def __init__(self, config: UpstreamConfig, api_key: str | None) -> None:
        self.base_url = config.base_url.rstrip("/")
        self.metrics_url = config.resolved_metrics_url()
        self._api_key = api_key
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s, pool=None),
            # Idle connections are dropped before vLLM's keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s)
            # closes them, so a request never races a server-side close.
            # Sockets that count their reads: the stream observer times inter-token gaps per network read.
            transport=CountingTransport(
                httpx.Limits(max_connections=None, max_keepalive_connections=256, keepalive_expiry=4)
            ),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    def _headers(self, incoming: dict[str, str] | None, has_body: bool) -> dict[str, str]:
        headers = {"accept-encoding": "identity"}  # raw bytes pass through; the SSE observer reads them
        if has_body:
            headers["content-type"] = "application/json"
        if self._api_key:
            headers["authorization"] = f"Bearer {self._api_key}"
        for name in FORWARDED_REQUEST_HEADERS:
            if incoming and name in incoming:
                headers[name] = incoming[name]
        return headers

    async def open(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        incoming: dict[str, str] | None = None,
        root: bool = False,
    ) -> httpx.Response:
        """Send a request and return as soon as the response head arrived (the body is read later).

        `path` is under the OpenAI base URL (/v1), or with `root` under the server's root (/tokenize).
        """
        base = self.base_url.removesuffix("/v1") if root else self.base_url
        request = self.client.build_request(
            method, f"{base}{path}", content=body, headers=self._headers(incoming, body is not None)
        )
        try:
            return await self.client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise GatewayError(
                504, "upstream_timeout", f"vLLM did not answer in time ({type(exc).__name__})", reason="upstream"
            ) from exc
        except httpx.HTTPError as exc:
            raise GatewayError(
                502, "upstream_unavailable", f"vLLM is unreachable ({type(exc).__name__}: {exc})", reason="upstream"
            ) from exc


class ProxyResponse(Response):
    """An ASGI response that streams an open upstream response to the caller."""

    def __init__(
        self,
        upstream: httpx.Response,
        on_close: Callable[[Outcome], None],
        observer: StreamObserver | None = None,
    ) -> None:
        # Response.__init__ would render a body; this one streams, so only what Starlette/FastAPI read is set.
        self.upstream = upstream
        self.status_code = upstream.status_code
        self.background = None
        self._on_close = on_close
        self._observer = observer
        self.raw_headers = [
            (name.encode("latin-1"), value.encode("latin-1"))
            for name, value in upstream.headers.multi_items()
            if name.lower() not in DROPPED_RESPONSE_HEADERS
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = Outcome(self.status_code, completed=False)
        try:
            async with anyio.create_task_group() as group:

                async def watch_disconnect() -> None:
                    while True:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            outcome.disconnected = True
                            group.cancel_scope.cancel()
                            return

                group.start_soon(watch_disconnect)
                try:
                    await self._stream(send)
                    outcome.completed = True
                except httpx.HTTPError as exc:
                    # The status line is gone already: ending without the last chunk makes uvicorn drop the
                    # connection, so the caller sees a truncated body rather than a clean end.
                    outcome.error = f"upstream stream broke: {type(exc).__name__}: {exc}"
                except Exception as exc:
                    # A bug of ours must not pass for vLLM's fault in the metrics; the caller sees a cut body.
                    log.exception("gateway error while streaming an answer")
                    outcome.error = f"gateway: {type(exc).__name__}: {exc}"
                finally:
                    group.cancel_scope.cancel()
        finally:
            if self._observer is not None and self._observer.error and outcome.error is None:
                outcome.error = self._observer.error
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
            self._on_close(outcome)

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        observer = self._observer
        async for chunk in self.upstream.aiter_raw():
            if observer is not None:
                try:
                    observer.feed(chunk)
                except Exception:
                    # Measuring must never cut an answer: stop measuring this one and go on forwarding.
                    log.exception("stream observer failed; this answer is no longer measured")
                    observer = self._observer = None
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if observer is not None:
            observer.close()  # streams without a [DONE] (the Responses API's) end their last arrival here
        await send({"type": "http.response.body", "body": b"", "more_body": False})
