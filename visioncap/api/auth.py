"""API keys: every request but /healthz (and, by default, the data-free page and docs) needs one.

Keys come as `Authorization: Bearer KEY` or `X-Api-Key: KEY` and are looked up by SHA-256. GET and HEAD
need the `read` scope, and so does Ask (POST /v1/chat/completions, which only reads captions); every other
method needs `write`. Enforced in one ASGI middleware, so that no route,
present or future, can be left open by forgetting a dependency; the routers only declare the schemes for
the OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fastapi.security import APIKeyHeader, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from visioncap.api.errors import error_response
from visioncap.config.api import ApiKey
from visioncap.config.keys import hash_key

bearer_scheme = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")
header_scheme = APIKeyHeader(name="X-Api-Key", auto_error=False, description="X-Api-Key: KEY")

ALWAYS_PUBLIC = frozenset({"/healthz"})
# POST routes that change nothing: a key that may read may use them.
READ_POSTS = frozenset({"/v1/chat/completions"})
UI_PATHS = frozenset({"/", "/docs", "/docs/oauth2-redirect", "/openapi.json", "/favicon.ico"})


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scopes: frozenset[str]


class KeyRing:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._by_hash = {key.sha256.lower(): Principal(key.name, frozenset(key.scopes)) for key in keys}

    def identify(self, key: str) -> Principal | None:
        return self._by_hash.get(hash_key(key))


def presented_key(headers: Headers) -> str | None:
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return headers.get("x-api-key") or None


class AuthMiddleware:
    def __init__(self, app: ASGIApp, keys: KeyRing, public_ui: bool) -> None:
        self.app = app
        self.keys = keys
        self.public_ui = public_ui

    def _public(self, path: str) -> bool:
        if path in ALWAYS_PUBLIC:
            return True
        return self.public_ui and (path in UI_PATHS or path.startswith("/static/"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._public(scope["path"]):
            await self.app(scope, receive, send)
            return
        key = presented_key(Headers(scope=scope))
        principal = self.keys.identify(key) if key else None
        if principal is None:
            response = error_response(
                401,
                "missing or unknown API key (send Authorization: Bearer KEY or X-Api-Key: KEY)",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await response(scope, receive, send)
            return
        reads = scope["method"] in ("GET", "HEAD") or (scope["method"] == "POST" and scope["path"] in READ_POSTS)
        needed = "read" if reads else "write"
        if needed not in principal.scopes:
            await error_response(403, f"this API key lacks the {needed!r} scope")(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)
