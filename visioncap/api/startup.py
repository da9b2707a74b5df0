"""The API starts while its database is away: until the schema could be prepared, data routes and /readyz answer
503 with Retry-After (the JSON error shape), and the schema is prepared as soon as the database answers.

A pod started during a database restart or fail-over would otherwise exit at once and crash-loop; /healthz, the
page and the docs answer meanwhile, so that liveness probes leave it running.
"""

from __future__ import annotations

import logging
import threading
import time

import anyio
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Receive, Scope, Send

from visioncap.api.errors import RETRY_AFTER_S, error_response
from visioncap.errors import VisioncapError
from visioncap.store.safety import describe, is_unavailable
from visioncap.store.schema import ensure_schema

log = logging.getLogger(__name__)

RETRY_S = 2.0  # between attempts to prepare the schema while the database is away
LOG_EVERY_S = 30.0  # an outage is logged when it starts, then at most this often


class SchemaGate:
    """Whether the database schema is prepared; `prepare()` tries once, `keep_trying()` until it succeeds."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._ready = threading.Event()
        self.error: str | None = None  # why the last attempt failed
        self._logged_at = float("-inf")

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def prepare(self) -> bool:
        """One attempt; False while the database is unavailable. Other errors (a schema newer than this
        visioncap, a statement the database refuses) are raised: waiting would not mend them."""
        try:
            ensure_schema(self._engine)
        except VisioncapError as exc:
            cause = exc.__cause__
            if not (isinstance(cause, SQLAlchemyError) and is_unavailable(cause)):
                raise
            self.error = describe(cause)
            now = time.monotonic()
            if now - self._logged_at >= LOG_EVERY_S:
                self._logged_at = now
                log.warning(
                    "the caption database is unavailable (%s); the API answers 503 until it is back", self.error
                )
            return False
        if self.error is not None:
            log.info("the caption database is back: schema ready, the API serves")
        self.error = None
        self._ready.set()
        return True

    async def keep_trying(self, retry_s: float = RETRY_S) -> None:
        """Until the schema is prepared: an attempt every `retry_s` seconds, off the event loop."""
        while not self.ready:
            await anyio.sleep(retry_s)
            try:
                await anyio.to_thread.run_sync(self.prepare)
            except VisioncapError as exc:
                # The database came back with something waiting cannot mend: the routes keep answering 503, and
                # the log says why.
                self.error = str(exc)
                log.error("cannot prepare the caption database: %s", exc)
                return


class SchemaGateMiddleware:
    """503 with Retry-After on data routes (/v1/...) and /readyz while the gate is not ready; everything else, and
    everything once it is, passes. Added inside the auth middleware: a request without a key still gets 401."""

    def __init__(self, app: ASGIApp, gate: SchemaGate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.gate.ready:
            path = scope["path"]
            if path == "/readyz" or path.startswith("/v1/"):
                # The cause stays in the server's log: it names hosts and ports a client has no need of.
                response = error_response(
                    503,
                    "the caption database is unavailable; try again shortly",
                    headers={"Retry-After": RETRY_AFTER_S},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
