"""/v1/summaries through the real app on SQLite: scopes, checks of the window, storage and listing; the VLM is a
closed port here (the real vLLM writes summaries in tests/test_summaries.py), so a window with captions answers
503 and stores nothing, and an empty window is written without it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alerts_support import add_caption
from fastapi.testclient import TestClient
from helpers import TINY_MODEL

from visioncap.api import create_app
from visioncap.api.auth import hash_key
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.store import CaptionStore, create_db_engine

ADMIN = "summaries-admin-key"
READER = "summaries-reader-key"
LOBBY_WRITER = "summaries-lobby-writer"


@pytest.fixture
def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("VISIONCAP_SUMMARIES_MODEL", TINY_MODEL)
    data_dir = tmp_path / "data"
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    add_caption(store, "garage", datetime(2026, 3, 28, 10, 5, tzinfo=UTC), "A van parks.")
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        database_url=f"sqlite:///{data_dir / 'visioncap.db'}",
        vlm_base_url="http://127.0.0.1:9/v1",  # discard port: nothing answers
        api_keys=[
            ApiKey(name="admin", sha256=hash_key(ADMIN), scopes={"read", "write"}),
            ApiKey(name="reader", sha256=hash_key(READER), scopes={"read"}),
            ApiKey(name="lobby", sha256=hash_key(LOBBY_WRITER), scopes={"read", "write"}, cameras=["lobby"]),
        ],
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as test_client:
        yield test_client


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def window(cameras: list[str], start: str = "2026-03-28T10:00:00Z", end: str = "2026-03-28T11:00:00Z") -> Any:
    return {"cameras": cameras, "start": start, "end": end}


def test_an_empty_window_is_stored_and_listed(client: TestClient) -> None:
    made = client.post("/v1/summaries", json=window(["lobby"]), headers=auth(ADMIN))
    assert made.status_code == 201, made.text
    body = made.json()
    assert (body["caption_count"], body["requests"], body["citations"]) == (0, 0, [])
    listed = client.get("/v1/summaries", headers=auth(READER)).json()["summaries"]
    assert [summary["id"] for summary in listed] == [body["id"]]
    assert client.get("/v1/summaries?camera=garage", headers=auth(READER)).json()["summaries"] == []


def test_bad_requests_are_refused_and_store_nothing(client: TestClient) -> None:
    cases = [
        (READER, window(["lobby"]), 403),  # POST needs the write scope
        (LOBBY_WRITER, window(["garage"]), 403),  # a key limited to the lobby
        (ADMIN, window(["lobby"], end="2026-03-28T09:00:00Z"), 422),
        (ADMIN, window(["lobby"], end="2026-05-28T09:00:00Z"), 422),  # longer than a week
        (ADMIN, {"cameras": [], "start": "2026-03-28T10:00:00Z", "end": "2026-03-28T11:00:00Z"}, 422),
        (ADMIN, window(["garage"]), 503),  # a caption to read, and no VLM answers
    ]
    for key, body, status in cases:
        answer = client.post("/v1/summaries", json=body, headers=auth(key))
        assert answer.status_code == status, (body, answer.text)
        assert "error" in answer.json()
    assert client.get("/v1/summaries", headers=auth(ADMIN)).json()["summaries"] == []
