"""Query parameters are checked as the config files check their keys (issue 40, item 9): one a route does not
take is refused with a 422 naming it (and the closest one it takes), on every route, where it used to be ignored
(`?cameras=lobby`, for `camera`, listed every camera's captions). And every route with a time window has one rule:
`until` not after `since` is a 422 naming `until` (/v1/alerts answered 200 and nothing, /v1/captions 422).

The app runs in this process over a real SQLite file holding captions of two cameras."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import offline_api_settings
from test_api import captioned, new_caption

from visioncap.api import create_app
from visioncap.store import CaptionStatus, CaptionStore, create_db_engine

KEY = "params-read-write-key"
# A liveness probe: public, and takes nothing (load balancers add their own query strings to probes).
UNCHECKED = {"/healthz"}
PATH_VALUES = {"id": "1", "camera": "lobby", "name": "rule"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'visioncap.db'}"
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    for index, camera in enumerate(["lobby", "lobby", "dock"]):
        row_id = store.add(new_caption(index, camera=camera), status=CaptionStatus.PENDING)
        store.mark_captioned(row_id, captioned(f"a person on camera {camera}"), 1)
    store.engine.dispose()
    settings = offline_api_settings(data_dir, url, KEY)
    with TestClient(create_app(settings), headers={"X-Api-Key": KEY}, raise_server_exceptions=False) as client:
        yield client


def refused(response: Any, param: str) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    return error["message"]


def test_a_misspelt_parameter_is_refused_with_the_name_meant(client: TestClient) -> None:
    message = refused(client.get("/v1/captions", params={"cameras": "lobby"}), "cameras")
    assert "unknown query parameter" in message and "did you mean camera?" in message
    # Spelt right, it filters.
    listed = client.get("/v1/captions", params={"camera": "lobby"}).json()["items"]
    assert len(listed) == 2 and {item["camera"] for item in listed} == {"lobby"}


def operations(client: TestClient) -> list[tuple[str, str]]:
    """Every operation of the API's document, its path filled in."""
    document = client.get("/openapi.json").json()
    found = [
        (method.upper(), re.sub(r"\{(\w+)\}", lambda match: PATH_VALUES[match[1]], path))
        for path, methods in document["paths"].items()
        if path not in UNCHECKED
        for method in methods
    ]
    assert len(found) >= 15  # every route of the API: captions, cameras, alerts, ask, stream, health
    return found


def test_every_route_refuses_a_parameter_it_does_not_take(client: TestClient) -> None:
    for method, path in operations(client):
        response = client.request(method, path, params={"bogus": "1"})
        assert response.status_code == 422, (method, path, response.text)
        assert response.json()["error"]["param"] == "bogus", (method, path, response.text)


def test_a_route_without_parameters_says_so(client: TestClient) -> None:
    message = refused(client.get("/v1/cameras", params={"camera": "lobby"}), "camera")
    assert "takes none" in message


@pytest.mark.parametrize("path", ["/v1/captions", "/v1/alerts"])
@pytest.mark.parametrize(
    ("since", "until"),
    [
        ("2026-12-01T00:00:00Z", "2026-11-01T00:00:00Z"),  # backwards
        ("2026-12-01T00:00:00Z", "2026-12-01T00:00:00Z"),  # empty
        ("2026-12-01T00:00:00", "2026-12-01T01:00:00+02:00"),  # naive is UTC: 23:00 the day before
    ],
)
def test_every_window_refuses_until_not_after_since(client: TestClient, path: str, since: str, until: str) -> None:
    assert refused(client.get(path, params={"since": since, "until": until}), "until") == "until: must be after since"


@pytest.mark.parametrize("path", ["/v1/captions", "/v1/alerts"])
def test_a_window_in_order_is_served(client: TestClient, path: str) -> None:
    response = client.get(path, params={"since": "2026-11-29T00:00:00", "until": "2026-11-29T13:00:00+02:00"})
    assert response.status_code == 200, response.text
