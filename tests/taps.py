"""A recording, holding and pausing hop between a gateway under test and the real vLLM (and the thread that
serves it): what lets gateway tests decide the order of events instead of racing vLLM."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import anyio
import httpx
import uvicorn
from PIL import Image
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from visioncap.gateway.sse import OUTPUT_FIELD

TIMEOUT = 120  # seconds; only a bound on a broken test, never a measurement


def jpeg_bytes(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


# -- a recording hop between a gateway and vLLM ------------------------------------------------------------


class Tap:
    """Forwards everything to vLLM, records request bodies, holds requests whose `user` is in `held`.

    Streams whose `user` is in `paused` are passed through as vLLM sends them until their first output token, then held
    (vLLM's answer waits in the tap) until the gate opens; `cut` records those whose caller (the gateway) left
    while held, which closes the tap's own connection to vLLM, so vLLM aborts the request.

    It also serves a JPEG at /frame.jpg, for the allow-listed media URL test (vLLM fetches it from here).
    """

    def __init__(self, target_root: str) -> None:
        self.target_root = target_root
        self.root_url = ""  # set once served
        self.bodies: list[dict[str, Any]] = []
        self.held: dict[str, threading.Event] = {}
        self.paused: dict[str, threading.Event] = {}
        self.cut: set[str] = set()
        self._changed = threading.Condition()
        self.frame = jpeg_bytes(640, 480)
        self.app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST"])])
        self._client: httpx.AsyncClient | None = None

    def hold(self, user: str) -> threading.Event:
        gate = self.held[user] = threading.Event()
        return gate

    def pause_after_first_chunk(self, user: str) -> threading.Event:
        gate = self.paused[user] = threading.Event()
        return gate

    def wait_for_cut(self, user: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: user in self.cut, TIMEOUT), f"{user}'s stream was never cut"

    async def _paused_stream(self, path: str, raw: bytes, user: str) -> Response:
        assert self._client is not None
        gate = self.paused[user]
        request = self._client.build_request(
            "POST", self.target_root + path, content=raw, headers={"content-type": "application/json"}
        )
        upstream = await self._client.send(request, stream=True)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                seen = b""
                async for chunk in upstream.aiter_raw():
                    yield chunk
                    if seen is not None:
                        seen += chunk
                        if OUTPUT_FIELD.search(seen):  # the first output token is out (not just the role chunk)
                            seen = None
                            # Abandoned on cancel, so the caller's leaving still gets in while the tap waits.
                            waited = partial(gate.wait, TIMEOUT)
                            released = await anyio.to_thread.run_sync(waited, abandon_on_cancel=True)
                            assert released, "test never released a paused stream"
            except BaseException:
                with self._changed:
                    self.cut.add(user)
                    self._changed.notify_all()
                raise
            finally:
                await upstream.aclose()

        return StreamingResponse(chunks(), status_code=upstream.status_code, media_type="text/event-stream")

    def users_seen(self) -> list[str]:
        with self._changed:
            return [body.get("user", "") for body in self.bodies]

    def wait_for_user(self, user: str) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: any(b.get("user") == user for b in self.bodies), TIMEOUT)

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        if path == "/frame.jpg":
            return Response(self.frame, media_type="image/jpeg")
        raw = await request.body()
        body = json.loads(raw) if raw else {}
        if request.method == "POST":
            with self._changed:
                self.bodies.append(body)
                self._changed.notify_all()
            gate = self.held.get(body.get("user", ""))
            if gate is not None:
                assert await anyio.to_thread.run_sync(gate.wait, TIMEOUT), "test never released a held request"
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT)
        if body.get("stream") and body.get("user", "") in self.paused:
            return await self._paused_stream(path, raw, body["user"])
        # The caller's key and camera go on (a gateway behind the tap needs them); nothing else of its headers.
        headers = {name: request.headers[name] for name in FORWARDED_HEADERS if name in request.headers}
        if raw:
            headers["content-type"] = "application/json"
        upstream = await self._client.request(
            request.method, self.target_root + path, content=raw or None, headers=headers
        )
        return Response(
            upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type")
        )


FORWARDED_HEADERS = ("authorization", "x-visioncap-camera")


class _Server(uvicorn.Server):
    """uvicorn's server with an event for the end of its startup (uvicorn offers only a flag to poll)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.done_starting = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:  # a failed lifespan startup exits the thread: let __enter__ see that at once
            self.done_starting.set()


class AsgiThread:
    """Any ASGI app served by uvicorn in a thread on a free port (or `port`: a server back where a stopped one
    was), started before __enter__ returns; `lifespan` runs the app's (an API opens its HTTP client there)."""

    def __init__(self, app: Any, port: int = 0, lifespan: bool = False) -> None:
        self._socket = socket.socket()
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the stopped one's connections linger
        self._socket.bind(("127.0.0.1", port))
        self._socket.listen(256)  # connections wait in the backlog until uvicorn serves them
        config = uvicorn.Config(app, log_level="warning", lifespan="on" if lifespan else "off")
        self._server = _Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.root_url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._socket])
        finally:  # one that died before its startup (a bad config) is not waited on for the whole TIMEOUT
            self._server.done_starting.set()

    def __enter__(self) -> AsgiThread:
        self._thread.start()
        assert self._server.done_starting.wait(TIMEOUT) and self._server.started, "the server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._socket.close()


@contextmanager
def serving(tap: Tap) -> Iterator[Tap]:
    """`tap` served in a thread, its root_url set; what it still holds is let go before it stops."""
    with AsgiThread(tap.app) as served:
        tap.root_url = served.root_url
        yield tap
        for gate in tap.held.values():  # never leave a request hanging in the tap
            gate.set()
