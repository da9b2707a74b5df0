"""API keys: every request but /healthz (and, by default, the data-free page and docs) needs one.

Keys come as `Authorization: Bearer KEY` or `X-Api-Key: KEY` and are looked up by SHA-256. GET and HEAD
need the `read` scope, and so does Ask (POST /v1/chat/completions, which only reads captions); every other
method needs `write`. Enforced in one ASGI middleware, so that no route,
present or future, can be left open by forgetting a dependency; the routers only declare the schemes for
the OpenAPI document.

A key may be limited to some cameras (`cameras` of ApiKey): the routes take its `CameraScope` (`camera_scope`)
and put it into their queries, so that pages stay full and cursors right, and another camera's row is as
unknown as an id that does not exist.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fastapi import Request
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
class CameraScope:
    """The cameras a key may see; `cameras` None: every camera."""

    cameras: frozenset[str] | None = None

    @property
    def limited(self) -> bool:
        return self.cameras is not None

    def sees(self, camera: str) -> bool:
        return self.cameras is None or camera in self.cameras

    def covers(self, cameras: Sequence[str]) -> bool:
        """Whether everything about these cameras is the key's: an empty list (every camera) is only an unlimited
        key's."""
        return self.cameras is None or (bool(cameras) and all(camera in self.cameras for camera in cameras))

    def narrow(self, requested: Sequence[str]) -> list[str] | None:
        """The camera filter of a query that asked for `requested` (empty: every camera) as this key may see it:
        empty for every camera (an unlimited key only), None when it may see none of them. A camera it may not see
        is left out as a camera that does not exist would find nothing."""
        if self.cameras is None:
            return list(requested)
        visible = [camera for camera in requested if camera in self.cameras] if requested else sorted(self.cameras)
        return visible or None


EVERY_CAMERA = CameraScope()
NO_CAMERA = CameraScope(frozenset())


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scopes: frozenset[str]
    cameras: CameraScope = EVERY_CAMERA


def _principal(key: ApiKey) -> Principal:
    cameras = EVERY_CAMERA if key.cameras is None else CameraScope(frozenset(key.cameras))
    return Principal(key.name, frozenset(key.scopes), cameras)


def camera_scope(request: Request) -> CameraScope:
    """The cameras the request's key may see (a route dependency). No key known (a public route): none."""
    principal = request.scope.get("state", {}).get("principal")
    return principal.cameras if isinstance(principal, Principal) else NO_CAMERA


class KeyRing:
    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._by_hash = {key.sha256.lower(): _principal(key) for key in keys}

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
