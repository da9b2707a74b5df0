"""/v1/cameras: what the database knows of each camera."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from visioncap.api.protocol import CameraList
from visioncap.api.routers.common import ERRORS, SECURED, service
from visioncap.api.serving import ApiService

router = APIRouter(prefix="/v1/cameras", tags=["cameras"], dependencies=SECURED, responses=ERRORS)


@router.get("", response_model=CameraList, summary="Cameras with stored rows")
def list_cameras(api: Annotated[ApiService, Depends(service)]) -> CameraList:
    return api.cameras()
