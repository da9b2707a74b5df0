"""The API's composition root: `create_app` builds the app from settings, `build_api` adds the checks for the
address it will listen on, and `run_api()`, which the `visioncap api` command calls, runs it."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi_offline import FastAPIOffline
from starlette.staticfiles import StaticFiles

from visioncap.api.auth import AuthMiddleware, KeyRing
from visioncap.api.bodies import BodyLimitMiddleware, BodyLimits
from visioncap.api.errors import install_handlers
from visioncap.api.metrics import ApiMetrics, MetricsMiddleware
from visioncap.api.routers import alerts, ask, cameras, captions, health, page, stream, summaries
from visioncap.api.safety import check_api_can_serve
from visioncap.api.security import SecurityHeadersMiddleware
from visioncap.api.serving import ApiService, static_dir
from visioncap.api.startup import SchemaGate, SchemaGateMiddleware
from visioncap.config.alerts import load_alerts_config
from visioncap.config.api import ApiSettings
from visioncap.store import create_db_engine
from visioncap.store.retention import RetentionJob
from visioncap.store.vectors import BackgroundEmbedder

log = logging.getLogger(__name__)

DOCS_URL = "/docs"
DOCS_ASSETS_URL = "/static/docs"  # mounted before /static (the page's own files), so it takes these paths

DESCRIPTION = """Captions of the visioncap camera pipeline: search, images, cameras, live updates, and
Ask: questions answered from them by the VLM (OpenAI chat completions).

Every route but `/healthz` needs an API key (`Authorization: Bearer KEY` or `X-Api-Key: KEY`): GET routes the
`read` scope, and so does Ask (`POST /v1/chat/completions`: it only reads); others `write`. Errors share one
shape, `{"error": {"message", "type", "param", "code"}}`.
"""


def _document_configured_limits(app: FastAPI, settings: ApiSettings) -> None:
    """The OpenAPI document states the limits of these settings, which the routes cannot declare (their parameters
    are fixed at import): a request the document calls valid is then one this server accepts."""
    limits = {"limit": {"maximum": settings.api_max_page_size}, "q": {"maxLength": settings.api_max_query_length}}
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = generate()  # made once, then cached by FastAPI
        if fresh:
            for parameter in document["paths"]["/v1/captions"]["get"]["parameters"]:
                schema = parameter["schema"]
                for branch in schema.get("anyOf", [schema]):  # an optional parameter: anyOf [its type, null]
                    if parameter["name"] in limits and branch.get("type") != "null":
                        branch.update(limits[parameter["name"]])
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: ApiSettings) -> FastAPI:
    """An API app over the database of `settings`; the schema is brought up to date here."""
    engine = create_db_engine(settings.resolved_database_url())
    # A database away at start is waited for (503 until it answers), not an exit: a restarted pod would crash-loop.
    gate = SchemaGate(engine)
    gate.prepare()
    metrics = ApiMetrics()
    api = ApiService(settings, engine, metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # Sweeps run here as well as in `visioncap run`: either process alone keeps the database bounded.
        retention = RetentionJob.from_settings(engine, settings, metrics.retention)
        api.retention = retention
        preparing = None if gate.ready else asyncio.create_task(gate.keep_trying())
        async with httpx.AsyncClient(timeout=httpx.Timeout(3.0)) as client:
            api.http = client
            retention.start()
            if api.embedder is not None:
                # Vectors for captions as they are stored, in this process (see store/vectors.py for why here).
                api.background_embedder = BackgroundEmbedder(
                    engine, api.embedder, settings.api_embed_batch, settings.api_embed_poll_s
                )
                api.background_embedder.start()
            try:
                yield
            finally:
                if preparing is not None:
                    preparing.cancel()
                if api.background_embedder is not None:
                    await anyio.to_thread.run_sync(api.background_embedder.stop)
                await anyio.to_thread.run_sync(retention.stop)
                api.http = None
                engine.dispose()

    # FastAPIOffline: /docs loads Swagger UI from files in the fastapi-offline wheel, never from a CDN. Under
    # /static/, so the assets are public exactly when the page and /docs are (VISIONCAP_API_PUBLIC_UI).
    app = FastAPIOffline(
        title="visioncap API",
        summary="Search and follow the captions of the camera pipeline.",
        description=DESCRIPTION,
        version="1",
        lifespan=lifespan,
        docs_url=DOCS_URL,
        redoc_url=None,
        static_url=DOCS_ASSETS_URL,
        # The validator badge would make the browser call validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.api = api
    # Alerts: the rules of the alerts file, shown read-only (the `visioncap alerts` process applies them).
    app.state.alerts_config = load_alerts_config(settings.alerts_config) if settings.alerts_config else None
    for module in (captions, cameras, stream, health, page, alerts, ask, summaries):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=static_dir()), name="static")
    _document_configured_limits(app, settings)
    install_handlers(app)
    # Added innermost first: CORS answers preflights and labels even the 401s; metrics count everything.
    app.add_middleware(SchemaGateMiddleware, gate=gate)  # inside the key check: 401 before any 503
    limits = BodyLimits(settings.api_max_body_bytes, {"/v1/chat/completions": settings.ask_max_body_bytes})
    app.add_middleware(BodyLimitMiddleware, limits=limits)  # after the key check: no stranger's body is read
    app.add_middleware(AuthMiddleware, keys=KeyRing(settings.api_keys), public_ui=settings.api_public_ui)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_middleware(SecurityHeadersMiddleware, docs_path=DOCS_URL)
    if settings.api_cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.api_cors_origins,
            # Every method a route has: a console on another origin manages cameras and alert rules too.
            allow_methods=["GET", "POST", "PATCH", "DELETE"],
            allow_headers=["Authorization", "X-Api-Key", "If-None-Match", "Content-Type", "Last-Event-ID"],
            expose_headers=["ETag"],
        )
    if not settings.api_keys:
        log.warning("no VISIONCAP_API_KEYS configured: every route but /healthz answers 401")
    return app


def build_api(settings: ApiSettings, host: str) -> FastAPI:
    """The app to serve on `host`; a ConfigError, before anything is opened, when a configured key is a published
    demo key and `host` is reachable from other machines."""
    check_api_can_serve(settings, host)
    return create_app(settings)


def run_api(settings: ApiSettings, host: str = "127.0.0.1", port: int = 8090, log_level: str = "info") -> None:
    """Run the API in the foreground until Ctrl-C/SIGTERM (uvicorn handles both)."""
    import uvicorn

    app = build_api(settings, host)
    log.info("API on http://%s:%d (database %s)", host, port, app.state.api.engine.url.render_as_string())
    # Everything alive now (the app, SQLAlchemy, pydantic: ~110,000 objects) lives as long as the process. Out of
    # the collector's sight, a full collection no longer stalls a request for ~80 ms (measured on a million rows).
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=5)
