"""What the database can take: text made storable, and errors told apart by whether trying again can help."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

# A caption is a few sentences; a model that loops until max_tokens on multi-character tokens must not write
# megabytes into a row that every page of the API reads.
MAX_TEXT_CHARS = 16_000
MAX_ERROR_CHARS = 2_000

# PostgreSQL refuses NUL in text and lone surrogates cannot be encoded as UTF-8; the other C0/C1 controls
# (tab, line feed and carriage return excepted) are kept out too, since they garble logs, pages and terminals.
_UNSTORABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def clean_text(value: str, limit: int = MAX_TEXT_CHARS) -> str:
    """`value` without characters a database or a reader cannot take, cut to `limit` characters."""
    cleaned = _UNSTORABLE.sub("", value)
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def clean_json(value: Any) -> Any:
    """A JSON-like value with every string (keys too) passed through `clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(key)): clean_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(item) for item in value]
    return value


def is_unavailable(exc: BaseException) -> bool:
    """True when the database could not take a statement for now (down, restarting, unreachable, locked, out of
    space), so the same write may succeed later; False when this write can never succeed (bad data, a constraint,
    a bug), so retrying it would only loop."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, OperationalError | InterfaceError | DisconnectionError | PoolTimeoutError)


def describe(exc: BaseException) -> str:
    """One storable line naming the error (SQLAlchemy's messages carry the statement and a link on more lines)."""
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return clean_text(f"{type(exc).__name__}: {first[0] if first else ''}", MAX_ERROR_CHARS)
