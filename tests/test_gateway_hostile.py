"""Hostile or abusive requests get a clear 4xx from the real gateway (never a 500), counted as rejections.

None of these reach vLLM, so the gateway here fronts an address where nothing listens: a request that got
through would come back 502, not the 4xx asserted.
"""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from visioncap.config.gateway import GatewayConfig, ImagesConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.images import inspect_messages
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import free_port

CHAT_KEY = "hostile-chat-key"
CAMERA_KEY = "hostile-camera-key"
PINNED_KEY = "hostile-pinned-key"


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayThread]:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "dead", "base_url": f"http://127.0.0.1:{free_port()}/v1", "metrics_poll_s": 0}],
            "keys": [
                {"name": "chat", "sha256": hash_key(CHAT_KEY), "traffic_class": "interactive"},
                {"name": "cams", "sha256": hash_key(CAMERA_KEY), "traffic_class": "background"},
                {
                    "name": "pinned",
                    "sha256": hash_key(PINNED_KEY),
                    "traffic_class": "background",
                    "cameras": ["door", "yard"],
                },
            ],
        }
    )
    with GatewayThread(config) as gw:
        yield gw


def post(gw: GatewayThread, key: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        content=content,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json", **(headers or {})},
        timeout=60,
    )


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}


def rejections(gw: GatewayThread, reason: str) -> float:
    text = httpx.get(f"{gw.root_url}/metrics", timeout=60).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("visioncap_gateway_rejections_total{") and f'reason="{reason}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


HOSTILE = {
    "nested 100,000 deep": b'{"messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "nested 300 deep": json.dumps(
        {"messages": [{"role": "user", "content": "a"}], "tools": json.loads("[" * 300 + "]" * 300)}
    ).encode(),
    "a 5,000-digit integer": b'{"messages":[{"role":"user","content":"a"}],"max_tokens":' + b"9" * 5000 + b"}",
    "invalid UTF-8": b'{"messages":[{"role":"user","content":"\xff\xfe\xc3"}]}',
    "a NUL in user": b'{"messages":[{"role":"user","content":"a"}],"user":"cam\\u0000x"}',
    "a NUL in model": b'{"messages":[{"role":"user","content":"a"}],"model":"m\\u0000"}',
    "a NUL in a key": b'{"messages":[{"role":"user","content":"a"}],"x\\u0000":1}',
    "a raw NUL byte": b'{"messages":[{"role":"user","content":"a\x00b"}]}',
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
def test_hostile_bodies_get_400_and_are_counted(gateway: GatewayThread, body: bytes) -> None:
    before = rejections(gateway, "bad_request")
    answer = post(gateway, CHAT_KEY, body)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert rejections(gateway, "bad_request") == before + 1


def test_a_nul_in_message_text_passes_as_vllm_accepts_it(gateway: GatewayThread) -> None:
    # vLLM tokenizes it; `vllm bench serve`'s random prompts hold NULs. 502: the test's upstream is dead.
    body = b'{"messages":[{"role":"user","content":"a\\u0000b"}]}'
    assert post(gateway, CHAT_KEY, body).status_code == 502


def test_a_literal_backslash_u0000_in_text_is_not_a_nul(gateway: GatewayThread) -> None:
    # The text `\u0000` (a backslash and five characters) is harmless and passes on: 502 from the dead upstream.
    answer = post(gateway, CHAT_KEY, json.dumps(chat(messages=[{"role": "user", "content": "\\u0000"}])).encode())
    assert answer.status_code == 502


@pytest.mark.parametrize("field", ["n", "best_of"])
def test_background_keys_ask_for_one_answer(gateway: GatewayThread, field: str) -> None:
    answer = post(gateway, CAMERA_KEY, json.dumps(chat(**{field: 4})).encode())
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field
    assert post(gateway, CAMERA_KEY, json.dumps(chat(**{field: 1})).encode()).status_code == 502
    assert post(gateway, CHAT_KEY, json.dumps(chat(**{field: 4})).encode()).status_code == 502  # chat may


def test_a_pinned_key_names_only_its_cameras(gateway: GatewayThread) -> None:
    before = rejections(gateway, "camera_not_allowed")
    invented = post(gateway, PINNED_KEY, json.dumps(chat()).encode(), {"x-visioncap-camera": "cam-9999"})
    assert invented.status_code == 403 and invented.json()["error"]["type"] == "camera_not_allowed"
    assert post(gateway, PINNED_KEY, json.dumps(chat(user="invented")).encode()).status_code == 403
    assert rejections(gateway, "camera_not_allowed") == before + 2
    assert post(gateway, PINNED_KEY, json.dumps(chat()).encode(), {"x-visioncap-camera": "door"}).status_code == 502
    assert post(gateway, PINNED_KEY, json.dumps(chat(user="yard")).encode()).status_code == 502
    assert post(gateway, PINNED_KEY, json.dumps(chat()).encode()).status_code == 502  # its own label
    # A key without a list may name any camera.
    assert post(gateway, CAMERA_KEY, json.dumps(chat()).encode(), {"x-visioncap-camera": "cam-9999"}).status_code == 502


def test_every_image_of_a_request_counts_against_the_image_token_cap() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (640, 480), (90, 120, 150)).save(buffer, format="JPEG")
    uri = "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": uri}}
    config = ImagesConfig()
    one = inspect_messages([{"role": "user", "content": [part]}], config)
    three = inspect_messages([{"role": "user", "content": [part, part]}, {"role": "user", "content": [part]}], config)
    assert one > 0 and three == 3 * one


def png_header(width: int, height: int) -> bytes:
    """A PNG with a header and no pixel data: its size is readable, there is nothing to decode."""

    def chunk(kind: bytes, data: bytes = b"") -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT") + chunk(b"IEND")


def test_an_image_far_above_the_models_largest_is_refused_from_its_header(gateway: GatewayThread) -> None:
    before = rejections(gateway, "image_too_large")
    # 10000 x 10000 is beyond 4 x the model's largest (16,384 tokens of 28 x 28 pixels: 51 megapixels); 40000 x
    # 30000 is beyond PIL's own decompression-bomb limit as well.
    for width, height in ((10_000, 10_000), (40_000, 30_000)):
        uri = "data:image/png;base64," + base64.b64encode(png_header(width, height)).decode()
        content = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": uri}}]
        answer = post(gateway, CAMERA_KEY, json.dumps(chat(messages=[{"role": "user", "content": content}])).encode())
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "image_too_large"
    assert rejections(gateway, "image_too_large") == before + 2
    # The model's own largest size passes (to the dead upstream: 502).
    uri = "data:image/png;base64," + base64.b64encode(png_header(4_000, 3_000)).decode()
    content[1] = {"type": "image_url", "image_url": {"url": uri}}
    fitting = json.dumps(chat(messages=[{"role": "user", "content": content}])).encode()
    assert post(gateway, CAMERA_KEY, fitting).status_code == 502


def test_background_bodies_have_their_own_smaller_limit(gateway: GatewayThread) -> None:
    body = json.dumps(chat(messages=[{"role": "user", "content": "x" * (9 * 1024 * 1024)}])).encode()
    answer = post(gateway, CAMERA_KEY, body)
    assert answer.status_code == 413 and answer.json()["error"]["type"] == "request_too_large"
    assert post(gateway, CHAT_KEY, body).status_code == 502  # an interactive key may send up to 20 MiB
