"""Hostile input the API once answered with a 500 (issue 40, item 6): a lone surrogate in a JSON body, a cursor
whose JSON holds a boolean, a float, a string or a number past the database's integers where an id belongs, and
`?boxes=true` on a stored JPEG that does not decode. Each is now a 4xx in the API's error shape.

The app runs in this process (Starlette's TestClient, its lifespan included) over a real SQLite file written the
way the pipeline writes it; the VLM's address refuses connections (nothing here may need it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import offline_api_settings
from test_api import captioned, jpeg, new_caption

from visioncap.api import create_app
from visioncap.api.errors import ApiError
from visioncap.api.serving import decode_ranked_cursor
from visioncap.config.outbox import OutboxConfig
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.store import CaptionStore, create_db_engine

KEY = "hostile-read-write-key"
T = "2026-11-29T12:00:00+00:00"
HUGE = 10**20  # 21 digits: past SQLite's and PostgreSQL's 64-bit integers


def cursor_of(data: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


class Seeded:
    def __init__(self, client: TestClient, good: int, corrupt: int) -> None:
        self.client = client
        self.good = good  # a captioned row with its JPEG
        self.corrupt = corrupt  # a row whose stored JPEG is not one any more


@pytest.fixture
def seeded(tmp_path: Path) -> Iterator[Seeded]:
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'visioncap.db'}"
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=10), PipelineMetrics())
    ids = []
    for index in range(2):
        _, row_id = outbox.put(new_caption(index), jpeg())
        assert row_id is not None
        store.mark_captioned(row_id, captioned("a man in a red jacket at the door"), 1)
        ids.append(row_id)
    row = store.get(ids[1])
    assert row is not None and row.image_path
    # A stored file damaged on disk (a full disk, a bad sector, a bit flip): a JPEG's start, then garbage.
    (data_dir / row.image_path).write_bytes(jpeg()[:200] + b"\x00garbage" * 50)
    store.engine.dispose()
    settings = offline_api_settings(data_dir, url, KEY)
    with TestClient(create_app(settings), headers={"X-Api-Key": KEY}, raise_server_exceptions=False) as client:
        yield Seeded(client, ids[0], ids[1])


def assert_refused(response: Any, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
    assert error["param"] == param


LONE = [
    b'"a man \\ud800 at the door"',  # a high half alone
    b'"a man \\udc00 at the door"',  # a low half alone
    b'"\\ud800\\u0041"',  # a high half followed by something else
    b'"a man at the door \\ud83d"',  # a high half at the end
    '"a man \ud800"'.encode("utf-8", "surrogatepass"),  # as UTF-8 bytes, which json reads as well
]


@pytest.mark.parametrize("content", LONE)
def test_a_lone_surrogate_in_an_ask_question_is_a_400(seeded: Seeded, content: bytes) -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": ' + content + b"}]}"
    response = seeded.client.post("/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert_refused(response, 400, None)


def test_a_surrogate_pair_and_an_escaped_backslash_are_text(seeded: Seeded) -> None:
    """What is Unicode passes: a pair spelling one character, and `\\\\ud800` (a backslash, then letters). The
    question matches the stored captions and needs the VLM, which is away: the documented 503, after the body."""
    for content in (b'"a man \\ud83d\\ude00 at the door"', b'"a man \\\\ud800 at the door"'):
        body = b'{"model": "m", "messages": [{"role": "user", "content": ' + content + b"}]}"
        response = seeded.client.post(
            "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"}
        )
        assert response.status_code == 503, response.text
        assert response.json()["error"]["message"].startswith("the VLM is unreachable")


def test_a_lone_surrogate_in_any_body_is_a_400(seeded: Seeded) -> None:
    camera = (
        b'{"camera": "door", "pipeline": "p", "source": {"kind": "rtsp", "camera": "door", "url": "rtsp://h/\\udfff"}}'
    )
    response = seeded.client.post("/v1/cameras", content=camera, headers={"Content-Type": "application/json"})
    assert_refused(response, 400, None)
    assert "door" not in [item["camera"] for item in seeded.client.get("/v1/cameras").json()["items"]]


CAPTION_CURSORS = [
    {"t": T, "i": True},
    {"t": T, "i": False},
    {"t": T, "i": 2.0},
    {"t": T, "i": "5"},
    {"t": T, "i": HUGE},
    {"t": T, "i": -HUGE},
    {"t": True, "i": 5},
    {"t": 5, "i": 5},
    {"i": True},
    [T, 5],
    "x",
    None,
    True,
]


@pytest.mark.parametrize("data", CAPTION_CURSORS, ids=[json.dumps(data) for data in CAPTION_CURSORS])
def test_a_caption_cursor_of_the_wrong_types_is_a_422(seeded: Seeded, data: Any) -> None:
    assert_refused(seeded.client.get("/v1/captions", params={"cursor": cursor_of(data)}), 422, "cursor")


def test_a_cursor_the_api_made_still_pages(seeded: Seeded) -> None:
    first = seeded.client.get("/v1/captions", params={"limit": 1}).json()
    second = seeded.client.get("/v1/captions", params={"limit": 1, "cursor": first["next_cursor"]})
    assert second.status_code == 200 and [item["id"] for item in second.json()["items"]] == [seeded.good]


RANKED_CURSORS = [
    {"w": {"t": T, "i": True}, "s": 0.5, "i": 3},
    {"w": {"t": T, "i": 3}, "s": True, "i": 3},
    {"w": {"t": T, "i": 3}, "s": 0.5, "i": HUGE},
    {"w": {"t": T, "i": 3}, "s": "0.5", "i": 3},
    {"w": [T, 3], "s": 0.5, "i": 3},
    {"w": {"t": T, "i": 3}, "s": 1e400, "i": 3},
]


@pytest.mark.parametrize("data", RANKED_CURSORS, ids=[json.dumps(data) for data in RANKED_CURSORS])
def test_a_semantic_cursor_of_the_wrong_types_is_refused(data: Any) -> None:
    # Semantic search needs the embedding model; its cursors are read here directly, as the route reads them.
    with pytest.raises(ApiError) as refused:
        decode_ranked_cursor(cursor_of(data))
    assert (refused.value.status, refused.value.param) == (422, "cursor")


def alert_cursor(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("text", ["a" + "9" * 21, "a" + "9" * 19, "a9223372036854775808", "a0", "a-5", "a 5", "a1_0"])
def test_an_alert_cursor_past_the_database_integers_is_a_422(seeded: Seeded, text: str) -> None:
    assert_refused(seeded.client.get("/v1/alerts", params={"cursor": alert_cursor(text)}), 422, "cursor")


def test_boxes_on_a_stored_jpeg_that_does_not_decode_is_a_422(seeded: Seeded) -> None:
    assert_refused(seeded.client.get(f"/v1/captions/{seeded.corrupt}/image", params={"boxes": "true"}), 422, "boxes")
    # Without boxes the file is served as it is stored; a good one is drawn on.
    assert seeded.client.get(f"/v1/captions/{seeded.corrupt}/image").status_code == 200
    drawn = seeded.client.get(f"/v1/captions/{seeded.good}/image", params={"boxes": "true"})
    assert drawn.status_code == 200 and drawn.headers["content-type"] == "image/jpeg"
