"""/v1/captions: search, one caption, its image, regeneration."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BeforeValidator
from starlette.responses import Response

from visioncap.api import images
from visioncap.api.auth import CameraScope, camera_scope
from visioncap.api.protocol import Caption, CaptionPage, ErrorResponse, Regenerated
from visioncap.api.routers.common import ERRORS, NOT_FOUND, SECURED, service
from visioncap.api.serving import MAX_ID, ApiService
from visioncap.config.caption import MAX_DESCRIPTION_FRAMES
from visioncap.store.records import CaptionStatus

router = APIRouter(prefix="/v1/captions", tags=["captions"], dependencies=SECURED, responses=ERRORS)

CaptionId = Annotated[int, Path(ge=1, le=MAX_ID, description="Caption id.")]


def _not_a_number(value: object) -> object:
    """ISO 8601 only: pydantic would take a number as Unix seconds, which the document does not offer."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return value
        raise ValueError("an ISO 8601 date-time, not a number")
    return value


Time = Annotated[datetime | None, BeforeValidator(_not_a_number)]


@router.get(
    "",
    response_model=CaptionPage,
    summary="Search captions, newest first",
    description="Filters combine with AND. Every search does bounded work: filters no index serves (people, "
    "status, text combined with other filters) examine at most VISIONCAP_API_SEARCH_SCAN_ROWS rows per request, "
    "and a page that did not fill by then comes back with `partial: true` (fewer items, maybe none) and a "
    "`next_cursor` that continues the search. Follow `next_cursor` until it is null.",
    responses={
        503: {
            "model": ErrorResponse,
            "description": "The database is unavailable, or the search ran past VISIONCAP_API_SEARCH_TIMEOUT_S "
            "(type `search_timeout`); Retry-After says when to try again.",
        }
    },
)
def list_captions(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    camera: Annotated[list[str], Query(description="Camera id; repeat (or separate with commas) for several.")] = [],  # noqa: B006 (FastAPI copies defaults)
    since: Annotated[Time, Query(description="Captured at or after (ISO 8601; no offset means UTC).")] = None,
    until: Annotated[
        Time,
        Query(
            description="Captured before (ISO 8601; no offset means UTC). Must be after `since` when both are "
            "given: 422 naming `until` otherwise."
        ),
    ] = None,
    q: Annotated[
        str | None,
        Query(description="Free text over caption text: every word must match, the last also as a prefix."),
    ] = None,
    min_people: Annotated[int | None, Query(ge=0, le=10_000, description="At least this many people.")] = None,
    status: Annotated[list[CaptionStatus], Query(description="Only these statuses; repeat for several.")] = [],  # noqa: B006
    zone: Annotated[
        list[str],
        Query(
            description="Only frames with a person in this zone (any of several: repeat, or separate with commas); "
            "zone names as the selection config's `zones`."
        ),
    ] = [],  # noqa: B006
    min_dwell_s: Annotated[
        float | None,
        Query(
            ge=0,
            le=86_400,
            description="Only frames with a person who had been in a zone (one of `zone`, when given) at least "
            "this many seconds.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, description="Page size (at most VISIONCAP_API_MAX_PAGE_SIZE).")] = 50,
    cursor: Annotated[
        str | None, Query(description="`next_cursor` of the previous page (also of a partial one).")
    ] = None,
    semantic: Annotated[
        str | None,
        Query(
            description="Rank by meaning instead of newest first: the newest VISIONCAP_API_SEARCH_SCAN_ROWS rows "
            "of the camera and time range that meet the other filters, most similar first. Older rows: narrow "
            "`until`. 422 naming `q` when both are given, and naming `semantic` where VISIONCAP_API_SEMANTIC_SEARCH "
            "is off."
        ),
    ] = None,
    hybrid: Annotated[
        bool,
        Query(
            description="With `semantic`: fuse the meaning ranking with a words ranking of the same text (any word, "
            "BM25) by reciprocal rank fusion. 422 naming `hybrid` without a (non-blank) `semantic`."
        ),
    ] = False,
) -> Response:
    # The JSON is made from the rows directly (see caption_page_json); response_model still documents it.
    page = api.list_captions(
        camera, since, until, q, min_people, status, limit, cursor, semantic, hybrid, scope, zone, min_dwell_s
    )
    return Response(page, media_type="application/json")


@router.get("/{id}", response_model=Caption, summary="One caption", responses=NOT_FOUND)
def get_caption(
    api: Annotated[ApiService, Depends(service)], scope: Annotated[CameraScope, Depends(camera_scope)], id: CaptionId
) -> Caption:
    return Caption.of(api.row(id, scope))


@router.get(
    "/{id}/image",
    summary="The stored JPEG of a caption",
    response_class=Response,
    responses={
        200: {"content": {"image/jpeg": {}}, "description": "The JPEG the VLM saw."},
        304: {"description": "Not modified (If-None-Match)."},
        404: {
            "model": ErrorResponse,
            "description": "No such caption, or its image (or that frame) is no longer stored, or is not one.",
        },
        409: {
            "model": ErrorResponse,
            "description": "boxes=true but the row lacks the frame geometry, or the frame is not its main image.",
        },
        503: {
            "model": ErrorResponse,
            "description": f"The image store (its volume) kept every file read busy for {images.FILE_WAIT_S:g} s; "
            "Retry-After says when to try again.",
        },
    },
)
async def get_image(
    request: Request,
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    id: CaptionId,
    boxes: Annotated[
        bool, Query(description="Draw the detected people (green) and the camera's zones then (amber) on the image.")
    ] = False,
    frame: Annotated[
        int | None,
        Query(
            ge=0,
            lt=MAX_DESCRIPTION_FRAMES,
            description="An event description's frame (0 is the oldest; its `frames` list them) instead of its main "
            "image.",
        ),
    ] = None,
) -> Response:
    row = await anyio.to_thread.run_sync(api.row, id, scope)
    held = {tag.strip() for tag in request.headers.get("if-none-match", "").split(",")}
    # Off the event loop, in a bounded pool: a stalled volume must not freeze the other requests (images.py).
    stored, jpeg = await images.ImageFiles.of(request.app).run(images.fetch, api.data_dir, row, boxes, held, frame)
    headers = {
        "ETag": stored.etag,
        "Cache-Control": f"private, max-age={api.settings.api_image_max_age_s}",
    }
    if stored.etag in held:
        return Response(status_code=304, headers=headers)
    if boxes:
        jpeg = await anyio.to_thread.run_sync(images.with_boxes, row, jpeg)
    return Response(jpeg, media_type="image/jpeg", headers=headers)


@router.post(
    "/{id}/regenerate",
    response_model=Regenerated,
    status_code=202,
    summary="Caption this frame again",
    description="Puts the row back in the outbox as `pending` (caption, error and usage cleared). The pipeline "
    "captions it when it next loads pending rows: at the start of `visioncap run`, before new frames. "
    "Needs the `write` scope. 409 when the row is already pending or has no stored image.",
    responses={**NOT_FOUND, 409: {"model": ErrorResponse, "description": "Already pending, or no stored image."}},
)
def regenerate(
    api: Annotated[ApiService, Depends(service)], scope: Annotated[CameraScope, Depends(camera_scope)], id: CaptionId
) -> Regenerated:
    return api.regenerate(id, scope)
