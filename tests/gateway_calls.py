"""What the gateway tests send: a key's header, a chat request's body, a chat POST."""

from __future__ import annotations

from typing import Any

import httpx
from helpers import TINY_MODEL

from visioncap.gateway.in_thread import GatewayThread

TIMEOUT = 120  # seconds; only a bound on a broken test, never a measurement


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat_body(text: str = "describe the scene", max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": TINY_MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


def post_chat(gw: GatewayThread, key: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, headers={**auth(key), **headers}, timeout=TIMEOUT)
