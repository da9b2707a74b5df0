"""/v1/alerts and /v1/alerts/rules on the real app and SQLite: the file's rules read-only, rules made through the
API applied by the engine, what fired listed with filters and cursors."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alerts_support import add_caption
from fastapi.testclient import TestClient
from helpers import offline_api_settings
from sqlalchemy import insert

from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.store import api_rules
from visioncap.api import create_app
from visioncap.config.alerts import load_alerts_config
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.store import CaptionStore
from visioncap.store.records import AlertRuleRecord

READ_KEY = "alerts-read-key"
WRITE_KEY = "alerts-write-key"
T0 = datetime(2026, 5, 1, 8, 0, tzinfo=UTC)
ALERTS_FILE = """
webhooks:
  - name: hook
    url: http://127.0.0.1:9/hook
rules:
  - name: crowd
    min_people: 3
    cooldown_s: 0
"""


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[TestClient, CaptionStore, Path]]:
    alerts_file = tmp_path / "alerts.yaml"
    alerts_file.write_text(ALERTS_FILE)
    settings = ApiSettings(
        data_dir=tmp_path / "data",
        vlm_base_url="http://127.0.0.1:9/v1",
        alerts_config=alerts_file,
        api_keys=[
            ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"}),
            ApiKey(name="admin", sha256=hash_key(WRITE_KEY), scopes={"read", "write"}),
        ],
    )
    app = create_app(settings)
    with TestClient(app, headers={"Authorization": f"Bearer {WRITE_KEY}"}) as client:
        yield client, CaptionStore(app.state.api.engine), alerts_file


def test_rules_crud_and_file_rules_read_only(setup: tuple[TestClient, CaptionStore, Path]) -> None:
    client, _, _ = setup
    listed = client.get("/v1/alerts/rules").json()
    assert [(item["rule"]["name"], item["source"], item["read_only"]) for item in listed["items"]] == [
        ("crowd", "file", True)
    ]
    assert listed["destinations"] == ["hook"]  # what `notify` may name, for the web page's form
    reader = {"Authorization": f"Bearer {READ_KEY}"}
    new = {"name": "forklift", "words": ["forklift"], "cooldown_s": 0}
    assert client.post("/v1/alerts/rules", json=new, headers=reader).status_code == 403
    assert client.post("/v1/alerts/rules", json=new).status_code == 201
    assert client.post("/v1/alerts/rules", json=new).status_code == 409
    assert client.post("/v1/alerts/rules", json={"name": "crowd"}).status_code == 409
    refused = client.post("/v1/alerts/rules", json={"name": "x", "notify": ["nowhere"]})
    assert (refused.status_code, refused.json()["error"]["param"]) == (422, "notify")
    assert client.post("/v1/alerts/rules", json={"name": "bad/name"}).status_code == 422
    assert client.patch("/v1/alerts/rules/crowd", json={"min_people": 1}).status_code == 409
    assert client.delete("/v1/alerts/rules/crowd").status_code == 409
    patched = client.patch("/v1/alerts/rules/forklift", json={"cameras": ["dock"]})
    assert patched.status_code == 200 and patched.json()["rule"]["cameras"] == ["dock"]
    assert patched.json()["rule"]["words"] == ["forklift"]
    assert client.patch("/v1/alerts/rules/forklift", json={"min_people": -1}).status_code == 422
    assert client.patch("/v1/alerts/rules/forklift", json={"name": "other"}).status_code == 422
    assert client.patch("/v1/alerts/rules/none", json={}).status_code == 404
    assert [item["rule"]["name"] for item in client.get("/v1/alerts/rules").json()["items"]] == ["crowd", "forklift"]
    assert client.delete("/v1/alerts/rules/forklift").status_code == 204
    assert client.delete("/v1/alerts/rules/forklift").status_code == 404


def test_without_an_alerts_file_destinations_are_unknown_and_notify_is_not_checked(tmp_path: Path) -> None:
    settings = offline_api_settings(tmp_path / "data", f"sqlite:///{tmp_path / 'api.db'}", WRITE_KEY)
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {WRITE_KEY}"}) as client:
        made = client.post("/v1/alerts/rules", json={"name": "gate", "notify": ["pager"]})
        assert made.status_code == 201
        listed = client.get("/v1/alerts/rules").json()
    assert listed["destinations"] is None
    assert [item["rule"]["notify"] for item in listed["items"]] == [["pager"]]


def test_a_stored_rule_this_version_refuses_is_left_out_and_can_be_deleted(
    setup: tuple[TestClient, CaptionStore, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A rule an older version stored with a word this one refuses (a NUL) must not stop the other rules."""
    client, store, _ = setup
    assert client.post("/v1/alerts/rules", json={"name": "forklift", "words": ["forklift"]}).status_code == 201
    with store.engine.begin() as conn:  # as the older version wrote it: its JSON, NUL and all
        conn.execute(insert(AlertRuleRecord).values(name="legacy", definition={"name": "legacy", "words": ["a\x00b"]}))
    names = [item["rule"]["name"] for item in client.get("/v1/alerts/rules").json()["items"]]
    assert names == ["crowd", "forklift"]
    assert "stored rule 'legacy' is not valid any more" in caplog.text
    assert [rule.name for rule in api_rules(store.engine)] == ["forklift"]
    assert client.delete("/v1/alerts/rules/legacy").status_code == 204
    assert client.delete("/v1/alerts/rules/legacy").status_code == 404


def test_alerts_listed_with_filters_and_pages(setup: tuple[TestClient, CaptionStore, Path]) -> None:
    client, store, alerts_file = setup
    assert client.post("/v1/alerts/rules", json={"name": "forklift", "words": ["forklift"], "cooldown_s": 0}).is_success
    engine = AlertEngine(store.engine, load_alerts_config(alerts_file), AlertMetrics())
    ids = [
        add_caption(store, "dock", T0, "a forklift", people=4),  # crowd, forklift
        add_caption(store, "yard", T0 + timedelta(minutes=1), "a forklift", people=1),  # forklift
        add_caption(store, "yard", T0 + timedelta(minutes=2), "people", people=3),  # crowd
    ]
    while engine.run_once():
        pass

    def listed(**params: object) -> list[tuple[str, int]]:
        page = client.get("/v1/alerts", params=params).json()
        return [(item["rule"], item["caption_id"]) for item in page["items"]]

    assert listed() == [("crowd", ids[2]), ("forklift", ids[1]), ("forklift", ids[0]), ("crowd", ids[0])]
    assert listed(rule="crowd") == [("crowd", ids[2]), ("crowd", ids[0])]
    assert listed(camera="yard") == [("crowd", ids[2]), ("forklift", ids[1])]
    assert listed(since=(T0 + timedelta(minutes=1)).isoformat(), until=(T0 + timedelta(minutes=2)).isoformat()) == [
        ("forklift", ids[1])
    ]
    assert listed(state="pending") == [("crowd", ids[2]), ("forklift", ids[1]), ("forklift", ids[0]), ("crowd", ids[0])]
    assert listed(state="delivered") == []
    first = client.get("/v1/alerts", params={"limit": 3}).json()
    assert len(first["items"]) == 3 and first["items"][0]["deliveries"][0]["destination"] == "hook"
    rest = client.get("/v1/alerts", params={"limit": 3, "cursor": first["next_cursor"]}).json()
    assert [(item["rule"], item["caption_id"]) for item in rest["items"]] == [("crowd", ids[0])]
    assert rest["next_cursor"] is None
    assert client.get("/v1/alerts", params={"cursor": "!!"}).status_code == 422
