"""Caption images: resolved from the row (never from a request path), optionally with the people boxed."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

from PIL import Image, ImageDraw

from visioncap.api.errors import ApiError
from visioncap.store.records import CaptionRecord

BOX_COLOUR = (0, 255, 0)


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


def locate(data_dir: Path, row: CaptionRecord, boxes: bool) -> StoredImage:
    """The row's JPEG inside the data directory, and its ETag; 404 when there is none."""
    if not row.image_path:
        raise ApiError(404, f"caption {row.id} has no stored image (status {row.status})")
    path = stored_jpeg(data_dir, row.image_path)
    if path is None:
        raise ApiError(404, f"the image of caption {row.id} is no longer stored")
    stat = path.stat()
    tag = hashlib.sha256(f"{row.id}:{path.name}:{stat.st_size}:{stat.st_mtime_ns}:{boxes}".encode()).hexdigest()
    return StoredImage(path, f'"{tag[:32]}"')


def with_boxes(row: CaptionRecord, jpeg: bytes) -> bytes:
    """The JPEG with the row's people drawn; 409 when the row lacks the frame geometry to place them."""
    if row.frame_width is None or row.frame_height is None:
        raise ApiError(409, f"caption {row.id} has no recorded frame size, so its boxes cannot be drawn", param="boxes")
    x0, y0, x1, y1 = row.image_region or (0, 0, row.frame_width, row.frame_height)
    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
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
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()
