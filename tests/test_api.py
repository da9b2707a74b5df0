"""The REST API over a real SQLite file seeded the way the pipeline writes it (CaptionStore and the outbox).

Most tests use Starlette's TestClient (the app in this process); the live stream, readiness and the
concurrent-writer test use real sockets (uvicorn in a thread, `ApiThread`) and a real HTTP stub for the VLM.
"""

from __future__ import annotations

import copy
import http.client
import io
import json
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import fastapi_offline
import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers import read_caption_events
from pg import fresh_database
from PIL import Image

import visioncap.api
from visioncap import __version__
from visioncap.api import create_app
from visioncap.api.protocol import CaptionPage
from visioncap.api.serving import static_dir
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import generate_key, hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.records import Base
from visioncap.store.schema import SCHEMA_VERSION, ensure_schema, schema_version

READ_KEY = "test-read-key"
WRITE_KEY = "test-write-key"  # read and write
WRITE_ONLY_KEY = "test-write-only-key"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIMEOUT = 30  # seconds; a bound on a broken test, never a measurement

TEXTS = [
    "a man in a red jacket walking to the loading dock",
    "two women talking near the bus stop",
    "a courier carrying a parcel through the gate",
    "an empty corridor with one person waiting",
    "people walk past the entrance with bicycles",
]


def jpeg(width: int = 160, height: int = 120) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (40, 40, 40)).save(out, format="JPEG")
    return out.getvalue()


def new_caption(index: int, camera: str = "cam-1", people: int = 1, **changes: Any) -> NewCaption:
    values: dict[str, Any] = {
        "pipeline": "p",
        "camera": camera,
        "source": f"/videos/{camera}.mp4",
        "frame_index": index,
        "offset_s": float(index),
        "captured_at": T0 + timedelta(minutes=index),
        "reason": "new-event",
        "people": [
            {"x1": 40.0 + 10 * i, "y1": 30.0, "x2": 120.0, "y2": 200.0, "confidence": 0.9, "class_id": 0, "track_id": i}
            for i in range(people)
        ],
        "image_width": 160,
        "image_height": 120,
        "model": "tiny",
        "event_key": f"{camera}:{index % 4}",
        "event_ids": list(range(people)),
        "score": 0.5,
        "frame_width": 320,
        "frame_height": 240,
    }
    values.update(changes)
    return NewCaption(**values)


def captioned(text: str) -> Caption:
    return Caption(text, "tiny", 300, 12, 0.5)


class Seed:
    """What was written, to compare answers with."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, Any]] = {}

    def add(self, row_id: int, **facts: Any) -> None:
        self.rows[row_id] = facts

    def ids(self, **where: Any) -> list[int]:
        """Ids matching `where` (values: a value, or a callable), newest first as the API orders them."""
        chosen = [
            (facts["captured_at"], row_id)
            for row_id, facts in self.rows.items()
            if all(check(facts[key]) if callable(check) else facts[key] == check for key, check in where.items())
        ]
        return [row_id for _, row_id in sorted(chosen, reverse=True)]


def seed_rows(store: CaptionStore, outbox: Outbox) -> Seed:
    """30 rows over three cameras: captioned (with images), pending, failed and skipped ones."""
    seed = Seed()
    for index in range(30):
        camera = f"cam-{index % 3 + 1}"
        people = index % 4
        new = new_caption(index, camera, people)
        if index % 10 == 9:  # skipped: never had an image
            row_id = store.add(new, status=CaptionStatus.SKIPPED, error="queue-full: 8 frames already waiting")
            status, text = "skipped", None
        else:
            _, row_id = outbox.put(new, jpeg())
            status, text = "pending", None
            if index % 10 == 8:
                store.mark_failed(row_id, "VLM refused the request (HTTP 400)", attempts=1)
                status = "failed"
            elif index % 10 != 7:
                text = TEXTS[index % len(TEXTS)]
                store.mark_captioned(row_id, captioned(text), attempts=1)
                status = "captioned"
        assert row_id is not None
        seed.add(row_id, camera=camera, people=people, status=status, text=text, captured_at=new.captured_at)
    return seed


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture(scope="session")
def seeded_sqlite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Seed]:
    """A seeded SQLite data directory, written once per test process and copied for each test that wants one:
    writing its 30 rows and pictures durably (an fsync for each) took a third of a second per test."""
    data_dir = tmp_path_factory.mktemp("api-seed") / "data"
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    seed = seed_rows(store, Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics()))
    store.engine.dispose()  # the last connection closed: the WAL is checkpointed into the file that is copied
    return data_dir, seed


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test's own database: a SQLite file, or a fresh database on the session's PostgreSQL cluster."""
    if request.param == "sqlite":
        url = f"sqlite:///{data_dir / 'visioncap.db'}"
        if "seed" in request.fixturenames:  # a private copy of the seeded files, made before anything opens them
            shutil.copytree(request.getfixturevalue("seeded_sqlite")[0], data_dir)
    else:
        url = fresh_database(request.getfixturevalue("postgres"))  # the session's cluster (conftest.py)
    monkeypatch.setenv("VISIONCAP_DATABASE_URL", url)  # what ApiSettings reads
    return url


@pytest.fixture
def store(database_url: str) -> CaptionStore:
    # The pipeline's own schema creation; the API migrates on top of it (FTS, indexes). On a copy of the seeded
    # SQLite files it finds its schema there and changes nothing.
    store = CaptionStore(create_db_engine(database_url))
    store.create_schema()
    return store


@pytest.fixture
def seed(request: pytest.FixtureRequest, store: CaptionStore, database_url: str, data_dir: Path) -> Seed:
    """The rows written: on SQLite they came with the copied files (`database_url`), on PostgreSQL they are
    written now."""
    if database_url.startswith("sqlite"):
        return copy.deepcopy(request.getfixturevalue("seeded_sqlite")[1])
    return seed_rows(store, Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics()))


def settings_for(data_dir: Path, **changes: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "vlm_base_url": "http://127.0.0.1:9/v1",  # discard port: nothing answers
        "api_keys": [
            ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"}),
            ApiKey(name="admin", sha256=hash_key(WRITE_KEY), scopes={"read", "write"}),
            ApiKey(name="hook", sha256=hash_key(WRITE_ONLY_KEY), scopes={"write"}),
        ],
        "api_stream_poll_s": 0.1,
        "api_max_page_size": 100,
    }
    values.update(changes)
    return ApiSettings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
def app(seed: Seed, data_dir: Path) -> FastAPI:
    return create_app(settings_for(data_dir))


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, headers={"Authorization": f"Bearer {READ_KEY}"}, raise_server_exceptions=False) as client:
        yield client


def ids_of(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return [item["id"] for item in response.json()["items"]]


def all_pages(client: TestClient, **params: Any) -> list[int]:
    ids: list[int] = []
    cursor = None
    for _ in range(100):
        response = client.get("/v1/captions", params={**params, **({"cursor": cursor} if cursor else {})})
        ids += ids_of(response)
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return ids
    raise AssertionError("pagination does not end")


# -- auth --------------------------------------------------------------------------------------------


def protected_requests(app: FastAPI) -> list[tuple[str, str]]:
    """Every operation of the OpenAPI document (ids filled in), plus paths that exist on no route."""
    requests = [
        (method.upper(), path.replace("{id}", "1"))
        for path, operations in app.openapi()["paths"].items()
        if path != "/healthz"
        for method in operations
    ]
    assert {path for _, path in requests} >= {"/v1/captions", "/v1/cameras", "/v1/stream", "/readyz", "/metrics"}
    return [*requests, ("GET", "/v1/nothing-here"), ("DELETE", "/v1/captions/1")]


def test_every_route_but_healthz_refuses_a_request_without_a_valid_key(app: FastAPI) -> None:
    with TestClient(app) as anonymous:
        assert anonymous.get("/healthz").json() == {"status": "ok", "version": __version__}
        for method, path in protected_requests(app):
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"X-Api-Key": "wrong"},
                {"Authorization": "Basic x"},
            ):
                response = anonymous.request(method, path, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.text)
                assert response.json()["error"]["type"] == "authentication_error"
                assert response.headers["www-authenticate"] == "Bearer"


def test_page_and_docs_are_public_by_default_and_closed_when_configured(seed: Seed, data_dir: Path) -> None:
    ui_paths = ["/", "/static/app.js", "/docs", "/openapi.json"]
    with TestClient(create_app(settings_for(data_dir))) as anonymous:
        for path in ui_paths:
            assert anonymous.get(path).status_code == 200, path
    with TestClient(create_app(settings_for(data_dir, api_public_ui=False))) as anonymous:
        for path in ui_paths:
            assert anonymous.get(path).status_code == 401, path
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/", headers={"X-Api-Key": READ_KEY}).status_code == 200


def test_scopes_read_for_get_write_for_post(client: TestClient, seed: Seed) -> None:
    some_id = seed.ids(status="captioned")[0]
    refused = client.post(f"/v1/captions/{some_id}/regenerate")
    assert refused.status_code == 403 and "write" in refused.json()["error"]["message"]
    assert client.get("/v1/captions", headers={"Authorization": f"Bearer {WRITE_ONLY_KEY}"}).status_code == 403
    assert client.get("/v1/captions", headers={"Authorization": "", "X-Api-Key": READ_KEY}).status_code == 200
    allowed = client.post(f"/v1/captions/{some_id}/regenerate", headers={"Authorization": f"Bearer {WRITE_KEY}"})
    assert allowed.status_code == 202


def test_generated_keys_hash_to_what_settings_store(monkeypatch: pytest.MonkeyPatch) -> None:
    key, digest = generate_key("vca-")
    assert key.startswith("vca-") and len(digest) == 64 and hash_key(key) == digest
    monkeypatch.setenv("VISIONCAP_API_KEYS", json.dumps([{"name": "ui", "sha256": digest}]))
    parsed = ApiSettings(_env_file=None)  # type: ignore[call-arg]
    assert parsed.api_keys[0].scopes == {"read"}


# -- captions ----------------------------------------------------------------------------------------


def test_newest_first_with_cursor_pages(client: TestClient, seed: Seed) -> None:
    assert ids_of(client.get("/v1/captions", params={"limit": 100})) == seed.ids()
    first = client.get("/v1/captions", params={"limit": 7}).json()
    assert len(first["items"]) == 7 and first["limit"] == 7 and first["next_cursor"]
    assert all_pages(client, limit=7) == seed.ids()
    assert all_pages(client, limit=1, camera="cam-2") == seed.ids(camera="cam-2")
    assert client.get("/v1/captions").json()["limit"] == 50


@pytest.mark.parametrize(
    ("params", "where"),
    [
        ({"camera": "cam-1"}, {"camera": "cam-1"}),
        ({"camera": ["cam-1", "cam-3"]}, {"camera": lambda c: c in ("cam-1", "cam-3")}),
        ({"camera": "cam-1,cam-2"}, {"camera": lambda c: c in ("cam-1", "cam-2")}),
        ({"camera": "no-such-camera"}, {"camera": "no-such-camera"}),
        ({"since": "2026-11-29T12:10:00Z"}, {"captured_at": lambda t: t >= T0 + timedelta(minutes=10)}),
        ({"until": "2026-11-29T12:10:00+00:00"}, {"captured_at": lambda t: t < T0 + timedelta(minutes=10)}),
        ({"since": "2026-11-29T13:05:00+01:00", "until": "2026-11-29T12:20:00"},  # offsets; no offset is UTC
         {"captured_at": lambda t: T0 + timedelta(minutes=5) <= t < T0 + timedelta(minutes=20)}),
        ({"min_people": 2}, {"people": lambda n: n >= 2}),
        ({"min_people": 0}, {}),
        ({"status": "pending"}, {"status": "pending"}),
        ({"status": ["failed", "skipped"]}, {"status": lambda s: s in ("failed", "skipped")}),
        ({"q": "loading dock"}, {"text": lambda t: t is not None and "loading dock" in t}),
        ({"q": "walks"}, {"text": lambda t: t is not None and "walk" in t}),  # stemmed: walking, walk
        ({"q": "bicyc"}, {"text": lambda t: t is not None and "bicycles" in t}),  # last word is a prefix
        ({"q": "Courier, PARCEL!"}, {"text": lambda t: t is not None and "courier" in t}),
        ({"q": "zebra"}, {"text": "never"}),
        ({"q": '"unbalanced AND OR NEAR( * -'}, {"text": "never"}),  # FTS5 syntax is not syntax here
        ({"q": "!!! ???"}, {"text": "never"}),
        ({"q": "walking", "camera": "cam-1", "min_people": 1, "status": "captioned"},
         {"text": lambda t: t is not None and "walk" in t, "camera": "cam-1", "people": lambda n: n >= 1}),
    ],
)  # fmt: skip
def test_filters(client: TestClient, seed: Seed, params: dict[str, Any], where: dict[str, Any]) -> None:
    expected = seed.ids(**where)
    assert all_pages(client, **params, limit=4) == expected
    if params.get("q") not in (None, "zebra") and "never" not in where.values():
        assert expected, "the filter case should match something"


def test_text_search_follows_writes_after_the_api_started(client: TestClient, store: CaptionStore) -> None:
    row_id = store.add(new_caption(100, "cam-9"))
    assert row_id is not None
    assert ids_of(client.get("/v1/captions", params={"q": "giraffe"})) == []
    store.mark_captioned(row_id, captioned("a giraffe at the gate"), attempts=1)
    assert ids_of(client.get("/v1/captions", params={"q": "giraffe"})) == [row_id]
    store.mark_captioned(row_id, captioned("a zebra at the gate"), attempts=2)
    assert ids_of(client.get("/v1/captions", params={"q": "giraffe"})) == []
    assert ids_of(client.get("/v1/captions", params={"q": "zebra"})) == [row_id]


def test_one_caption_with_boxes_model_tokens_latency(client: TestClient, seed: Seed) -> None:
    row_id = seed.ids(status="captioned", people=3)[0]
    body = client.get(f"/v1/captions/{row_id}").json()
    assert body["id"] == row_id and body["status"] == "captioned" and body["caption"] == seed.rows[row_id]["text"]
    assert (body["model"], body["prompt_tokens"], body["completion_tokens"], body["latency_ms"]) == (
        "tiny",
        300,
        12,
        500.0,
    )
    assert len(body["boxes"]) == body["people_count"] == 3
    assert body["boxes"][0] == {"x1": 40.0, "y1": 30.0, "x2": 120.0, "y2": 200.0, "confidence": 0.9, "class_id": 0,
                                "track_id": 0}  # fmt: skip
    assert body["image_url"] == f"/v1/captions/{row_id}/image"
    assert datetime.fromisoformat(body["captured_at"]) == seed.rows[row_id]["captured_at"]
    skipped = client.get(f"/v1/captions/{seed.ids(status='skipped')[0]}").json()
    assert skipped["image_url"] is None and skipped["error"].startswith("queue-full")
    missing = client.get("/v1/captions/999999")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found"


def test_pages_carry_the_same_captions_as_the_single_caption_route(
    client: TestClient, store: CaptionStore, seed: Seed
) -> None:
    # Pages are serialised straight from the rows (no model validation); they must say what the model says.
    extra = new_caption(99, people=2)
    extra.people[0]["keypoints"] = [[1.0, 2.0, 0.5]]  # stored per person but not part of a box
    extra_id = store.add(extra)
    assert extra_id is not None
    structured = {"people": [{"clothing": "red jacket"}]}
    store.mark_captioned(extra_id, Caption("a man in a red jacket", "tiny", 300, 12, 0.5, structured), attempts=1)
    response = client.get("/v1/captions", params={"limit": 100})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    page = CaptionPage.model_validate_json(response.content)  # extra keys are forbidden in the models
    assert page.next_cursor is None and page.limit == 100
    assert [item.id for item in page.items] == [extra_id, *seed.ids()]
    for item in page.items:
        assert (
            response.json()["items"][[i.id for i in page.items].index(item.id)]
            == client.get(f"/v1/captions/{item.id}").json()
        )
    first = response.json()["items"][0]
    assert "keypoints" not in first["boxes"][0] and first["structured"] == {"people": [{"clothing": "red jacket"}]}


def test_image_with_type_caching_and_boxes(client: TestClient, seed: Seed, data_dir: Path, store: CaptionStore) -> None:
    row_id = seed.ids(status="captioned", people=2)[0]
    response = client.get(f"/v1/captions/{row_id}/image")
    assert response.status_code == 200 and response.headers["content-type"] == "image/jpeg"
    assert response.content == (data_dir / store.get(row_id).image_path).read_bytes()  # type: ignore[union-attr,operator]
    assert response.headers["cache-control"].startswith("private, max-age=")
    etag = response.headers["etag"]
    again = client.get(f"/v1/captions/{row_id}/image", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""

    boxed = client.get(f"/v1/captions/{row_id}/image", params={"boxes": "true"})
    assert boxed.status_code == 200 and boxed.headers["etag"] != etag
    picture = Image.open(io.BytesIO(boxed.content)).convert("RGB")
    # Frame 320x240 shown at 160x120: the box from x1=40 (frame) has its left edge near x=20 (image).
    red, green, blue = picture.getpixel((20, 40))
    assert green > 150 and red < 100 and blue < 100

    no_geometry = store.add(new_caption(200, "cam-9", frame_width=None, frame_height=None, image_path=None))
    assert client.get(f"/v1/captions/{no_geometry}/image").status_code == 404  # no image
    (data_dir / store.get(row_id).image_path).unlink()  # type: ignore[union-attr,operator]
    assert client.get(f"/v1/captions/{row_id}/image").status_code == 404
    assert client.get("/v1/captions/999999/image").status_code == 404


def test_image_path_outside_the_data_dir_is_never_served(
    client: TestClient, store: CaptionStore, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.jpg"
    secret.write_bytes(jpeg())
    for path in ("../secret.jpg", str(secret), "visioncap.db"):
        row_id = store.add(new_caption(300 + len(path), "cam-9", image_path=path))
        assert client.get(f"/v1/captions/{row_id}/image").status_code == 404, path


def test_boxes_need_the_frame_geometry(client: TestClient, store: CaptionStore, data_dir: Path) -> None:
    outbox = Outbox(store, data_dir, OutboxConfig(), PipelineMetrics())
    _, row_id = outbox.put(new_caption(400, "cam-9", frame_width=None, frame_height=None), jpeg())
    assert client.get(f"/v1/captions/{row_id}/image").status_code == 200
    refused = client.get(f"/v1/captions/{row_id}/image", params={"boxes": True})
    assert refused.status_code == 409 and refused.json()["error"]["param"] == "boxes"


def test_cameras(client: TestClient, seed: Seed) -> None:
    cameras = {item["camera"]: item for item in client.get("/v1/cameras").json()["items"]}
    assert list(cameras) == ["cam-1", "cam-2", "cam-3"]
    for name, item in cameras.items():
        mine = [facts for facts in seed.rows.values() if facts["camera"] == name]
        assert item["captions"] == len(mine)
        assert item["by_status"] == {s: sum(f["status"] == s for f in mine) for s in item["by_status"]}
        assert datetime.fromisoformat(item["last_frame_at"]) == max(f["captured_at"] for f in mine)
        captioned_times = [f["captured_at"] for f in mine if f["status"] == "captioned"]
        assert datetime.fromisoformat(item["last_caption_at"]) == max(captioned_times)
        assert item["events"] == 4  # event keys camera:0..3


def test_regenerate_puts_the_row_back_in_the_outbox(
    client: TestClient, seed: Seed, store: CaptionStore, data_dir: Path
) -> None:
    admin = {"Authorization": f"Bearer {WRITE_KEY}"}
    row_id = seed.ids(status="failed")[0]
    response = client.post(f"/v1/captions/{row_id}/regenerate", headers=admin)
    assert response.status_code == 202 and response.json()["status"] == "pending"
    row = store.get(row_id)
    assert row is not None and (row.status, row.error, row.caption, row.attempts) == ("pending", None, None, 0)
    assert client.post(f"/v1/captions/{row_id}/regenerate", headers=admin).status_code == 409  # already pending
    # What a pipeline does at its next start: the row is queued, with its image.
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics())
    assert outbox.recover() >= 1
    item = outbox.take(timeout=0)
    pending_ids = [item.id] if item else []
    while (item := outbox.take(timeout=0)) is not None:
        pending_ids.append(item.id)
    assert row_id in pending_ids
    skipped = seed.ids(status="skipped")[0]
    assert client.post(f"/v1/captions/{skipped}/regenerate", headers=admin).status_code == 409  # no image
    assert client.post("/v1/captions/999999/regenerate", headers=admin).status_code == 404


def test_metrics(client: TestClient, seed: Seed) -> None:
    client.get("/v1/captions")
    text = client.get("/metrics").text
    assert 'visioncap_api_requests_total{method="GET",route="/v1/captions",status="200"}' in text
    captioned_count = len(seed.ids(status="captioned"))
    assert f'visioncap_api_captions{{status="captioned"}} {float(captioned_count)}' in text


def test_cors_closed_by_default_and_open_to_configured_origins(seed: Seed, data_dir: Path) -> None:
    headers = {"Origin": "https://ops.example", "X-Api-Key": READ_KEY}
    with TestClient(create_app(settings_for(data_dir))) as closed:
        assert "access-control-allow-origin" not in closed.get("/v1/cameras", headers=headers).headers
    with TestClient(create_app(settings_for(data_dir, api_cors_origins=["https://ops.example"]))) as open_:
        answer = open_.get("/v1/cameras", headers=headers)
        assert answer.headers["access-control-allow-origin"] == "https://ops.example"
        preflight = open_.options(
            "/v1/captions",
            headers={
                "Origin": "https://ops.example",
                "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "authorization",
            },
        )
        assert preflight.status_code == 200
        # Cameras and alert rules are changed with JSON bodies by PATCH and DELETE, from a console elsewhere too.
        for method in ("PATCH", "DELETE"):
            change = open_.options(
                "/v1/cameras/dock",
                headers={
                    "Origin": "https://ops.example",
                    "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": "authorization, content-type",
                },
            )
            assert change.status_code == 200, (method, change.text)
            assert method in change.headers["access-control-allow-methods"]
        other = open_.get("/v1/cameras", headers={**headers, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


# -- bad input ---------------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("/v1/captions", {"limit": "0"}, "limit"),
    ("/v1/captions", {"limit": "101"}, "limit"),  # above VISIONCAP_API_MAX_PAGE_SIZE
    ("/v1/captions", {"limit": "ten"}, "limit"),
    ("/v1/captions", {"limit": "99999999999999999999999"}, "limit"),
    ("/v1/captions", {"since": "yesterday"}, "since"),
    ("/v1/captions", {"since": "2026-13-01T00:00:00Z"}, "since"),
    ("/v1/captions", {"until": "9999-12-31T23:59:59-05:00"}, "until"),  # overflows when made UTC
    ("/v1/captions", {"since": "0001-01-01T00:00:00+05:00"}, "since"),
    ("/v1/captions", {"since": "2026-11-29T13:00:00Z", "until": "2026-11-29T12:00:00Z"}, "until"),
    ("/v1/captions", {"min_people": "-1"}, "min_people"),
    ("/v1/captions", {"min_people": "1e400"}, "min_people"),
    ("/v1/captions", {"min_people": "99999999999999999999"}, "min_people"),
    ("/v1/captions", {"status": "done"}, "status"),
    ("/v1/captions", {"q": "x" * 201}, "q"),
    ("/v1/captions", {"q": "nul\x00byte"}, "q"),
    ("/v1/captions", {"camera": "c" * 65}, "camera"),
    ("/v1/captions", {"camera": "cam\x00"}, "camera"),
    ("/v1/captions", {"camera": ",".join(f"c{i}" for i in range(51))}, "camera"),
    ("/v1/captions", {"cursor": "not-a-cursor"}, "cursor"),
    ("/v1/captions", {"cursor": "eyJ0IjoxfQ"}, "cursor"),  # {"t":1}
    ("/v1/captions", {"cursor": "eyJ0IjoiMjAyNi0xMS0yOVQxMjowMDowMCIsImkiOjF9"}, "cursor"),  # naive time
    ("/v1/captions", {"cursor": "x" * 1000}, "cursor"),
    ("/v1/captions/abc", {}, "id"),
    ("/v1/captions/0", {}, "id"),
    ("/v1/captions/-5", {}, "id"),
    ("/v1/captions/1.5", {}, "id"),
    ("/v1/captions/99999999999999999999999", {}, "id"),
    ("/v1/captions/2147483648", {}, "id"),
    ("/v1/captions/1/image", {"boxes": "maybe"}, "boxes"),
    ("/v1/captions/abc/image", {}, "id"),
    ("/v1/stream", {"min_people": "x"}, "min_people"),
    ("/v1/stream", {"camera": "c" * 65}, "camera"),
    # A single-valued parameter given twice: refused, not the last one kept (the schema says one value).
    ("/v1/captions", {"q": ["bus", "person"]}, "q"),
    ("/v1/captions", {"limit": ["5", "6"]}, "limit"),
    ("/v1/captions/1/image", {"boxes": ["1", "0"]}, "boxes"),
    ("/v1/stream", {"min_people": ["1", "2"]}, "min_people"),
]


@pytest.mark.parametrize(("path", "params", "param"), BAD_REQUESTS)
def test_malformed_parameters_get_422_naming_the_parameter(
    client: TestClient, path: str, params: dict[str, str | list[str]], param: str
) -> None:
    response = client.get(path, params=params)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_odd_but_valid_input_never_gives_500(client: TestClient) -> None:
    odd = [
        ("/v1/captions", {"q": "' OR 1=1; DROP TABLE captions; --"}),
        ("/v1/captions", {"q": "日本語 のテキスト"}),
        ("/v1/captions", {"q": "   "}),
        ("/v1/captions", {"camera": "'; DROP TABLE captions; --"}),
        ("/v1/captions", {"camera": ","}),
        ("/v1/captions", {"since": "1700000000"}),  # a Unix time: refused, the document offers ISO 8601 only
        ("/v1/captions", {"since": "0001-01-01T00:00:00Z", "until": "9999-12-31T23:59:59Z"}),
        ("/v1/captions", {"status": ["pending", "pending"]}),
        ("/v1/captions", {"unknown": "ignored"}),
        ("/v1/captions/2147483647", {}),
        ("/v1/captions/2147483647/image", {"boxes": "1"}),
    ]
    for path, params in odd:
        response = client.get(path, params=params)
        assert response.status_code < 500, (path, params, response.text)
    assert client.get("/v1/captions", params={"q": "' OR 1=1; --"}).json()["items"] == []
    assert client.post("/v1/captions/1/regenerate", content=b"\x00" * 1000).status_code == 403
    assert client.put("/v1/captions", headers={"Authorization": f"Bearer {WRITE_KEY}"}).status_code == 405


# -- schema ------------------------------------------------------------------------------------------


def test_schema_is_versioned_and_migrating_again_changes_nothing(store: CaptionStore, seed: Seed) -> None:
    assert schema_version(store.engine) == SCHEMA_VERSION  # the pipeline's create_schema migrates too
    assert ensure_schema(store.engine) == SCHEMA_VERSION
    assert schema_version(store.engine) == SCHEMA_VERSION
    assert ensure_schema(store.engine) == SCHEMA_VERSION


def test_old_database_gets_the_new_columns(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.db'}")
    # A database from before versioned migrations: bare tables, no version table.
    Base.metadata.create_all(engine)
    assert schema_version(engine) == 0
    with engine.begin() as conn:
        for column in ("frame_width", "frame_height", "image_region"):
            conn.exec_driver_sql(f"ALTER TABLE captions DROP COLUMN {column}")
    ensure_schema(engine)
    store = CaptionStore(engine)
    row_id = store.add(new_caption(1, image_region=[10, 10, 200, 200]))
    assert row_id is not None and store.get(row_id).image_region == [10, 10, 200, 200]  # type: ignore[union-attr]


# -- real sockets: readiness, live stream, concurrent writers ------------------------------------------


class ApiThread:
    """The app on a real socket (uvicorn in a thread), for streaming and concurrency."""

    def __init__(self, app: FastAPI) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> ApiThread:
        self._thread.start()
        deadline = time.monotonic() + TIMEOUT
        while not self.server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "API did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(TIMEOUT)


def raw_get(url: str, target: str) -> tuple[int, bytes]:
    """GET with the request target sent as written: httpx (and so TestClient) removes `..` segments before sending,
    so a traversal test through it never reaches the server."""
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=TIMEOUT)
    try:
        connection.request("GET", target, headers={"X-Api-Key": READ_KEY})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def test_dot_dot_paths_never_leave_the_static_directories(data_dir: Path) -> None:
    """`..` in the request target, plain and percent-encoded, reaches the app (uvicorn decodes but never resolves
    it) and must not let the two file-serving mounts, /static and /static/docs, read outside their folders."""
    data_dir.mkdir(parents=True)
    database = data_dir / "visioncap.db"
    app = create_app(settings_for(data_dir, database_url=f"sqlite:///{database}"))
    static = static_dir().resolve()
    docs_package = Path(fastapi_offline.__file__).resolve().parent  # /static/docs serves its static/ folder
    # From /static up past the file system's root (extra `..` stop there), then down to the caption database.
    to_root = "../" * len(static.parts)
    database_below_root = database.resolve().relative_to("/")
    targets = {
        "/static/../app.py": static.parent / "app.py",
        "/static/%2e%2e/app.py": static.parent / "app.py",
        "/static/%2E%2E/app.py": static.parent / "app.py",
        "/static/..%2fapp.py": static.parent / "app.py",
        "/static/%2e%2e%2fapp.py": static.parent / "app.py",
        "/static/./../app.py": static.parent / "app.py",
        "/static/docs/../__init__.py": docs_package / "__init__.py",
        "/static/docs/%2e%2e/__init__.py": docs_package / "__init__.py",
        f"/static/{to_root}{database_below_root}": database,
        f"/static/{to_root.replace('..', '%2e%2e')}{database_below_root}": database,
    }
    with ApiThread(app) as api:
        # The mounts serve over this very client: a 404 below is the guard, not a path that never got there.
        status, body = raw_get(api.url, "/static/app.js")
        assert status == 200 and body == (static / "app.js").read_bytes()
        for target, outside in targets.items():
            assert outside.is_file(), outside  # a file that exists, so only the guard stands in the way
            status, body = raw_get(api.url, target)
            assert status == 404, (target, status, body[:200])
            assert outside.read_bytes()[:64] not in body, target


def test_readiness_needs_the_database_and_the_vlm(seed: Seed, data_dir: Path, vllm_server: VllmServer) -> None:
    up = create_app(settings_for(data_dir, vlm_base_url=vllm_server.base_url, vlm_api_key="vlm-key"))
    with ApiThread(up) as api:
        ready = httpx.get(f"{api.url}/readyz", headers={"X-Api-Key": READ_KEY}, timeout=TIMEOUT)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ready" and set(ready.json()["checks"]) == {"database", "vlm", "ask"}
    with TestClient(create_app(settings_for(data_dir)), headers={"X-Api-Key": READ_KEY}) as down:
        answer = down.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["checks"]["database"]["ok"] is True and answer.json()["checks"]["vlm"]["ok"] is False
    with TestClient(
        create_app(settings_for(data_dir, api_ready_check_vlm=False)), headers={"X-Api-Key": READ_KEY}
    ) as c:
        assert c.get("/readyz").status_code == 200


def test_stream_sends_captions_as_they_are_stored_with_filters(app: FastAPI, store: CaptionStore) -> None:
    waiting = store.add(new_caption(500, "cam-9", people=2))  # pending before the stream opens
    assert waiting is not None
    with ApiThread(app) as api, httpx.Client(base_url=api.url, headers={"X-Api-Key": READ_KEY}) as http:
        params = {"camera": ["cam-9", "cam-8"], "min_people": 1}
        with http.stream("GET", "/v1/stream", params=params, timeout=TIMEOUT) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            expected = []
            for index, (camera, people) in enumerate([("cam-7", 2), ("cam-9", 0), ("cam-8", 1), ("cam-9", 3)]):
                row_id = store.add(new_caption(600 + index, camera, people=people))
                assert row_id is not None
                store.mark_captioned(row_id, captioned(f"stream {index}"), attempts=1)
                if camera != "cam-7" and people >= 1:
                    expected.append(row_id)
            store.mark_captioned(waiting, captioned("finally captioned"), attempts=2)
            events = read_caption_events(response, 3)
        assert [event["id"] for event in events] == [*expected, waiting]
        assert events[-1]["caption"] == "finally captioned" and events[0]["status"] == "captioned"
        assert http.get("/v1/stream", params={"min_people": "x"}).status_code == 422


def test_api_reads_while_a_pipeline_writes(app: FastAPI, store: CaptionStore, data_dir: Path) -> None:
    errors: list[str] = []
    stop = threading.Event()

    def pipeline_writer() -> int:
        outbox = Outbox(store, data_dir, OutboxConfig(capacity=1000), PipelineMetrics())
        written = 0
        for index in range(150):
            _, row_id = outbox.put(new_caption(1000 + index, f"cam-{index % 5}", people=index % 3), jpeg())
            assert row_id is not None
            store.mark_captioned(row_id, captioned(f"busy scene number {index}"), attempts=1)
            written += 1
        stop.set()
        return written

    def reader(http: httpx.Client) -> int:
        requests = 0
        while not stop.is_set():
            for path, params in (
                ("/v1/captions", {"q": "busy scene", "limit": 20}),
                ("/v1/captions", {"camera": "cam-1", "min_people": 1}),
                ("/v1/cameras", {}),
            ):
                response = http.get(path, params=params)
                requests += 1
                if response.status_code != 200:
                    errors.append(f"{path}: {response.status_code} {response.text[:200]}")
        return requests

    with (
        ApiThread(app) as api,
        httpx.Client(base_url=api.url, headers={"X-Api-Key": READ_KEY}, timeout=TIMEOUT) as http,
    ):
        with ThreadPoolExecutor(4) as pool:
            readers = [pool.submit(reader, http) for _ in range(3)]
            written = pool.submit(pipeline_writer).result(timeout=120)
            reads = sum(future.result(timeout=TIMEOUT) for future in readers)
        final = http.get("/v1/captions", params={"q": "busy scene", "limit": 100}).json()
        stats = http.get("/v1/cameras").json()
    assert errors == []
    assert written == 150 and reads > 0
    assert len(final["items"]) == 100 and final["next_cursor"]
    assert sum(item["by_status"]["captioned"] for item in stats["items"]) >= 150


def test_web_page_is_served_and_works_offline(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    # Every module the bundle has, each served: the page loads them by relative imports from app.js.
    static = Path(visioncap.api.__file__).parent / "static"
    assets = [f"/static/{path.name}" for path in sorted(static.iterdir()) if path.suffix in (".js", ".css")]
    assert "/static/app.js" in assets and "/static/style.css" in assets
    served = {asset: client.get(asset) for asset in assets}
    assert all(response.status_code == 200 for response in served.values()), served
    scripts = "\n".join(response.text for asset, response in served.items() if asset.endswith(".js"))
    sources = [page.text, *(response.text for response in served.values())]
    assert not any("http://" in text or "https://" in text for text in sources)  # no CDN
    assert all(name in page.text for name in ('id="q"', 'id="camera"', 'id="since"', 'id="until"'))
    assert "/v1/stream" in scripts and "/v1/captions" in scripts
