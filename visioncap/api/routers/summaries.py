"""/v1/summaries: summaries of a window of captions written by the VLM (see visioncap/api/summaries.py)."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Depends, Query, Request

from visioncap.api.auth import CameraScope, camera_scope
from visioncap.api.routers.common import BAD_BODY, ERRORS, SECURED, SharedPathRoute, service
from visioncap.api.serving import MAX_CAMERA_LENGTH, ApiService, checked_names
from visioncap.api.summaries import Summaries
from visioncap.api.summaries_protocol import SummaryList, SummaryRequest, SummaryView

# GET and POST share the path: the 405 of another method names both (SharedPathRoute).
router = APIRouter(
    prefix="/v1/summaries", tags=["summaries"], dependencies=SECURED, responses=ERRORS, route_class=SharedPathRoute
)


def summaries(request: Request, api: Annotated[ApiService, Depends(service)]) -> Summaries:
    state = request.app.state
    if getattr(state, "summaries", None) is None:
        state.summaries = Summaries(api.settings, api.engine, state.alerts_config)
    return cast(Summaries, state.summaries)


@router.post(
    "",
    response_model=SummaryView,
    status_code=201,
    summary="Summarise a window of captions (write scope)",
    description="The VLM reads the window's captions (in parts, then the parts' summaries, when they exceed its "
    "context) and writes a summary citing caption ids; it is stored, listed by GET, and sent to the alerts "
    "file's MQTT broker and webhooks. 422 naming `end` when it is not after `start`, or the window is longer than "
    "VISIONCAP_SUMMARIES_MAX_WINDOW_S or than the context can summarise; 503 while no model is set "
    "(VISIONCAP_SUMMARIES_MODEL or VISIONCAP_ASK_MODEL) or the VLM cannot write it.",
    responses=BAD_BODY,
)
def create_summary(
    body: SummaryRequest,
    scope: Annotated[CameraScope, Depends(camera_scope)],
    writer: Annotated[Summaries, Depends(summaries)],
) -> SummaryView:
    return writer.create(body, scope)


@router.get("", response_model=SummaryList, summary="Stored summaries and digests, newest first")
def list_summaries(
    scope: Annotated[CameraScope, Depends(camera_scope)],
    writer: Annotated[Summaries, Depends(summaries)],
    camera: Annotated[
        str | None, Query(max_length=MAX_CAMERA_LENGTH, description="Only summaries covering this camera.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200, description="Most summaries returned.")] = 50,
) -> SummaryList:
    if camera is not None:
        checked_names([camera], "camera", 1, MAX_CAMERA_LENGTH)
    return writer.list(camera, limit, scope)
