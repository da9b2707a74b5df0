"""Whether the API may be served on an address with its configured keys: checked before the web stack is
imported, so a refused `visioncap api` exits at once, and again by `build_api` for anything else that serves it."""

from __future__ import annotations

from visioncap.config.api import ApiSettings
from visioncap.demo_keys import refuse_demo_keys


def check_api_can_serve(settings: ApiSettings, host: str) -> None:
    """A ConfigError, before anything is opened, when a configured key is a published demo key and `host` is
    reachable from other machines."""
    refuse_demo_keys(
        host,
        ((key.name, key.sha256) for key in settings.api_keys),
        "VISIONCAP_API_KEYS",
        "make your own with `visioncap api-key` and put its entry in VISIONCAP_API_KEYS",
    )
