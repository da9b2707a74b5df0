"""Page cursors: opaque to clients (base64url of compact JSON), and read back here alone.

A cursor comes from the client, so everything in it is checked as a parameter would be before it reaches SQL:
exactly a JSON object, its numbers integers (never JSON's true, which Python counts as 1) within the range of the
column they are compared with, its times ISO 8601 with an offset. Anything else is a 422 naming `cursor`.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from datetime import UTC, datetime
from typing import Any

from visioncap.api.errors import ApiError, bad_param
from visioncap.store.search import Position
from visioncap.store.semantic import RankedPosition

MAX_ID = 2**31 - 1  # INTEGER on PostgreSQL: caption and alert ids
MAX_CURSOR_LENGTH = 400  # characters; the longest this API makes (a semantic one) takes about 130
NOT_OURS = "not a cursor this API returned"
# An alert cursor predates the JSON ones: "a" and the last id of the page, in base64url.
_ALERT = re.compile(r"a([1-9][0-9]{0,9})")


def _encode(fields: dict[str, Any]) -> str:
    raw = json.dumps(fields, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _raw(cursor: str) -> bytes:
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise ValueError("too long")
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))


def _fields(cursor: str) -> dict[str, Any]:
    data = json.loads(_raw(cursor))
    if not isinstance(data, dict):
        raise ValueError("not an object")
    return data


def _whole(value: object, high: int) -> int:
    """`value` when it is an integer from 1 to `high`: not a boolean, float or string."""
    if type(value) is not int or not 1 <= value <= high:
        raise ValueError("not an id")
    return value


def _moment(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError("not a time")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError("no offset")
    return moment.astimezone(UTC)


def _refused(message: str) -> ApiError:
    return bad_param("cursor", message)


_MALFORMED = (binascii.Error, UnicodeDecodeError, ValueError, TypeError, KeyError, OverflowError, RecursionError)


def encode_cursor(position: Position) -> str:
    return _encode({"t": position.captured_at.isoformat(), "i": position.id})


def decode_cursor(cursor: str) -> Position:
    try:
        data = _fields(cursor)
        # A partial page's cursor sits just above the first row its search did not examine: at most MAX_ID + 1.
        return Position(_moment(data["t"]), _whole(data["i"], MAX_ID + 1))
    except _MALFORMED as exc:
        raise _refused(NOT_OURS) from exc


# -- semantic cursors: the window's top row and the (score, id) a page ended at (see store/semantic.py) --


def encode_ranked_cursor(position: RankedPosition) -> str:
    top = {"t": position.top.captured_at.isoformat(), "i": position.top.id}
    return _encode({"w": top, "s": position.score, "i": position.id})


def decode_ranked_cursor(cursor: str) -> RankedPosition:
    try:
        data = _fields(cursor)
        window = data["w"]
        if not isinstance(window, dict):
            raise ValueError("not an object")
        score = data["s"]
        # json reads NaN and Infinity; no page ends at one
        if type(score) not in (int, float) or not math.isfinite(score):
            raise ValueError("not a score")
        top = Position(_moment(window["t"]), _whole(window["i"], MAX_ID))
        return RankedPosition(top, float(score), _whole(data["i"], MAX_ID))
    except _MALFORMED as exc:
        raise _refused(f"{NOT_OURS} for this kind of search") from exc


# -- alert cursors: the id of a page's last alert --


def encode_alert_cursor(alert_id: int) -> str:
    return base64.urlsafe_b64encode(f"a{alert_id}".encode()).decode().rstrip("=")


def decode_alert_cursor(cursor: str) -> int:
    try:
        match = _ALERT.fullmatch(_raw(cursor).decode("ascii"))
        if match is None:
            raise ValueError("not an alert cursor")
        return _whole(int(match[1]), MAX_ID + 1)
    except _MALFORMED as exc:
        raise _refused(NOT_OURS) from exc
