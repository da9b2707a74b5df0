"""Forwards requests to vLLM and passes its answers back as they arrive (no buffering of whole responses).

The upstream response's status, body bytes and content headers reach the caller unchanged, so vLLM's own
errors keep their shape and status. A caller that disconnects mid-stream closes the upstream connection too,
which makes vLLM abort the request. `on_close` runs exactly once, whatever happens, so admission slots and
in-flight counts are always given back.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import aiohttp
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from visioncap.config.gateway import UpstreamConfig
from visioncap.gateway.errors import ErrorType, GatewayError, RefusalReason
from visioncap.gateway.sse import StreamObserver

log = logging.getLogger(__name__)

# Headers of vLLM's answer that are not about the body, or that uvicorn sets itself.
DROPPED_RESPONSE_HEADERS = {b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"}
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


class UpstreamBroken(Exception):
    """vLLM's answer stopped before its end (connection lost, read timeout, malformed chunk)."""


class UpstreamRefusedError(GatewayError):
    """vLLM could not be connected to (nothing listens there, or its host is unreachable): the request was never
    sent, and the replica is down."""


class UpstreamResponse:
    """An answer from vLLM whose head has arrived; its body is read with `aiter_raw()`."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status_code = response.status
        self.complete = False

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return list(self._response.raw_headers)

    async def aiter_raw(self) -> AsyncIterator[bytes]:
        """The body as it arrives: each piece is what the network delivered since the previous one."""
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc
        self.complete = True

    def abort(self) -> None:
        """Close the connection now (vLLM aborts the request); a read waiting on the body ends with UpstreamBroken."""
        self._response.close()

    def release(self) -> None:
        """Give the connection back, or close it when the body was not read to its end (vLLM then aborts).
        Synchronous, so that no cancellation can come between an answer and its connection's release."""
        if self.complete:
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """One shared connection pool to vLLM.

    aiohttp rather than httpx: streaming the same answers, httpx (h11, anyio cancel scopes per read) took about
    three times aiohttp's CPU per token on the 2-core test machine (300 against 100 us), CPU that a gateway on
    vLLM's host takes from vLLM; `vllm bench serve` reads with aiohttp too.
    """

    def __init__(self, config: UpstreamConfig, api_key: str | None) -> None:
        """Call from a running event loop (aiohttp binds its session to it)."""
        self.base_url = config.base_url.rstrip("/")
        self.metrics_url = config.resolved_metrics_url()
        self.health_url = f"{self.base_url.removesuffix('/v1')}/health"  # vLLM serves it beside /v1, keyless
        self._api_key = api_key
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        )
        self.session = aiohttp.ClientSession(
            # Idle connections are dropped before vLLM's keep-alive timeout (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, 5 s)
            # closes them, so a request never races a server-side close.
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4),
            timeout=self._timeout,
            auto_decompress=False,  # raw bytes pass through; the SSE observer reads them
        )

    async def aclose(self) -> None:
        await self.session.close()

    def _headers(self, incoming: Mapping[str, str] | None, has_body: bool) -> dict[str, str]:
        headers = {"accept-encoding": "identity"}
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
        incoming: Mapping[str, str] | None = None,
        root: bool = False,
    ) -> UpstreamResponse:
        """Send a request and return as soon as the response head arrived (the body is read later).

        `path` is under the OpenAI base URL (/v1), or with `root` under the server's root (/tokenize).
        """
        base = self.base_url.removesuffix("/v1") if root else self.base_url
        try:
            response = await self.session.request(
                method, f"{base}{path}", data=body, headers=self._headers(incoming, body is not None)
            )
        except TimeoutError as exc:  # aiohttp's ServerTimeoutError and ConnectionTimeoutError included
            raise GatewayError(
                504,
                ErrorType.UPSTREAM_TIMEOUT,
                f"vLLM did not answer in time ({type(exc).__name__})",
                reason=RefusalReason.UPSTREAM,
            ) from exc
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamRefusedError(
                502,
                ErrorType.UPSTREAM_UNAVAILABLE,
                f"vLLM is unreachable ({type(exc).__name__}: {exc})",
                reason=RefusalReason.UPSTREAM,
            ) from exc
        except aiohttp.ClientError as exc:
            raise GatewayError(
                502,
                ErrorType.UPSTREAM_UNAVAILABLE,
                f"vLLM is unreachable ({type(exc).__name__}: {exc})",
                reason=RefusalReason.UPSTREAM,
            ) from exc
        return UpstreamResponse(response)

    async def get_text(self, url: str, timeout_s: float) -> str:
        """GET a whole text answer (vLLM's /metrics); raises UpstreamBroken on any failure or non-2xx status."""
        try:
            # identity: the session passes bodies through undecoded, and prometheus_client's filtered page is
            # gzipped for any caller that accepts it.
            async with self.session.get(
                url, timeout=aiohttp.ClientTimeout(total=timeout_s), headers={"accept-encoding": "identity"}
            ) as response:
                response.raise_for_status()
                return await response.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            raise UpstreamBroken(f"{type(exc).__name__}: {exc}") from exc


class ProxyResponse(Response):
    """An ASGI response that streams an open upstream response to the caller."""

    def __init__(
        self,
        upstream: UpstreamResponse,
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
            (name, value) for name, value in upstream.raw_headers if name.lower() not in DROPPED_RESPONSE_HEADERS
        ]
        self._events = any(
            name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream")
            for name, value in self.raw_headers
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome = Outcome(self.status_code, completed=False)
        # The caller's disconnect is watched beside the stream and closes vLLM's answer, which ends the stream's
        # read (and makes vLLM abort the request). No task group: one per answer (a cancel scope, a task handle)
        # was the largest Python-level cost left on a chat's path, about 5 % of the gateway's CPU (py-spy).
        watcher = asyncio.ensure_future(self._watch_disconnect(receive, outcome))
        try:
            try:
                await self._stream(send)
                outcome.completed = True
            except UpstreamBroken as exc:
                # The status line is gone already, so the answer cannot be sent again elsewhere. A stream
                # ends with an error event (OpenAI's shape, which its clients raise), any other body without
                # its last chunk: uvicorn drops the connection, so the caller sees it cut, not complete.
                if not outcome.disconnected:  # else it broke because the watcher closed it: nobody to tell
                    outcome.error = f"upstream stream broke: {exc}"
                    if self._events:
                        await send({"type": "http.response.body", "body": _error_event(exc), "more_body": True})
                        await send({"type": "http.response.body", "body": b"", "more_body": False})
            except Exception as exc:
                # A bug of ours must not pass for vLLM's fault in the metrics; the caller sees a cut body.
                log.exception("gateway error while streaming an answer")
                outcome.error = f"gateway: {type(exc).__name__}: {exc}"
        finally:
            watcher.cancel()
            if self._observer is not None and self._observer.error and outcome.error is None:
                outcome.error = self._observer.error
            self.upstream.release()
            self._on_close(outcome)

    async def _watch_disconnect(self, receive: Receive, outcome: Outcome) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        outcome.disconnected = True
        self.upstream.abort()

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


def _error_event(exc: UpstreamBroken) -> bytes:
    error = {"message": f"vLLM broke off the answer ({exc})", "type": ErrorType.UPSTREAM_UNAVAILABLE, "code": 502}
    # A blank line first: the event must not join one that vLLM left unfinished.
    return b"\n\ndata: " + json.dumps({"error": error}).encode() + b"\n\n"
