"""Caption images: resolved from the row (never from a request path), optionally with the people boxed.

Every file call (resolve, stat, read) runs in a thread of its own bounded pool (`ImageFiles`), never on the event
loop: on a network volume (the Kubernetes overlay's NFS) one stalled stat would otherwise freeze every request,
SSE streams and Ask included, until the server answered.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import anyio
from fastapi import FastAPI
from PIL import Image, ImageDraw

from visioncap.api.errors import RETRY_AFTER_S, ApiError
from visioncap.store.records import CaptionRecord

BOX_COLOUR = (0, 255, 0)
ZONE_COLOUR = (255, 200, 0)  # zones in amber beside the people's green
# Image files read at once. A thread stuck in a stalled volume cannot be interrupted, so the bound keeps such
# threads to this many, apart from the default pool that every sync route and database call needs.
FILE_THREADS = 8
# How long a request waits for one of them before 503: all busy this long means the volume is not answering.
FILE_WAIT_S = 10.0
# What Pillow raises for a file it cannot decode: not an image, truncated, corrupt, or a pixel bomb.
UNREADABLE = (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError)


@dataclass(frozen=True, slots=True)
class StoredImage:
    path: Path
    etag: str


def stored_jpeg(data_dir: Path, image_path: str) -> Path | None:
    """A row's `image_path` as a JPEG file inside the data directory; None when it is not one, or is gone."""
    root = data_dir.resolve()
    path = (root / image_path).resolve()
    # A row written by something else must not make the API read outside the data directory.
    if not path.is_relative_to(root) or path.suffix.lower() not in (".jpg", ".jpeg") or not path.is_file():
        return None
    return path


def locate(data_dir: Path, row: CaptionRecord, boxes: bool, frame: int | None = None) -> StoredImage:
    """The row's JPEG inside the data directory (or, for an event description, one of its frames), and its ETag;
    404 when there is none, 409 for boxes on a frame they were not recorded for."""
    name = row.image_path
    if frame is not None:
        # `frames` is JSON of any shape in a row written by something else: an entry that is not the pipeline's
        # has no image, as the listing leaves it out.
        frames = row.frames if isinstance(row.frames, list) else []
        if frame >= len(frames):
            raise ApiError(404, f"caption {row.id} has {len(frames)} description frames; frame {frame} is not one")
        entry = frames[frame]
        path = entry.get("path") if isinstance(entry, dict) else None
        name = path if isinstance(path, str) else ""
        if boxes and name != row.image_path:
            raise ApiError(409, f"caption {row.id}: boxes are recorded for its main image only", param="boxes")
    if not name:
        raise ApiError(404, f"caption {row.id} has no stored image (status {row.status})")
    path = stored_jpeg(data_dir, name)
    if path is None:
        raise ApiError(404, f"the image of caption {row.id} is no longer stored")
    stat = path.stat()
    tag = hashlib.sha256(f"{row.id}:{path.name}:{stat.st_size}:{stat.st_mtime_ns}:{boxes}".encode()).hexdigest()
    return StoredImage(path, f'"{tag[:32]}"')


def fetch(
    data_dir: Path, row: CaptionRecord, boxes: bool, if_none_match: Collection[str], frame: int | None = None
) -> tuple[StoredImage, bytes]:
    """`locate`, then the file's bytes (none when the client holds this version): the file calls of one request,
    made in one thread."""
    stored = locate(data_dir, row, boxes, frame)
    return stored, b"" if stored.etag in if_none_match else stored.path.read_bytes()


T = TypeVar("T")


class ImageFiles:
    """The bounded pool the image files are read in (FILE_THREADS threads; FILE_WAIT_S, then 503, for one)."""

    def __init__(self, threads: int = FILE_THREADS, wait_s: float = FILE_WAIT_S) -> None:
        self._slots = anyio.CapacityLimiter(threads)
        # to_thread's own limiter: never waited on (the slots gate it), but it keeps these threads off the default
        # pool's tokens, which a stalled volume would otherwise take from the sync routes.
        self._threads = anyio.CapacityLimiter(threads)
        self.wait_s = wait_s

    @classmethod
    def of(cls, app: FastAPI) -> ImageFiles:
        """The app's pool, made on first use inside its event loop."""
        files = getattr(app.state, "image_files", None)
        if files is None:
            files = app.state.image_files = cls()
        return files

    async def run(self, call: Callable[..., T], *args: object) -> T:
        with anyio.move_on_after(self.wait_s) as waiting:
            await self._slots.acquire()
        if waiting.cancelled_caught:
            raise ApiError(
                503,
                f"the image store has not answered for {self.wait_s:g} s; try again shortly",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        try:
            return await anyio.to_thread.run_sync(call, *args, limiter=self._threads)
        finally:
            self._slots.release()


def with_boxes(row: CaptionRecord, jpeg: bytes) -> bytes:
    """The JPEG with the row's people (and the camera's zones then) drawn; 409 when the row lacks the frame geometry
    to place them."""
    if row.frame_width is None or row.frame_height is None:
        raise ApiError(409, f"caption {row.id} has no recorded frame size, so its boxes cannot be drawn", param="boxes")
    x0, y0, x1, y1 = row.image_region or (0, 0, row.frame_width, row.frame_height)
    try:
        image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    except UNREADABLE as exc:
        # The file is what was stored (served as is without boxes); drawing needs it decoded.
        raise ApiError(
            422, f"the stored image of caption {row.id} cannot be decoded, so its boxes cannot be drawn", param="boxes"
        ) from exc
    sx = image.width / max(1, x1 - x0)
    sy = image.height / max(1, y1 - y0)
    draw = ImageDraw.Draw(image)
    width = max(2, round(min(image.size) / 200))
    for person in row.people:
        box = [
            (person["x1"] - x0) * sx,
            (person["y1"] - y0) * sy,
            (person["x2"] - x0) * sx,
            (person["y2"] - y0) * sy,
        ]
        draw.rectangle(box, outline=BOX_COLOUR, width=width)
    # The camera's zones when the frame was taken (normalised to the frame), named at their first corner.
    for name, points in (row.zone_shapes or {}).items():
        corners = [((x * row.frame_width - x0) * sx, (y * row.frame_height - y0) * sy) for x, y in points]
        draw.line([*corners, corners[0]], fill=ZONE_COLOUR, width=width)
        draw.text((corners[0][0] + 2 * width, corners[0][1] + width), str(name), fill=ZONE_COLOUR)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()
