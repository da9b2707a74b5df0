"""The REST API and web page over the caption database (`visioncap api`).

Laid out like the gateway: `app` (factory, middleware), `routers/` (one thin router per resource),
`protocol` (response models), `serving` (the request flow), `auth` (API keys and scopes), `images`,
`metrics`, `errors`, and `static/` (the captions browser served at /).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from visioncap.api.app import create_app, run_api

__all__ = ["create_app", "run_api"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from visioncap.api import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
