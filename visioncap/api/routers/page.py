"""The web app at /: a static page (ES modules under /static/) that calls the API with the key the user enters;
its views live in the address fragment (#/captions/ID, ...), so every path here is `/`."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import FileResponse

from visioncap.api.serving import static_dir

router = APIRouter(include_in_schema=False)


@router.get("/")
async def index() -> FileResponse:
    return FileResponse(static_dir() / "index.html", headers={"Cache-Control": "no-cache"})
