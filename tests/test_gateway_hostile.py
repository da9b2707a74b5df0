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
from visioncap.gateway.images import MediaCost, inspect_messages
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
    assert one.tokens > 0 and one.images == 1 and three == MediaCost(3 * one.tokens, 3)


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


# -- one media check on every route (issue 40, item 2) -----------------------------------------------------------


def body_routes(gw: GatewayThread) -> list[str]:
    """Every route of the app that takes a body: each is forwarded to vLLM, which reads media on several."""
    paths = {path for path, operations in gw.app.openapi()["paths"].items() if "post" in operations}
    assert {"/tokenize", "/detokenize", "/v1/chat/completions", "/v1/embeddings"} <= paths
    return sorted(paths)


def post_to(gw: GatewayThread, path: str, key: str, body: bytes) -> httpx.Response:
    return httpx.post(
        f"{gw.root_url}{path}",
        content=body,
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
        timeout=60,
    )


def media_bodies(url: str) -> dict[str, dict[str, Any]]:
    """A media URL where each route's readers look: a chat message's part, a Responses input item's part, and the
    Responses shorthand of an image item on its own; in a body every route's view takes (the fields each requires)."""
    valid = {"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "input": "x"}
    return {
        "messages": {
            **valid,
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        },
        "input": {**valid, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]},
        "input item": {**valid, "input": [{"type": "input_image", "image_url": url}]},
    }


@pytest.mark.parametrize("where", ["messages", "input", "input item"])
@pytest.mark.parametrize("key", [CHAT_KEY, CAMERA_KEY])
def test_every_route_refuses_media_urls_vllm_would_fetch(gateway: GatewayThread, where: str, key: str) -> None:
    # /tokenize rendered a conversation's images, fetching any URL (a loopback listener logged vLLM's user agent).
    # Through the dead upstream a forwarded body comes back 502.
    for path in body_routes(gateway):
        body = json.dumps(media_bodies("http://127.0.0.1:9/internal")[where]).encode()
        answer = post_to(gateway, path, key, body)
        assert answer.status_code == 400, (path, answer.text[:300])
        assert answer.json()["error"]["type"] == "media_url_not_allowed", path


def test_every_route_refuses_pixel_bombs(gateway: GatewayThread) -> None:
    uri = "data:image/png;base64," + base64.b64encode(png_header(40_000, 30_000)).decode()
    for path in body_routes(gateway):
        answer = post_to(gateway, path, CHAT_KEY, json.dumps(media_bodies(uri)["messages"]).encode())
        assert answer.status_code == 400 and answer.json()["error"]["type"] == "image_too_large", path


def test_tokenize_passes_a_conversation_with_an_inline_image(gateway: GatewayThread) -> None:
    uri = "data:image/png;base64," + base64.b64encode(png_header(640, 480)).decode()
    body = json.dumps(media_bodies(uri)["messages"]).encode()
    assert post_to(gateway, "/tokenize", CHAT_KEY, body).status_code == 502  # forwarded: the upstream is dead


# -- text that cannot be encoded, and every admission slot given back (issue 40, item 4) -------------------------

# A lone surrogate as JSON sends it: the escape (what `json.dumps("\ud800")` writes), or its three bytes, which
# Python's json decoder lets through too.
ESCAPED = b'"x \\ud800"'
RAW_BYTES = b'"x \xed\xa0\x80"'


def chat_bytes(content: bytes = b'"hello"', user: bytes | None = None, model: str = "m") -> bytes:
    extra = b"" if user is None else b',"user":' + user
    return (
        b'{"model":"'
        + model.encode()
        + b'","max_tokens":4,"messages":[{"role":"user","content":'
        + content
        + b"}]"
        + (extra + b"}")
    )


def padded(body: bytes, size: int) -> bytes:
    """`body` with a text field that makes it `size` bytes or more: a body checked in a worker process."""
    return body[:-1] + b',"padding":"' + b"x" * size + b'"}' if size else body


@pytest.mark.parametrize("size", [0, 256 * 1024], ids=["checked on the loop", "checked in a worker"])
@pytest.mark.parametrize("key", [CHAT_KEY, CAMERA_KEY])
@pytest.mark.parametrize(
    "body",
    [chat_bytes(ESCAPED), chat_bytes(RAW_BYTES), chat_bytes(user=ESCAPED), chat_bytes(content=b'"\\udfff"')],
    ids=["escape in content", "bytes in content", "escape in user", "low surrogate"],
)
def test_text_that_cannot_be_encoded_gets_400(gateway: GatewayThread, key: str, body: bytes, size: int) -> None:
    answer = post(gateway, key, padded(body, size))
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert "surrogate" in answer.json()["error"]["message"]


def test_a_surrogate_pair_is_one_character_and_passes(gateway: GatewayThread) -> None:
    assert post(gateway, CAMERA_KEY, chat_bytes(b'"smile \\ud83d\\ude00"')).status_code == 502


def test_a_refusal_quoting_a_lone_surrogate_is_still_an_answer(gateway: GatewayThread) -> None:
    # A key of the caller's own in the validation error's location: the answer writes the surrogate as its escape.
    body = b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}], "x":1}, 5]}'
    answer = post(gateway, CHAT_KEY, body)
    assert answer.status_code == 422
    bad_key = b'{"model":"m","messages":[{"role":"user","content":[{"\\ud800":1,"type":"text"}]}],"n":"2"}'
    answer = post(gateway, CHAT_KEY, bad_key)
    assert answer.status_code in (400, 422) and answer.json()["error"]["code"] == answer.status_code


def background_state(gw: GatewayThread) -> tuple[int, int, float]:
    """(in flight, waiting) of the background queue from /healthz, and the bytes of bodies the budget holds."""
    health = httpx.get(f"{gw.root_url}/healthz", timeout=60).json()
    queue = health["upstreams"]["dead"]["background"]
    text = httpx.get(f"{gw.root_url}/metrics", timeout=60).text
    held = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("visioncap_gateway_waiting_body_bytes")
    )
    return queue["in_flight"], queue["waiting"], held


def completion(**extra: Any) -> bytes:
    return json.dumps({"model": "m", "prompt": "describe", "max_tokens": 4, **extra}).encode()


BACKGROUND_REFUSALS: dict[str, tuple[str, bytes, dict[str, str], int]] = {
    "lone surrogate in content": ("/v1/chat/completions", chat_bytes(ESCAPED), {}, 400),
    "lone surrogate in user": ("/v1/chat/completions", chat_bytes(user=ESCAPED), {}, 400),
    "n as a string": ("/v1/chat/completions", json.dumps(chat(n="5")).encode(), {}, 422),
    "n above 1": ("/v1/chat/completions", json.dumps(chat(n=5)).encode(), {}, 400),
    "a prompt list": ("/v1/completions", completion(prompt=["a"] * 20), {}, 400),
    "a media URL": ("/v1/chat/completions", json.dumps(media_bodies("http://10.0.0.1/")["messages"]).encode(), {}, 400),
    "a pixel bomb": (
        "/v1/chat/completions",
        json.dumps(
            media_bodies("data:image/png;base64," + base64.b64encode(png_header(40_000, 30_000)).decode())["messages"]
        ).encode(),
        {},
        400,
    ),
    "not JSON": ("/v1/chat/completions", b'{"messages": [', {}, 400),
    "a bad deadline": ("/v1/chat/completions", json.dumps(chat()).encode(), {"x-visioncap-deadline-ms": "soon"}, 400),
    "too large": ("/v1/chat/completions", json.dumps(chat(pad="x" * (9 * 1024 * 1024))).encode(), {}, 413),
    "forwarded, upstream dead": ("/v1/chat/completions", json.dumps(chat()).encode(), {}, 502),
}


@pytest.mark.parametrize("size", [0, 256 * 1024], ids=["checked on the loop", "checked in a worker"])
def test_every_refusal_of_a_background_request_gives_its_slot_and_bytes_back(gateway: GatewayThread, size: int) -> None:
    # A lone surrogate used to fail after admission (500), its slot never released: after 8, every caption 408.
    assert background_state(gateway) == (0, 0, 0)
    for kind, (path, body, headers, status) in BACKGROUND_REFUSALS.items():
        answer = httpx.post(
            f"{gateway.root_url}{path}",
            content=padded(body, size) if status != 413 else body,
            headers={"authorization": f"Bearer {CAMERA_KEY}", "content-type": "application/json", **headers},
            timeout=60,
        )
        assert background_state(gateway) == (0, 0, 0), (kind, answer.status_code)
        assert answer.status_code == status, (kind, answer.text[:300])
    for _ in range(12):  # more than the idle concurrency cap
        assert post(gateway, CAMERA_KEY, padded(chat_bytes(ESCAPED), size)).status_code == 400
    assert post(gateway, CAMERA_KEY, json.dumps(chat()).encode()).status_code == 502  # admitted, not 408


# -- one answer a background request, types as vLLM reads them (issue 40, item 5) --------------------------------


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"n": "5"}, "n"),
        ("/v1/chat/completions", {"n": 5.0}, "n"),
        ("/v1/chat/completions", {"n": True}, "n"),
        ("/v1/completions", {"n": "5"}, "n"),
        ("/v1/completions", {"best_of": "3"}, "best_of"),
        ("/v1/completions", {"prompt": ["a cat"] * 20}, "prompt"),
        ("/v1/completions", {"prompt": [[1, 2], [3, 4]]}, "prompt"),
        ("/v1/embeddings", {"input": ["a", "b", "c"]}, "input"),
    ],
    ids=lambda value: json.dumps(value)[:24] if not isinstance(value, str) else value,
)
def test_background_keys_get_one_answer_whatever_the_types(
    gateway: GatewayThread, path: str, extra: dict[str, Any], param: str
) -> None:
    # vLLM's models coerce "5" to 5 and a prompt list is a request per prompt: once forwarded (502 here), several
    # answers in one admission slot.
    body = chat(**extra) if path == "/v1/chat/completions" else completion(**extra)
    if isinstance(body, bytes):
        body = json.loads(body)
    answer = post_to(gateway, path, CAMERA_KEY, json.dumps(body).encode())
    assert 400 <= answer.status_code < 500, answer.text[:300]
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "extra"),
    [
        ("/v1/completions", {"prompt": [1, 2, 3]}),  # token ids: one prompt
        ("/v1/completions", {"prompt": ["one prompt"]}),
        ("/v1/completions", {"prompt": [[1, 2, 3]]}),
        ("/v1/completions", {"n": 1}),
        ("/v1/embeddings", {"input": "one text"}),
    ],
)
def test_one_prompt_in_any_shape_passes_for_background_keys(
    gateway: GatewayThread, path: str, extra: dict[str, Any]
) -> None:
    assert post_to(gateway, path, CAMERA_KEY, completion(**extra)).status_code == 502


def test_interactive_keys_may_send_prompt_lists_but_not_numbers_as_strings(gateway: GatewayThread) -> None:
    assert post_to(gateway, "/v1/completions", CHAT_KEY, completion(prompt=["a", "b"], n=2)).status_code == 502
    answer = post_to(gateway, "/v1/completions", CHAT_KEY, completion(n="2"))
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "n"
