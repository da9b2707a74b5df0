"""API keys, one way for the REST API and the gateway: only a key's SHA-256 is ever stored or configured."""

from __future__ import annotations

import hashlib
import secrets


def hash_key(key: str) -> str:
    """The hex SHA-256 stored for an API key (the key itself is never stored)."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def generate_key(prefix: str) -> tuple[str, str]:
    """A new random key starting with `prefix` (which says what it is for) and its SHA-256."""
    key = prefix + secrets.token_urlsafe(24)
    return key, hash_key(key)
