"""The captions browser at /: a static page that calls the API with the key the user enters."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import FileResponse

from visioncap.api.serving import static_dir

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(static_dir() / "index.html", headers={"Cache-Control": "no-cache"})
