"""Media in chat messages: refuse URLs vLLM should not fetch, estimate image tokens from data: URIs.

vLLM fetches any http(s) media URL a message names (a server-side request forgery risk), so only data: URIs
pass unless the URL's host is allow-listed. Image tokens are estimated the way Qwen2-VL's processor resizes:
each side rounded to a multiple of the token size, the area kept between the model's min and max pixels,
one token per `token_size` x `token_size` square. Only the image header is decoded (PIL reads the size
without the pixels), from the first bytes of the base64 payload.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes, urlsplit

from PIL import Image

from visioncap.config.gateway import ImagesConfig
from visioncap.qwen_images import smart_resize

# Base64 characters decoded to find the image size (54 KiB of image: JPEG headers with EXIF fit).
HEADER_CHARS = 72 * 1024
# Part types whose URL vLLM turns into an image.
IMAGE_PART_TYPES = {"image_url", "input_image"}


class MediaRefusedError(Exception):
    """A media URL that the gateway will not forward."""


class ImageTooLargeError(MediaRefusedError):
    """An inline image with far more pixels than the model takes."""


def image_tokens(width: int, height: int, config: ImagesConfig) -> int:
    """Image tokens for an image of this size, as the Qwen-VL processor counts them."""
    factor = config.token_size
    h_bar, w_bar = smart_resize(
        height, width, factor, config.min_tokens_per_image * factor**2, config.max_tokens_per_image * factor**2
    )
    return (h_bar // factor) * (w_bar // factor)


def max_pixels(config: ImagesConfig) -> int:
    """The most pixels an inline image may have (the model's largest image times the margin)."""
    return int(config.max_tokens_per_image * config.token_size**2 * config.max_pixels_margin)


def data_uri_size(uri: str) -> tuple[int, int] | None:
    """(width, height) of the image in a data: URI, decoding only its header; None when unreadable."""
    header, sep, payload = uri.partition(",")
    if not sep:
        return None
    if header.endswith(";base64"):
        candidates = [payload[: HEADER_CHARS - HEADER_CHARS % 4], payload] if len(payload) > HEADER_CHARS else [payload]
        for chunk in candidates:
            try:
                data = base64.b64decode(chunk)
            except (binascii.Error, ValueError):
                continue
            size = _size(data)
            if size is not None:
                return size
        return None
    return _size(unquote_to_bytes(payload))


def _size(data: bytes) -> tuple[int, int] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # judged below, against the model
            with Image.open(io.BytesIO(data)) as image:
                return image.size
    except Image.DecompressionBombError as exc:
        # Above PIL's own limit (twice Image.MAX_IMAGE_PIXELS): far beyond any model's largest image.
        raise ImageTooLargeError(f"image refused: {exc}") from exc
    except Exception:  # truncated or not an image: PIL raises many kinds
        return None


def _urls(value: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """(key, url) for every string under a `url` or `*_url` key, at any depth of a content part."""
    if isinstance(value, dict):
        for child_key, child in value.items():
            yield from _urls(child, str(child_key))
    elif isinstance(value, list):
        for child in value:
            yield from _urls(child, key)
    elif isinstance(value, str) and (key == "url" or key.endswith("_url")):
        yield key, value


def check_url(url: str, config: ImagesConfig) -> bool:
    """True for a data: URI; for http(s) URLs, whether the host is allow-listed. Raises for the rest."""
    if url[:5].lower() == "data:":
        return True
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme.lower() in ("http", "https") and host and host in config.allowed_hosts:
        return False
    shown = url if len(url) <= 80 else url[:77] + "..."
    if parts.scheme.lower() in ("http", "https"):
        raise MediaRefusedError(
            f"media URL {shown!r} refused: host {host!r} is not allowed; send the image as a data: URI"
        )
    raise MediaRefusedError(f"media URL {shown!r} refused: only data: URIs (and allow-listed http(s) hosts) pass")


def _kind(part: dict[str, Any]) -> str | None:
    """The part's `type`, "" when it is not a string: a caller may send any JSON value there (a dict would not even
    hash for the set lookups below)."""
    kind = part.get("type")
    return kind if kind is None or isinstance(kind, str) else ""


@dataclass(frozen=True, slots=True)
class MediaCost:
    """What a request's images cost: their estimated tokens, and how many there are (an event described from
    several frames sends several; each is a vision encoder pass of its own)."""

    tokens: int = 0
    images: int = 0

    def __add__(self, other: MediaCost) -> MediaCost:
        return MediaCost(self.tokens + other.tokens, self.images + other.images)


def inspect_messages(messages: Any, config: ImagesConfig) -> MediaCost:
    """Check every media URL in chat messages and return the estimated image tokens of the request."""
    total = MediaCost()
    if not isinstance(messages, list):
        return total
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = _kind(part)
            is_image = kind in IMAGE_PART_TYPES or (kind is None and "image_url" in part)
            for _key, url in _urls(part):
                inline = check_url(url, config)
                if not is_image:
                    continue
                size = data_uri_size(url) if inline else None
                if size is not None and size[0] * size[1] > max_pixels(config):
                    raise ImageTooLargeError(
                        f"image of {size[0]}x{size[1]} pixels refused: more than {config.max_pixels_margin:g} x the "
                        f"largest image the model takes ({max_pixels(config) // 1_000_000} megapixels at most here)"
                    )
                if size is None:
                    total += MediaCost(config.max_tokens_per_image, 1)  # unknown size: the largest the model takes
                else:
                    total += MediaCost(image_tokens(size[0], size[1], config), 1)
    return total


# The request fields that can carry media, on every route the gateway forwards: chat's `messages` (also read by vLLM's
# /tokenize and its embeddings of a conversation) and the Responses API's `input` items.
MEDIA_FIELDS = ("messages", "input")


def inspect_media(body: dict[str, Any], config: ImagesConfig) -> MediaCost:
    """The one media check of every route: each URL anywhere under a media field is checked (vLLM fetches media
    from parts of several shapes, and from routes that do not generate), and the image parts' tokens are summed."""
    total = MediaCost()
    for field in MEDIA_FIELDS:
        value = body.get(field)
        if not isinstance(value, list):
            continue  # text, or token ids: no media
        for _key, url in _urls(value):
            check_url(url, config)
        # An input item may be an image part itself (the Responses API's shorthand), or hold its parts in `content`.
        total += inspect_messages([{"content": value}], config)
        total += inspect_messages(value, config)
    return total


def _decode_data_uri(uri: str) -> bytes | None:
    header, sep, payload = uri.partition(",")
    if not sep:
        return None
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload)
        except (binascii.Error, ValueError):
            return None
    return unquote_to_bytes(payload)


def fit_image(data: bytes, max_tokens: int, config: ImagesConfig, quality: int = 85) -> tuple[bytes, int] | None:
    """The image re-encoded as a JPEG whose estimated tokens are at most `max_tokens`; None when it fits already
    or cannot be read (then it is sent as it is and vLLM judges it)."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if image_tokens(width, height, config) <= max_tokens:
                return None
            factor = config.token_size
            scale = math.sqrt(max_tokens * factor * factor / (width * height))
            while True:
                size = (max(1, int(width * scale)), max(1, int(height * scale)))
                tokens = image_tokens(size[0], size[1], config)
                if tokens <= max_tokens or scale < 1e-3:
                    break
                scale *= 0.95
            # A JPEG is decoded at a reduced scale (1/2 to 1/8, still at least the target size): less memory and
            # time than decoding every pixel only to throw most of them away.
            image.draft("RGB", size)
            smaller = image.convert("RGB").resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    except Exception:  # not an image PIL can decode: PIL raises many kinds
        return None
    out = io.BytesIO()
    smaller.save(out, format="JPEG", quality=quality)
    return out.getvalue(), tokens


def downscale_messages(messages: Any, max_tokens: int, config: ImagesConfig) -> int:
    """Shrink every inline image of `messages` (changed in place) above `max_tokens` tokens to fit; returns how
    many images were shrunk. The caller sends the changed body; the image's aspect ratio is kept."""
    shrunk = 0
    if not isinstance(messages, list):
        return 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or _kind(part) not in IMAGE_PART_TYPES | {None}:
                continue
            holder = part.get("image_url")
            if isinstance(holder, dict) and isinstance(holder.get("url"), str):
                key, url = "url", holder["url"]
            elif isinstance(holder, str):
                holder, key, url = part, "image_url", holder
            else:
                continue
            if url[:5].lower() != "data:":
                continue
            data = _decode_data_uri(url)
            fitted = None if data is None else fit_image(data, max_tokens, config)
            if fitted is None:
                continue
            holder[key] = "data:image/jpeg;base64," + base64.b64encode(fitted[0]).decode("ascii")
            shrunk += 1
    return shrunk
