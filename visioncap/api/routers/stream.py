"""/v1/stream: server-sent events of captions as they are stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import StreamingResponse

from visioncap.api.errors import ApiError
from visioncap.api.routers.common import ERRORS, SECURED, service
from visioncap.api.serving import ApiService, cameras_param

router = APIRouter(prefix="/v1/stream", tags=["stream"], dependencies=SECURED, responses=ERRORS)


@router.get(
    "",
    summary="Live captions (server-sent events)",
    description="`text/event-stream`: one `event: caption` (data: a Caption as JSON, id: its id) for every row "
    "captioned after the connection opened, in the order they were stored; comment lines keep idle "
    "connections open. The server polls the database every VISIONCAP_API_STREAM_POLL_S seconds.",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}, 503: {"description": "Too many open streams."}},
)
async def stream(
    request: Request,
    api: Annotated[ApiService, Depends(service)],
    camera: Annotated[list[str], Query(description="Camera id; repeat or separate with commas.")] = [],  # noqa: B006
    min_people: Annotated[int | None, Query(ge=0, le=10_000, description="At least this many people.")] = None,
) -> StreamingResponse:
    cameras = cameras_param(camera)
    if api.open_streams >= api.settings.api_max_streams:
        raise ApiError(503, f"{api.open_streams} streams already open; try again later")
    return StreamingResponse(
        api.stream(request, cameras, min_people),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
