"""/v1/cameras: each camera's configuration and reported state merged with its stored rows; adding, changing
and removing cameras (the `write` scope), which running workers pick up within seconds."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from visioncap.api.auth import CameraScope, camera_scope
from visioncap.api.errors import bad_param
from visioncap.api.protocol import CameraList, CameraSettings, ErrorResponse
from visioncap.api.routers.common import BAD_BODY, ERRORS, SECURED, Responses, SharedPathRoute, service
from visioncap.api.serving import ApiService
from visioncap.config.cameras import CameraChange, SubmittedCamera
from visioncap.config.sources import CAMERA_ID_PATTERN

router = APIRouter(
    prefix="/v1/cameras", tags=["cameras"], dependencies=SECURED, responses=ERRORS, route_class=SharedPathRoute
)

CameraId = Annotated[str, Path(pattern=CAMERA_ID_PATTERN, description="Camera id.", examples=["door"])]
NOT_FOUND: Responses = {404: {"model": ErrorResponse, "description": "No camera with this id is configured."}}
SECRETS = (
    " URLs may not hold a password or credential parameter inline (422): reference it as "
    "${VISIONCAP_CAMERA_SECRET_NAME}, an environment variable of the worker resolved only when it opens the camera, "
    "as the whole password (user:${...}@) or the whole value of a credential parameter; a reference anywhere else "
    "or to another variable is refused (422)."
)
# What the body's schema cannot say: the source is checked as a pipeline file's would be, the overrides against
# the pipeline's own settings.
CHECKS = (
    " Besides the schema, 422 naming the field: `source.kind` must be a network camera's, rtsp or http (file, "
    "folder and webcam sources come from a pipeline file only); `source.url` must be a camera URL (scheme, host, "
    "port) without inline secrets, at a host VISIONCAP_CAMERA_ALLOWED_HOSTS allows when it is set; `selection` and "
    "`caption` hold settings of the pipeline's selection and image settings (`caption`: only those per camera)."
)


@router.get(
    "",
    response_model=CameraList,
    summary="Cameras: configuration, state, newest frame, events and captions",
    description="Every camera configured (its settings, URL masked), reported by a pipeline (its state and newest "
    "analysed frame, written on each state change and every few seconds while frames arrive) or that has stored "
    "rows, merged by camera id.",
)
def list_cameras(
    api: Annotated[ApiService, Depends(service)], scope: Annotated[CameraScope, Depends(camera_scope)]
) -> CameraList:
    return api.cameras(scope)


@router.post(
    "",
    response_model=CameraSettings,
    status_code=201,
    summary="Add a camera",
    description="The worker of `pipeline` starts it within 5 s. Needs the `write` scope; 409 when the id is taken; "
    "403 for a key limited to other cameras (it may add only cameras of its own `cameras` list)." + SECRETS + CHECKS,
    responses={
        **BAD_BODY,
        403: {"model": ErrorResponse, "description": "The key lacks the write scope, or may not add this camera."},
        409: {"model": ErrorResponse, "description": "A camera with this id is configured."},
    },
)
def add_camera(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    camera: SubmittedCamera,
) -> CameraSettings:
    _check_host(api, getattr(camera.source, "url", None))
    return api.add_camera(camera, scope)


@router.patch(
    "/{camera}",
    response_model=CameraSettings,
    summary="Change a camera",
    description="Fields left out keep their value; `source` fields are merged into the stored source. The worker "
    "restarts this camera alone within 5 s (pausing stops it, resuming starts it). Needs the `write` scope."
    + SECRETS
    + CHECKS
    + " The merged camera is checked as a whole: `source` fields must be fields of its kind (422 naming them).",
    responses={
        **BAD_BODY,
        **NOT_FOUND,
        409: {"model": ErrorResponse, "description": "Changed by someone else meanwhile."},
    },
)
def change_camera(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    camera: CameraId,
    change: CameraChange,
) -> CameraSettings:
    _check_host(api, (change.source or {}).get("url"))
    return api.change_camera(camera, change, scope)


@router.delete(
    "/{camera}",
    status_code=204,
    summary="Remove a camera",
    description="The worker stops it within 5 s; its captions (pending ones are still captioned) and its reported "
    "state stay. A pipeline file's camera comes back at the next `visioncap run` unless the file drops it. Needs "
    "the `write` scope.",
    responses=NOT_FOUND,
)
def remove_camera(
    api: Annotated[ApiService, Depends(service)], scope: Annotated[CameraScope, Depends(camera_scope)], camera: CameraId
) -> Response:
    api.remove_camera(camera, scope)
    return Response(status_code=204)


def _check_host(api: ApiService, url: object) -> None:
    """422 for a new camera URL whose host VISIONCAP_CAMERA_ALLOWED_HOSTS does not allow (the body's model cannot
    check it: the list is the server's setting)."""
    if isinstance(url, str) and (problem := api.settings.camera_hosts().url_problem(url)):
        raise bad_param("source.url", problem)
