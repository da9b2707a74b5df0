"""Liveness, readiness, Prometheus metrics, and what this server and key can do (the web page asks)."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Request
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse, Response

from visioncap.api.auth import CameraScope, Principal, camera_scope
from visioncap.api.errors import RETRY_AFTER_S, ApiError
from visioncap.api.protocol import ErrorResponse, Health, Readiness
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
    summary="Readiness: database and VLM reachable, and the VLM serves Ask's model",
    dependencies=SECURED,
    responses={**ERRORS, 503: {"model": Readiness, "description": "A dependency does not answer."}},
)
async def readyz(api: Annotated[ApiService, Depends(service)]) -> Response:
    readiness = await api.readiness()
    if api.settings.api_ready_check_vlm and api.http is not None:
        # Ask's model too: a VLM that answers /models but not for the name Ask sends would fail every question.
        ask = await api.asker.model.check(api.http)
        ready = readiness.status == "ready" and ask.ok
        readiness = Readiness(status="ready" if ready else "unavailable", checks={**readiness.checks, "ask": ask})
    if readiness.status == "ready":
        return JSONResponse(readiness.model_dump(mode="json"))
    return JSONResponse(readiness.model_dump(mode="json"), status_code=503, headers={"Retry-After": RETRY_AFTER_S})


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    dependencies=SECURED,
    response_class=Response,
    responses={
        **ERRORS,
        200: {"content": {CONTENT_TYPE_LATEST: {}}},
        403: {"model": ErrorResponse, "description": "The key lacks the read scope, or is limited to some cameras."},
    },
)
async def metrics(
    api: Annotated[ApiService, Depends(service)], scope: Annotated[CameraScope, Depends(camera_scope)]
) -> Response:
    if scope.limited:  # rows by status over every camera
        raise ApiError(403, "the metrics are site-wide: they need an API key without `cameras`")
    try:
        counts = await anyio.to_thread.run_sync(api.status_counts)
    except Exception:  # the request metrics are still worth serving when the database is away
        counts = {}
    for status in CaptionStatus:
        api.metrics.captions.labels(status).set(counts.get(status, 0))
    return Response(api.metrics.render(), media_type=CONTENT_TYPE_LATEST)


class Capabilities(BaseModel):
    """What this server serves and what the request's key may do: a client (the web page) offers only that."""

    model_config = ConfigDict(extra="forbid")

    semantic_search: bool = Field(
        description="Whether GET /v1/captions takes `semantic` and `hybrid` (VISIONCAP_API_SEMANTIC_SEARCH); off, "
        "they answer 422."
    )
    max_page_size: int = Field(description="The largest `limit` of GET /v1/captions (VISIONCAP_API_MAX_PAGE_SIZE).")
    scopes: list[str] = Field(description="The key's scopes: `read`, and `write` to change (regenerate, pause, rules).")
    cameras: list[str] | None = Field(description="The cameras the key is limited to; null: every camera.")


@router.get(
    "/v1/capabilities",
    response_model=Capabilities,
    summary="What this server serves and this key may do",
    dependencies=SECURED,
    responses=ERRORS,
)
def capabilities(request: Request, api: Annotated[ApiService, Depends(service)]) -> Capabilities:
    principal = request.scope.get("state", {}).get("principal")
    scopes = sorted(principal.scopes) if isinstance(principal, Principal) else []
    cameras = principal.cameras.cameras if isinstance(principal, Principal) else frozenset()
    return Capabilities(
        semantic_search=api.embedder is not None,
        max_page_size=api.settings.api_max_page_size,
        scopes=scopes,
        cameras=None if cameras is None else sorted(cameras),
    )
