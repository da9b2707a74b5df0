"""/v1/cameras: each camera's configuration and reported state merged with its stored rows; adding, changing
and removing cameras (the `write` scope), which running workers pick up within seconds."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from visioncap.api.protocol import CameraList, CameraSettings, ErrorResponse
from visioncap.api.routers.common import BAD_BODY, ERRORS, SECURED, SharedPathRoute, service
from visioncap.api.serving import ApiService
from visioncap.config.cameras import CameraChange, SubmittedCamera
from visioncap.config.sources import CAMERA_ID_PATTERN

router = APIRouter(
    prefix="/v1/cameras", tags=["cameras"], dependencies=SECURED, responses=ERRORS, route_class=SharedPathRoute
)

CameraId = Annotated[str, Path(pattern=CAMERA_ID_PATTERN, description="Camera id.")]
NOT_FOUND = {404: {"model": ErrorResponse, "description": "No camera with this id is configured."}}
SECRETS = (
    " URLs may not hold a password or credential parameter inline (422): reference it as ${NAME}, an environment "
    "variable of the worker, resolved only when it opens the camera."
)
# What the body's schema cannot say: the source is checked as a pipeline file's would be, the overrides against
# the pipeline's own settings.
CHECKS = (
    " Besides the schema, 422 naming the field: `source.path` must be absolute and not blank (the worker opens "
    "it); `source.url` must be a camera URL (scheme, host, port) without inline secrets; `selection` and "
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
def list_cameras(api: Annotated[ApiService, Depends(service)]) -> CameraList:
    return api.cameras()


@router.post(
    "",
    response_model=CameraSettings,
    status_code=201,
    summary="Add a camera",
    description="The worker of `pipeline` starts it within 5 s. Needs the `write` scope; 409 when the id is taken."
    + SECRETS
    + CHECKS,
    responses={**BAD_BODY, 409: {"model": ErrorResponse, "description": "A camera with this id is configured."}},
)
def add_camera(api: Annotated[ApiService, Depends(service)], camera: SubmittedCamera) -> CameraSettings:
    return api.add_camera(camera)


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
    api: Annotated[ApiService, Depends(service)], camera: CameraId, change: CameraChange
) -> CameraSettings:
    return api.change_camera(camera, change)


@router.delete(
    "/{camera}",
    status_code=204,
    summary="Remove a camera",
    description="The worker stops it within 5 s; its captions (pending ones are still captioned) and its reported "
    "state stay. A pipeline file's camera comes back at the next `visioncap run` unless the file drops it. Needs "
    "the `write` scope.",
    responses=NOT_FOUND,
)
def remove_camera(api: Annotated[ApiService, Depends(service)], camera: CameraId) -> Response:
    api.remove_camera(camera)
    return Response(status_code=204)
