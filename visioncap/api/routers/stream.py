"""/v1/stream: server-sent events of captions as they are stored."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from visioncap.api.auth import CameraScope, camera_scope
from visioncap.api.errors import RETRY_AFTER_S, ApiError
from visioncap.api.routers.common import ERRORS, SECURED, ClosingStreamingResponse, service
from visioncap.api.serving import ApiService, StreamSlot, cameras_param

router = APIRouter(prefix="/v1/stream", tags=["stream"], dependencies=SECURED, responses=ERRORS)


class _SlotResponse(ClosingStreamingResponse):
    """Gives the stream's slot back when the response ends: finished, failed, or its client gone."""

    def __init__(self, content: AsyncGenerator[str, None], slot: StreamSlot) -> None:
        super().__init__(content)
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()


@router.get(
    "",
    summary="Live captions (server-sent events)",
    description="`text/event-stream`: one `event: caption` (data: a Caption as JSON) for every row captioned after "
    "the connection opened, each time it is captioned (a caption generated again comes again), each exactly once "
    "however many arrive at a time, in the order they were written (on PostgreSQL: transaction by transaction, in "
    "the order the transactions began writing; one still open holds back those after it). Every event has an "
    "`id:`, an opaque position (the first block, sent on connecting, has one too); reconnecting with that id in a "
    "`Last-Event-ID` header (what a browser's EventSource does by itself) resumes right after it, with nothing "
    "missed and nothing repeated. Comment lines keep idle connections open (they may carry an `id:` as well: the "
    "position past the rows the filters left out). The server polls the database every "
    "VISIONCAP_API_STREAM_POLL_S seconds; at most VISIONCAP_API_MAX_STREAMS streams are open at once, more get "
    "503 with Retry-After.",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/event-stream": {}}},
        503: {"description": "Too many open streams, or the database is unavailable."},
    },
)
async def stream(
    request: Request,
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    camera: Annotated[list[str], Query(description="Camera id; repeat or separate with commas.")] = [],  # noqa: B006
    min_people: Annotated[int | None, Query(ge=0, le=10_000, description="At least this many people.")] = None,
    last_event_id: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            max_length=64,
            description="The `id:` of the last event received: resume right after it instead of from now.",
        ),
    ] = None,
) -> StreamingResponse:
    cameras = scope.narrow(cameras_param(camera))
    slot = api.reserve_stream()  # before any await, so the cap holds for requests that arrive together
    if slot is None:
        raise ApiError(
            503,
            f"{api.settings.api_max_streams} streams already open; try again later",
            headers={"Retry-After": RETRY_AFTER_S},
        )
    try:
        start = await api.stream_start(last_event_id)
    except BaseException:
        slot.release()
        raise
    return _SlotResponse(api.stream(request, start, cameras, min_people), slot)
