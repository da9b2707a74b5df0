"""The gateway's composition root: `create_app` builds the app from its configuration, `build_gateway` adds the
checks for where it will run, and `run_gateway()`, which the `visioncap gateway` command calls, runs it."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from visioncap.config.gateway import GatewayConfig
from visioncap.gateway.errors import ErrorType, error_body
from visioncap.gateway.realtime import run_realtime
from visioncap.gateway.router import GENERATION_PATHS, router
from visioncap.gateway.safety import check_gateway_can_serve
from visioncap.gateway.serving import Gateway

log = logging.getLogger(__name__)


DESCRIPTION = """Forwards OpenAI requests to vLLM: interactive keys at once, background keys through a queue
paced by the admission controller; each key's traffic class sets vLLM's `priority`. Request bodies are described as
far as the gateway reads them; every other field passes to vLLM, which validates it (its errors reach the caller
unchanged).
"""
BEARER = {"type": "http", "scheme": "bearer", "description": "Authorization: Bearer KEY (a key of the gateway's file)."}


def _document_the_key(app: FastAPI) -> None:
    """The routes name the `bearer` scheme (router.SECURED); the document defines it."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()  # made once, then cached by FastAPI
        document.setdefault("components", {}).setdefault("securitySchemes", {"bearer": BEARER})
        return document

    app.openapi = openapi  # type: ignore[method-assign]


class GatewayApp(FastAPI):
    """The gateway's app: POSTs to the generation routes go straight to the gateway, past FastAPI's and
    Starlette's whole middleware stack; everything else is FastAPI's.

    Every chat's first token waits for the route to be found and the request wrapped; on the 2-core test machine
    FastAPI's routing took 0.33 ms of the gateway's 1.6 ms of added time to first token (sequential chats against an
    instant upstream), and under load that CPU is taken from vLLM. A middleware inside the stack still paid for the
    layers around it, on every streamed chunk too (each `send` passed Starlette's error middleware's wrapper;
    FastAPI adds body-limit and telemetry layers). The routes stay registered for the OpenAPI document. The error
    middleware's part is kept here: a fault before the answer starts is logged and answered with the one JSON
    error shape; one while streaming is `ProxyResponse`'s to handle (it cuts the answer).
    """

    gateway: Gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = GENERATION_PATHS.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                try:
                    response = await self.gateway.generate(Request(scope, receive), endpoint)
                except Exception:
                    log.exception("gateway error before forwarding a request")
                    response = _internal_error()
                await response(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _internal_error() -> JSONResponse:
    # A fault of the gateway's own: still the one error shape, never a bare text.
    return JSONResponse(
        error_body(500, ErrorType.INTERNAL, "internal error; the gateway's log has the details"), status_code=500
    )


def create_app(config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> GatewayApp:
    """A gateway app; its lifespan opens the upstream connection pool and starts the controller."""
    gateway = Gateway(config, clock=clock)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = GatewayApp(
        title="visioncap gateway",
        summary="OpenAI-compatible priority gateway in front of vLLM.",
        description=DESCRIPTION,
        version="1",
        lifespan=lifespan,
        # Not served: the document is `app.openapi()` (tests/test_fuzz_gateway.py fuzzes the gateway with it).
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.gateway = app.state.gateway = gateway
    app.include_router(router)
    _document_the_key(app)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        # Unknown paths and wrong methods, in the same error shape as everything else.
        return JSONResponse(
            error_body(exc.status_code, ErrorType.INVALID_REQUEST, str(exc.detail)),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(422, ErrorType.INVALID_REQUEST, str(exc.errors()[:1])), status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        return _internal_error()  # uvicorn logs the traceback

    return app


def build_gateway(config: GatewayConfig, host: str, source: str = "gateway config") -> GatewayApp:
    """The app to serve on `host`; a ConfigError naming `source` (where `config` came from) when it could not run
    safely or usefully there: a published demo key reachable from other machines, or vLLM's key not in the
    environment."""
    check_gateway_can_serve(config, host, source)
    return create_app(config)


def run_gateway(
    config: GatewayConfig,
    host: str = "127.0.0.1",
    port: int = 8080,
    log_level: str = "info",
    source: str = "gateway config",
) -> None:
    """Run the gateway in the foreground until Ctrl-C/SIGTERM (uvicorn handles both)."""
    import uvicorn

    app = build_gateway(config, host, source)
    targets = ", ".join(f"{upstream.name} {upstream.base_url}" for upstream in config.upstreams)
    log.info("gateway on http://%s:%d/v1 -> %s", host, port, targets)
    if run_realtime(config.process.realtime_priority, source) == "fifo":
        log.info("gateway event loop under SCHED_FIFO %d", config.process.realtime_priority)
    # The startup heap (imports, the app, its models) never becomes garbage: out of the collector's sight, the
    # oldest generation's collections no longer walk it while chats stream (vLLM's API server does the same).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level.lower(),
        access_log=False,  # one line per request would drown the log under camera load
        # Nothing here reads the client's address, so X-Forwarded-For needs no middleware around every request.
        proxy_headers=False,
        timeout_graceful_shutdown=10,
    )
