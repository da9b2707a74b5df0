"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import JSONResponse, Response

from visioncap.api.errors import RETRY_AFTER_S
from visioncap.api.protocol import Health, Readiness
from visioncap.api.routers.common import ERRORS, SECURED, service
from visioncap.api.serving import ApiService
from visioncap.store.records import CaptionStatus

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness (no key needed)")
async def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Readiness: database and VLM reachable",
    dependencies=SECURED,
    responses={**ERRORS, 503: {"model": Readiness, "description": "A dependency does not answer."}},
)
async def readyz(api: Annotated[ApiService, Depends(service)]) -> Response:
    readiness = await api.readiness()
    if readiness.status == "ready":
        return JSONResponse(readiness.model_dump(mode="json"))
    return JSONResponse(readiness.model_dump(mode="json"), status_code=503, headers={"Retry-After": RETRY_AFTER_S})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=SECURED,
    response_class=Response,
    responses={**ERRORS, 200: {"content": {CONTENT_TYPE_LATEST: {}}}},
)
async def metrics(api: Annotated[ApiService, Depends(service)]) -> Response:
    try:
        counts = await anyio.to_thread.run_sync(api.status_counts)
    except Exception:  # the request metrics are still worth serving when the database is away
        counts = {}
    for status in CaptionStatus:
        api.metrics.captions.labels(status).set(counts.get(status, 0))
    return Response(api.metrics.render(), media_type=CONTENT_TYPE_LATEST)
