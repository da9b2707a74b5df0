"""API keys limited to some cameras (`cameras` of ApiKey): every route shows such a key none of another camera's
rows, in the query itself (pages stay full, cursors right), and a single row of another camera answers 404 like
an id that does not exist.

Real parts: captions written by the store and outbox into a SQLite file (two cameras, `garage` always the newest,
so a page filtered after the query would come back short or empty), the alert engine firing on them, the API in
this process (TestClient) or on a real socket for the live stream, and the session's vLLM for Ask's citations.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers import TINY_MODEL, invoke_cli, read_caption_events
from PIL import Image
from pydantic import ValidationError
from taps import AsgiThread

from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.api import create_app
from visioncap.config.alerts import load_alerts_config
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine

ADMIN_KEY = "scopes-admin-key"  # read and write, every camera
LOBBY_KEY = "scopes-lobby-key"  # read, lobby only
LOBBY_WRITER_KEY = "scopes-lobby-writer-key"  # read and write, lobby only
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
LOBBY = {"Authorization": f"Bearer {LOBBY_KEY}"}
LOBBY_WRITER = {"Authorization": f"Bearer {LOBBY_WRITER_KEY}"}
T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
TIMEOUT = 60  # seconds; a bound on a broken test, never a measurement
TEXTS = {
    "lobby": "a person walking past the front desk",
    "garage": "a person walking past a parked car",
}
ALERTS_FILE = """
webhooks:
  - name: hook
    url: http://127.0.0.1:9/hook
rules:
  - name: anyone
    min_people: 1
    cooldown_s: 0
  - name: lobby-watch
    cameras: [lobby]
    min_people: 1
    cooldown_s: 0
"""


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (40, 40, 40)).save(out, format="JPEG")
    return out.getvalue()


def new_caption(index: int, camera: str) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=index,
        offset_s=float(index),
        captured_at=T0 + timedelta(minutes=index),
        reason="new-event",
        people=[{"x1": 1.0, "y1": 1.0, "x2": 20.0, "y2": 40.0, "confidence": 0.9, "class_id": 0, "track_id": 1}],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"{camera}:{index}",
        event_ids=[1],
        score=0.5,
        frame_width=64,
        frame_height=48,
    )


def add_captioned(store: CaptionStore, outbox: Outbox, index: int, camera: str) -> int:
    _, row_id = outbox.put(new_caption(index, camera), jpeg())
    assert row_id is not None
    store.mark_captioned(row_id, Caption(f"{TEXTS[camera]} ({index})", "tiny", 300, 12, 0.5), attempts=1)
    return row_id


@dataclass
class Site:
    data_dir: Path
    store: CaptionStore
    outbox: Outbox
    ids: dict[str, list[int]]  # camera -> ids, newest first
    alerts_file: Path

    def settings(self, **changes: Any) -> ApiSettings:
        values: dict[str, Any] = {
            "data_dir": self.data_dir,
            "database_url": f"sqlite:///{self.data_dir / 'visioncap.db'}",
            "vlm_base_url": "http://127.0.0.1:9/v1",  # discard port: nothing answers
            "alerts_config": self.alerts_file,
            "api_keys": [
                ApiKey(name="admin", sha256=hash_key(ADMIN_KEY), scopes={"read", "write"}),
                ApiKey(name="guard", sha256=hash_key(LOBBY_KEY), scopes={"read"}, cameras=["lobby"]),
                ApiKey(
                    name="lobby-admin", sha256=hash_key(LOBBY_WRITER_KEY), scopes={"read", "write"}, cameras=["lobby"]
                ),
            ],
            "api_stream_poll_s": 0.05,
            **changes,
        }
        return ApiSettings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
def site(tmp_path: Path) -> Site:
    """Six lobby rows interleaved with garage rows, then four garage rows newer than all of them."""
    data_dir = tmp_path / "data"
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics())
    ids: dict[str, list[int]] = {"lobby": [], "garage": []}
    cameras = ["lobby", "garage"] * 6 + ["garage"] * 4
    for index, camera in enumerate(cameras):
        ids[camera].insert(0, add_captioned(store, outbox, index, camera))
    alerts_file = tmp_path / "alerts.yaml"
    alerts_file.write_text(ALERTS_FILE)
    return Site(data_dir, store, outbox, ids, alerts_file)


@pytest.fixture
def client(site: Site) -> Iterator[TestClient]:
    with TestClient(create_app(site.settings()), raise_server_exceptions=False) as client:
        yield client


def pages(client: TestClient, headers: dict[str, str], **params: Any) -> list[list[int]]:
    """Every page of GET /v1/captions, following next_cursor."""
    found: list[list[int]] = []
    cursor = None
    for _ in range(50):
        response = client.get(
            "/v1/captions", params={**params, **({"cursor": cursor} if cursor else {})}, headers=headers
        )
        assert response.status_code == 200, response.text
        found.append([item["id"] for item in response.json()["items"]])
        assert all(item["camera"] == "lobby" for item in response.json()["items"]) or headers is ADMIN
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return found
    raise AssertionError("pagination does not end")


# -- the key's field, the CLI ----------------------------------------------------------------------------------


def test_api_keys_take_a_camera_list_and_refuse_a_malformed_one() -> None:
    key = ApiKey.model_validate({"name": "guard", "sha256": "a" * 64, "cameras": ["lobby", "front-door"]})
    assert key.cameras == ["lobby", "front-door"]
    assert ApiKey.model_validate({"name": "all", "sha256": "a" * 64}).cameras is None
    for cameras in ([], ["bad name"], [""], "lobby"):
        with pytest.raises(ValidationError):
            ApiKey.model_validate({"name": "guard", "sha256": "a" * 64, "cameras": cameras})


def test_the_api_key_command_prints_an_entry_limited_to_its_cameras() -> None:
    made = invoke_cli("api-key", "--name", "guard", "--camera", "lobby", "--camera", "door")
    assert made.returncode == 0, made.stderr
    entry = json.loads(made.stdout.split("entry:", 1)[1])
    key = made.stdout.split("key:", 1)[1].split()[0]
    assert entry == {"name": "guard", "sha256": hash_key(key), "scopes": ["read"], "cameras": ["lobby", "door"]}
    ApiKey.model_validate(entry)  # what the API takes at start
    unlimited = json.loads(invoke_cli("api-key").stdout.split("entry:", 1)[1])
    assert "cameras" not in unlimited
    refused = invoke_cli("api-key", "--camera", "no spaces")
    assert refused.returncode != 0 and "--camera" in refused.stderr


# -- captions: list, words, semantic and hybrid search, one caption, its image, regeneration -------------------


def test_a_limited_key_lists_only_its_cameras_in_full_pages(client: TestClient, site: Site) -> None:
    found = pages(client, LOBBY, limit=2)
    # Full pages: the four newest rows are the garage's, so a page filtered after the query would be empty.
    assert found == [site.ids["lobby"][i : i + 2] for i in range(0, 6, 2)]
    assert pages(client, LOBBY, limit=4, camera="lobby,garage") == [site.ids["lobby"][:4], site.ids["lobby"][4:]]
    assert pages(client, LOBBY, camera="garage") == [[]]  # as for a camera that does not exist
    assert pages(client, LOBBY, status="captioned", min_people=1, limit=5) == [
        site.ids["lobby"][:5],
        site.ids["lobby"][5:],
    ]
    # The admin sees both: the test data holds what the limited key must not see.
    assert [row for page in pages(client, ADMIN, limit=100) for row in page] == sorted(
        site.ids["lobby"] + site.ids["garage"], reverse=True
    )


def test_a_limited_key_finds_words_only_in_its_cameras(client: TestClient, site: Site) -> None:
    assert pages(client, LOBBY, q="person walking", limit=3) == [site.ids["lobby"][:3], site.ids["lobby"][3:]]
    assert pages(client, LOBBY, q="parked car") == [[]]
    assert [row for page in pages(client, ADMIN, q="parked car", limit=100) for row in page] == site.ids["garage"]


def test_a_limited_key_ranks_by_meaning_only_its_cameras(site: Site) -> None:
    app = create_app(site.settings(api_semantic_search=True))
    with TestClient(app, raise_server_exceptions=False) as client:
        assert app.state.api.background_embedder.wait_embedded(16, timeout_s=120)
        for hybrid in (False, True):
            seen: list[int] = []
            cursor = None
            for _ in range(10):
                params: dict[str, Any] = {"semantic": "a parked car", "hybrid": hybrid, "limit": 4}
                page = client.get(
                    "/v1/captions", params={**params, **({"cursor": cursor} if cursor else {})}, headers=LOBBY
                )
                assert page.status_code == 200, page.text
                seen += [item["id"] for item in page.json()["items"]]
                cursor = page.json()["next_cursor"]
                if cursor is None:
                    break
            assert sorted(seen) == sorted(site.ids["lobby"]), hybrid  # all of its own, none of the garage's
            admin = client.get("/v1/captions", params={"semantic": "a parked car", "limit": 4}, headers=ADMIN).json()
            assert {item["camera"] for item in admin["items"]} == {"garage"}  # the garage's rank first for the admin


def test_another_cameras_caption_image_and_regeneration_answer_404_as_an_unknown_id(
    client: TestClient, site: Site
) -> None:
    garage, lobby = site.ids["garage"][0], site.ids["lobby"][0]
    unknown = 10**6
    for key in (LOBBY, LOBBY_WRITER):
        for path in ("/v1/captions/{}", "/v1/captions/{}/image", "/v1/captions/{}/image?boxes=true"):
            hidden = client.get(path.format(garage), headers=key)
            missing = client.get(path.format(unknown), headers=key)
            assert hidden.status_code == missing.status_code == 404, (path, hidden.text)
            assert hidden.json()["error"]["message"].replace(str(garage), "N") == missing.json()["error"][
                "message"
            ].replace(str(unknown), "N")
            assert client.get(path.format(lobby), headers=key).status_code == 200, path
    refused = client.post(f"/v1/captions/{garage}/regenerate", headers=LOBBY_WRITER)
    assert refused.status_code == 404
    assert site.store.get(garage).status == "captioned"  # type: ignore[union-attr]
    assert client.post(f"/v1/captions/{lobby}/regenerate", headers=LOBBY_WRITER).status_code == 202
    assert client.get(f"/v1/captions/{garage}", headers=ADMIN).status_code == 200


# -- the live stream -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{}, {"camera": "garage,lobby"}])
def test_a_limited_keys_stream_sends_only_its_cameras(site: Site, params: dict[str, str]) -> None:
    """A garage row is stored before each lobby row: had it been sent, it would be the first event."""
    with (
        AsgiThread(create_app(site.settings()), lifespan=True) as api,
        httpx.Client(base_url=api.root_url, headers=LOBBY, timeout=TIMEOUT) as http,
        http.stream("GET", "/v1/stream", params=params) as response,
    ):
        assert response.status_code == 200
        expected = []
        for index in range(100, 104, 2):
            add_captioned(site.store, site.outbox, index, "garage")
            expected.append(add_captioned(site.store, site.outbox, index + 1, "lobby"))
        events = read_caption_events(response, 2)
    assert [event["id"] for event in events] == expected
    assert {event["camera"] for event in events} == {"lobby"}


# -- Ask -------------------------------------------------------------------------------------------------------


def ask(client: TestClient, question: str, headers: dict[str, str]) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={"model": TINY_MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": 4},
        headers=headers,
    )


def test_ask_for_a_limited_key_retrieves_nothing_of_another_camera_without_the_vlm(client: TestClient) -> None:
    """The VLM is unreachable here: the admin's question finds the garage's captions and so fails at the VLM (503),
    the limited key's finds none of them (`garage` is no camera to it, and no lobby caption has the word) and is
    answered without the VLM."""
    question = "What happened on the garage camera?"
    assert ask(client, question, ADMIN).status_code == 503
    answer = ask(client, question, LOBBY)
    assert answer.status_code == 200, answer.text
    context = answer.json()["visioncap"]
    assert context["retrieved"] == [] and context["citations"] == [] and context["cameras"] == []


@pytest.mark.vllm
def test_ask_for_a_limited_key_retrieves_and_cites_only_its_cameras(site: Site, vllm_server: VllmServer) -> None:
    settings = site.settings(vlm_base_url=vllm_server.base_url, ask_model=TINY_MODEL, ask_top_k=8)
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:
        for question in ("Was a person walking past the car?", "Anyone walking in the garage or the lobby?"):
            answer = ask(client, question, LOBBY)
            assert answer.status_code == 200, answer.text
            context = answer.json()["visioncap"]
            assert context["retrieved"] and set(context["retrieved"]) <= set(site.ids["lobby"]), question
            cited = [citation["caption_id"] for citation in context["citations"]]
            assert cited and set(cited) <= set(site.ids["lobby"]), question
            assert {citation["camera"] for citation in context["citations"]} == {"lobby"}
        admin = ask(client, "Was a person walking past the car?", ADMIN).json()["visioncap"]
        assert set(admin["retrieved"]) & set(site.ids["garage"])  # what the limited key was kept from


# -- alerts and their rules ------------------------------------------------------------------------------------


def test_a_limited_key_lists_only_its_cameras_alerts_in_full_pages(client: TestClient, site: Site) -> None:
    engine = AlertEngine(site.store.engine, load_alerts_config(site.alerts_file), AlertMetrics())  # fires from now on
    fired: dict[str, list[int]] = {"lobby": [], "garage": []}
    for index, camera in enumerate(["lobby", "garage"] * 6 + ["garage"] * 4):
        fired[camera].append(add_captioned(site.store, site.outbox, 200 + index, camera))
    while engine.run_once():
        pass

    def alert_pages(headers: dict[str, str], **params: Any) -> list[list[tuple[str, int]]]:
        found: list[list[tuple[str, int]]] = []
        cursor = None
        for _ in range(50):
            query = {**params, **({"cursor": cursor} if cursor else {})}
            page = client.get("/v1/alerts", params=query, headers=headers)
            assert page.status_code == 200, page.text
            found.append([(item["camera"], item["caption_id"]) for item in page.json()["items"]])
            cursor = page.json()["next_cursor"]
            if cursor is None:
                return found
        raise AssertionError("pagination does not end")

    # Two rules fire on each lobby row (anyone, lobby-watch): 12 alerts, newest first, in pages of 5.
    found = alert_pages(LOBBY, limit=5)
    lobby_alerts = [alert for page in found for alert in page]
    assert [len(page) for page in found] == [5, 5, 2]
    assert len(lobby_alerts) == 12 and {camera for camera, _ in lobby_alerts} == {"lobby"}
    assert {caption for _, caption in lobby_alerts} == set(fired["lobby"])
    assert alert_pages(LOBBY, camera="garage") == [[]]
    admin_cameras = {camera for page in alert_pages(ADMIN, limit=500) for camera, _ in page}
    assert admin_cameras == {"lobby", "garage"}


def test_a_limited_key_sees_and_changes_only_rules_of_its_own_cameras(client: TestClient) -> None:
    for name, cameras in (("everywhere", []), ("garage-only", ["garage"]), ("both", ["lobby", "garage"])):
        made = client.post("/v1/alerts/rules", json={"name": name, "cameras": cameras, "cooldown_s": 0}, headers=ADMIN)
        assert made.status_code == 201, made.text

    def names(headers: dict[str, str]) -> list[str]:
        return [item["rule"]["name"] for item in client.get("/v1/alerts/rules", headers=headers).json()["items"]]

    assert names(ADMIN) == ["anyone", "lobby-watch", "both", "everywhere", "garage-only"]
    assert names(LOBBY) == ["lobby-watch"]  # of the file's rules too, only its own
    for cameras in ([], ["garage"], ["lobby", "garage"]):
        refused = client.post("/v1/alerts/rules", json={"name": "mine", "cameras": cameras}, headers=LOBBY_WRITER)
        assert (refused.status_code, refused.json()["error"]["param"]) == (403, "cameras"), cameras
    made = client.post("/v1/alerts/rules", json={"name": "mine", "cameras": ["lobby"]}, headers=LOBBY_WRITER)
    assert made.status_code == 201, made.text
    for name in ("everywhere", "garage-only", "both", "anyone", "no-such-rule"):
        assert client.patch(f"/v1/alerts/rules/{name}", json={"min_people": 2}, headers=LOBBY_WRITER).status_code == 404
        assert client.delete(f"/v1/alerts/rules/{name}", headers=LOBBY_WRITER).status_code == 404, name
    assert client.patch("/v1/alerts/rules/lobby-watch", json={}, headers=LOBBY_WRITER).status_code == 409
    widened = client.patch("/v1/alerts/rules/mine", json={"cameras": ["lobby", "garage"]}, headers=LOBBY_WRITER)
    assert widened.status_code == 403
    assert client.patch("/v1/alerts/rules/mine", json={"min_people": 2}, headers=LOBBY_WRITER).status_code == 200
    assert names(LOBBY) == ["lobby-watch", "mine"]
    assert client.delete("/v1/alerts/rules/mine", headers=LOBBY_WRITER).status_code == 204
    assert names(ADMIN) == ["anyone", "lobby-watch", "both", "everywhere", "garage-only"]  # the others untouched


# -- cameras, metrics ------------------------------------------------------------------------------------------


def camera_body(camera: str) -> dict[str, Any]:
    return {"pipeline": "p", "source": {"camera": camera, "kind": "rtsp", "url": f"rtsp://cam.local/{camera}"}}


def test_a_limited_key_sees_and_changes_only_its_own_cameras(client: TestClient) -> None:
    assert client.post("/v1/cameras", json=camera_body("garage"), headers=ADMIN).status_code == 201
    assert client.post("/v1/cameras", json=camera_body("attic"), headers=ADMIN).status_code == 201
    listed = client.get("/v1/cameras", headers=LOBBY).json()["items"]
    assert [item["camera"] for item in listed] == ["lobby"] and listed[0]["captions"] == 6
    everyone = [item["camera"] for item in client.get("/v1/cameras", headers=ADMIN).json()["items"]]
    assert everyone == ["attic", "garage", "lobby"]
    # Adding: only its own camera ids, refused before the id is looked up (a 409 would tell that attic exists).
    for camera in ("attic", "cellar"):
        refused = client.post("/v1/cameras", json=camera_body(camera), headers=LOBBY_WRITER)
        assert (refused.status_code, refused.json()["error"]["param"]) == (403, "camera"), camera
    for camera in ("garage", "attic", "cellar"):  # another's camera is as unknown as one that does not exist
        assert client.patch(f"/v1/cameras/{camera}", json={"paused": True}, headers=LOBBY_WRITER).status_code == 404
        assert client.delete(f"/v1/cameras/{camera}", headers=LOBBY_WRITER).status_code == 404
    assert client.post("/v1/cameras", json=camera_body("lobby"), headers=LOBBY_WRITER).status_code == 201
    assert client.patch("/v1/cameras/lobby", json={"paused": True}, headers=LOBBY_WRITER).status_code == 200
    assert client.delete("/v1/cameras/lobby", headers=LOBBY_WRITER).status_code == 204
    configured = {
        item["camera"]: item["config"] is not None for item in client.get("/v1/cameras", headers=ADMIN).json()["items"]
    }
    assert configured == {"attic": True, "garage": True, "lobby": False}  # the others' cameras untouched


def test_site_wide_metrics_need_an_unlimited_key(client: TestClient) -> None:
    refused = client.get("/metrics", headers=LOBBY)
    assert refused.status_code == 403 and "cameras" in refused.json()["error"]["message"]
    assert client.get("/metrics", headers=ADMIN).status_code == 200
