"""/v1/cameras: each camera's reported state merged with its stored rows."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from visioncap.api.protocol import CameraList
from visioncap.api.routers.common import ERRORS, SECURED, service
from visioncap.api.serving import ApiService

router = APIRouter(prefix="/v1/cameras", tags=["cameras"], dependencies=SECURED, responses=ERRORS)


@router.get(
    "",
    response_model=CameraList,
    summary="Cameras: state, newest frame, events and captions",
    description="Every camera a pipeline has reported (its state and newest analysed frame, written on each "
    "state change and every few seconds while frames arrive) or that has stored rows, merged by camera id.",
)
def list_cameras(api: Annotated[ApiService, Depends(service)]) -> CameraList:
    return api.cameras()
