"""Watch rules (#46): the pre-filter's choices, a forced answer through guided decoding on the real vLLM (a choice
list of one JSON string: the random-weight model's own answers are noise) firing exactly one webhook alert or none,
cooldowns, deadlines, a VLM outage, and the decisions listed by the API."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlean
from alerts_support import Receiver
from fastapi.testclient import TestClient
from PIL import Image
from pydantic import ValidationError
from sqlalchemy import select

from visioncap.alerts.decisions import DECISIONS
from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.service import AlertService
from visioncap.alerts.store import add_alert
from visioncap.alerts.verify import Verifier, event_frames
from visioncap.api import create_app
from visioncap.caption.client import CAMERA_HEADER, camera_headers
from visioncap.config.alerts import AlertRule, AlertsConfig
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.frames import Caption, SelectionReason
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.captions import NewCaption

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
DOCK_KEY = "dock-only-key"
ADMIN_KEY = "verify-admin-key"
MATCH = {"match": True, "reason": "a package left at the door"}
NO_MATCH = {"match": False, "reason": "nobody leaves anything"}


def add_framed(store: CaptionStore, data_dir: Path, camera: str, at: datetime, text: str, people: int = 1) -> int:
    """A captioned row with a real stored JPEG, written as the pipeline writes it."""
    name = f"frames/{camera}-{int(at.timestamp())}.jpg"
    (data_dir / "frames").mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 48), (int(at.timestamp()) * 40 % 256, 90, 160)).save(data_dir / name, "JPEG")
    new = NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=0,
        offset_s=0.0,
        captured_at=at,
        reason=SelectionReason.NEW_EVENT,
        people=[{"x1": 1.0, "y1": 1.0, "x2": 9.0, "y2": 9.0, "confidence": 0.9} for _ in range(people)],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"{camera}-event",
        image_path=name,
    )
    row = store.add(new)
    assert row is not None
    store.mark_captioned(row, Caption(text, "tiny", 10, 5, 0.1, None), attempts=1)
    return row


def config(
    base_url: str | None,
    hook_url: str,
    cooldown_s: float = 0,
    from_start: bool = True,
    cameras: tuple[str, ...] = ("door",),
    **verify: Any,
) -> AlertsConfig:
    return AlertsConfig.model_validate(
        {
            "start_at_beginning": from_start,
            "webhooks": [{"name": "hook", "url": hook_url, "timeout_s": 5}],
            "vlm": {"base_url": base_url, "max_tokens": 64},
            "rules": [
                {
                    "name": "package",
                    "cameras": list(cameras),
                    "min_people": 1,
                    "cooldown_s": cooldown_s,
                    "verify": {"question": "a person leaves a package at the front door", **verify},
                }
            ],
            "delivery": {"poll_s": 0.05},
        }
    )


def decisions(store: CaptionStore) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(select(DECISIONS).order_by(DECISIONS.c.id))]


def questions(service: AlertService, rule: str = "package") -> dict[str, float]:
    """`visioncap_alert_questions_total` of one rule, by answer (those counted)."""
    counts = {
        answer: service.metrics.registry.get_sample_value(
            "visioncap_alert_questions_total", {"rule": rule, "answer": answer}
        )
        for answer in ("match", "no_match", "error")
    }
    return {answer: count for answer, count in counts.items() if count}


@pytest.fixture
def site(tmp_path: Path) -> tuple[CaptionStore, Path]:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    return store, data_dir


@pytest.fixture
def db_site(database_url: str, tmp_path: Path) -> tuple[CaptionStore, Path, str]:
    """As `site`, on SQLite and on PostgreSQL."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    store = CaptionStore(create_db_engine(database_url))
    store.create_schema()
    return store, data_dir, database_url


def one_candidate_asked(service: AlertService, store: CaptionStore, data_dir: Path) -> int:
    """A person with a box at the door, the engine's and the workers' passes over it, the service stopped: its id."""
    try:
        candidate = add_framed(store, data_dir, "door", T0, "a person with a box at the door")
        drain(service)
    finally:
        service.stop()
    return candidate


def drain(service: AlertService) -> None:
    """The engine's passes, then each delivery worker's, in this thread: no timing involved."""
    while service.engine.run_once() > 0:
        pass
    for worker in service.workers:
        while worker.run_once() > 0:
            pass


def test_verify_section_validates() -> None:
    rule = {"name": "r", "verify": {"question": "someone climbs the fence"}}
    assert AlertsConfig.model_validate({"rules": [rule]}).rules[0].verify is not None
    for bad in (
        {"question": ""},
        {"question": "x", "max_frames": 0},
        {"question": "x", "deadline_s": 0},
        {"question": "x", "deadline_s": "5"},
        {"question": "x", "min_similarity": 2},
        {"question": "x", "force_answer": {"match": "yes"}},
        {"question": "x", "unknown": 1},
    ):
        with pytest.raises(ValueError):
            AlertsConfig.model_validate({"rules": [{"name": "r", "verify": bad}]})


def test_outage_is_a_stored_decision_listed_by_camera_scope(
    db_site: tuple[CaptionStore, Path, str], tmp_path: Path
) -> None:
    """A VLM that is not there: every candidate gets a decision with the error, nothing fires, the engine goes on;
    the API validates `verify` on rules and lists decisions, a camera-limited key only its cameras'."""
    store, data_dir, database_url = db_site
    alerts_file = tmp_path / "alerts.yaml"
    alerts_file.write_text("webhooks:\n  - name: hook\n    url: http://127.0.0.1:9/hook\n")
    settings = ApiSettings(
        data_dir=data_dir,
        database_url=database_url,
        vlm_base_url="http://127.0.0.1:9/v1",
        alerts_config=alerts_file,
        api_keys=[
            ApiKey(name="admin", sha256=hash_key(ADMIN_KEY), scopes={"read", "write"}),
            ApiKey(name="dock", sha256=hash_key(DOCK_KEY), scopes={"read"}, cameras=["dock"]),
        ],
    )
    app = create_app(settings)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        bad = client.post("/v1/alerts/rules", json={"name": "w", "verify": {"question": "x", "max_frames": 99}})
        assert bad.status_code == 422
        # The test hook is the alerts file's only: a key must not decide the VLM's verdict.
        forced = {"name": "w", "verify": {"question": "x", "force_answer": {"match": True, "reason": "r"}}}
        refused = client.post("/v1/alerts/rules", json=forced)
        assert refused.status_code == 422 and refused.json()["error"]["param"] == "verify.force_answer"
        rule = {"name": "watch", "cooldown_s": 0, "verify": {"question": "someone climbs the fence"}}
        assert client.post("/v1/alerts/rules", json=rule).status_code == 201
        down = config("http://127.0.0.1:9/v1", "http://127.0.0.1:9/hook")
        service = AlertService(store.engine, down.model_copy(update={"rules": []}), data_dir=data_dir)
        try:
            add_framed(store, data_dir, "door", T0, "a person at the fence")
            add_framed(store, data_dir, "dock", T0, "a person at the dock")
            drain(service)
        finally:
            service.stop()
        stored = decisions(store)
        assert [(d["rule"], d["camera"], d["match"], d["alert_id"]) for d in stored] == [
            ("watch", "door", None, None),
            ("watch", "dock", None, None),
        ]
        assert all("unreachable" in d["error"] for d in stored)
        assert questions(service, "watch") == {"error": 2}
        assert (
            service.metrics.registry.get_sample_value("visioncap_alert_question_seconds_count", {"rule": "watch"})
            is None
        )
        assert client.get("/v1/alerts").json()["items"] == []

        everything = client.get("/v1/alerts/decisions").json()
        assert [item["camera"] for item in everything["items"]] == ["dock", "door"]  # newest first
        dock = {"Authorization": f"Bearer {DOCK_KEY}"}
        assert [item["camera"] for item in client.get("/v1/alerts/decisions", headers=dock).json()["items"]] == ["dock"]
        assert client.get("/v1/alerts/decisions?camera=door", headers=dock).json()["items"] == []
        first = client.get("/v1/alerts/decisions?limit=1").json()
        rest = client.get(f"/v1/alerts/decisions?limit=1&before={first['next_cursor']}").json()
        assert [item["camera"] for item in first["items"] + rest["items"]] == ["dock", "door"]
        assert client.get("/v1/alerts/decisions?limit=0").status_code == 422
        assert len(client.get("/v1/alerts/decisions?answer=error").json()["items"]) == 2
        assert client.get("/v1/alerts/decisions?answer=match&answer=no_match").json()["items"] == []
        door = stored[0]["caption_id"]
        [about] = client.get(f"/v1/alerts/decisions?caption_id={door}").json()["items"]
        assert about["camera"] == "door"
        # Refused before the database: an id past PostgreSQL's INTEGER failed there (500) as `before`.
        for bad in ("answer=yes", "caption_id=2147483648", "before=2147483648", "caption_id=0"):
            assert client.get(f"/v1/alerts/decisions?{bad}").status_code == 422, bad


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver([200]) as found:
        yield found


@pytest.mark.vllm
def test_forced_match_fires_one_alert_and_non_candidates_are_not_asked(
    vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver
) -> None:
    store, data_dir = site
    service = AlertService(
        store.engine, config(vllm_server.base_url, receiver.url, force_answer=MATCH), data_dir=data_dir
    )
    try:
        candidate = add_framed(store, data_dir, "door", T0, "a person with a box at the door")
        add_framed(store, data_dir, "yard", T0, "a person in the yard")  # another camera: not a candidate
        add_framed(store, data_dir, "door", T0 + timedelta(seconds=1), "an empty porch", people=0)  # nobody
        drain(service)
        assert service.engine.verifier is not None and service.engine.verifier.requests == 1
    finally:
        service.stop()
    bodies = receiver.bodies()
    assert len(bodies) == 1
    assert bodies[0]["caption_id"] == candidate and bodies[0]["rule"] == "package"
    assert bodies[0]["verification"] == {
        "question": "a person leaves a package at the front door",
        "reason": MATCH["reason"],
        "frame": f"/v1/captions/{candidate}/image",
    }
    [decision] = decisions(store)
    assert (decision["caption_id"], decision["match"], decision["reason"], decision["error"]) == (
        candidate,
        True,
        MATCH["reason"],
        None,
    )
    assert decision["alert_id"] == bodies[0]["alert_id"] and decision["frames"] == 1
    assert questions(service) == {"match": 1}
    answered = service.metrics.registry.get_sample_value("visioncap_alert_question_seconds_count", {"rule": "package"})
    assert answered == 1
    assert decision["prompt_tokens"] > 0 and decision["completion_tokens"] > 0 and decision["latency_ms"] > 0
    # The API's alert carries the question and the reason of the decision that fired it.
    settings = ApiSettings(
        data_dir=data_dir,
        database_url=str(store.engine.url),
        api_keys=[ApiKey(name="admin", sha256=hash_key(ADMIN_KEY), scopes={"read"})],
    )
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as client:
        [alert] = client.get("/v1/alerts").json()["items"]
    assert alert["verification"] == {
        "decision_id": decision["id"],
        "question": "a person leaves a package at the front door",
        "reason": MATCH["reason"],
    }


class WritesWhileAsking:
    """The real verifier (the real vLLM behind it), and at each question a write from another connection that may
    not wait (SQLite's busy timeout 0): whether the database took writes while the VLM was being asked."""

    def __init__(self, real: Verifier, database: Path) -> None:
        self.real = real
        self.database = database
        self.writable: list[bool] = []

    @property
    def requests(self) -> int:
        return self.real.requests

    def close(self) -> None:
        self.real.close()

    def ask(self, spec: Any, text: str, frames: Any, camera: str | None = None) -> Any:
        # sqlean, the SQLite the store uses: two SQLite libraries in one process do not see each other's locks.
        other = sqlean.connect(str(self.database), timeout=0)
        try:
            other.execute("BEGIN IMMEDIATE")  # the write lock, as the pipeline's next insert would take it
            other.rollback()
            self.writable.append(True)
        except sqlean.OperationalError:
            self.writable.append(False)
        finally:
            other.close()
        return self.real.ask(spec, text, frames, camera)


def test_the_vlm_is_asked_with_no_transaction_open_so_the_pipeline_keeps_writing(
    vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver
) -> None:
    """A question may take its whole deadline (20 s by default): asked inside the page's transaction, which holds
    the alerts cursor's row (SQLite's write lock), it stopped every insert of the pipeline for that long."""
    store, data_dir = site
    alerts = config(vllm_server.base_url, receiver.url, cooldown_s=60, force_answer=MATCH)
    service = AlertService(store.engine, alerts, data_dir=data_dir)
    spy = WritesWhileAsking(Verifier(alerts.vlm, vllm_server.base_url, ""), data_dir / "visioncap.db")
    service.engine.verifier = spy  # type: ignore[assignment]
    try:
        first = add_framed(store, data_dir, "door", T0, "a person at the door")
        add_framed(store, data_dir, "door", T0 + timedelta(seconds=30), "a person at the door again")  # cooling
        later = add_framed(store, data_dir, "door", T0 + timedelta(seconds=90), "a person at the door later")
        drain(service)
    finally:
        service.stop()
    # Asked about twice in one page (the cooling one not at all: the page's own first answer cools it), and each
    # time the database took a write at once.
    assert spy.writable == [True, True]
    assert [body["caption_id"] for body in receiver.bodies()] == [first, later]
    assert [(d["caption_id"], d["match"]) for d in decisions(store)] == [(first, True), (later, True)]


def test_without_a_vlm_in_the_alerts_file_the_settings_endpoint_is_asked(
    vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An alerts file whose `vlm` names no base URL, an engine built without a verifier: the question goes to
    VISIONCAP_VLM_BASE_URL (here the real vLLM), as `visioncap alerts` would send it, not to an address of the
    engine's own."""
    store, data_dir = site
    monkeypatch.setenv("VISIONCAP_VLM_BASE_URL", vllm_server.base_url)
    service = AlertService(store.engine, config(None, receiver.url, force_answer=MATCH), data_dir=data_dir)
    candidate = one_candidate_asked(service, store, data_dir)
    [decision] = decisions(store)
    assert (decision["caption_id"], decision["match"], decision["error"]) == (candidate, True, None)
    assert [body["caption_id"] for body in receiver.bodies()] == [candidate]


@pytest.mark.vllm
@pytest.mark.postgres
def test_a_nul_in_the_models_reason_is_stored_without_it(
    vllm_server: VllmServer, db_site: tuple[CaptionStore, Path, str], receiver: Receiver
) -> None:
    """The model's JSON may escape a NUL into its reason: PostgreSQL refuses it in a text column, which failed the
    engine's page (and every retry of it). Forced through guided decoding, so the real model writes it."""
    store, data_dir, _ = db_site
    answer = {"match": True, "reason": "left\x00 a box"}
    service = AlertService(
        store.engine, config(vllm_server.base_url, receiver.url, force_answer=answer), data_dir=data_dir
    )
    candidate = one_candidate_asked(service, store, data_dir)
    [decision] = decisions(store)
    assert (decision["caption_id"], decision["match"], decision["reason"]) == (candidate, True, "left a box")
    assert [body["verification"]["reason"] for body in receiver.bodies()] == ["left\x00 a box"]


def test_a_rule_text_with_a_control_character_is_refused() -> None:
    """Refused where a key holder writes it (422 through the API), not stored to fail each decision's insert."""
    rule = {"name": "r", "verify": {"question": "q"}}
    for field, value in [
        ("words", ["a\x00b"]),
        ("activities", ["a\x1bb"]),
        ("semantic", {"text": "a\x00b"}),
        ("verify", {"question": "a\x00b"}),
    ]:
        with pytest.raises(ValidationError, match="control characters"):
            AlertRule.model_validate({**rule, field: value})
    assert AlertRule.model_validate({**rule, "words": ["tab\tok"], "verify": {"question": "line\nbreak"}})


@pytest.mark.vllm
def test_forced_non_match_fires_nothing(
    vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver
) -> None:
    store, data_dir = site
    service = AlertService(
        store.engine, config(vllm_server.base_url, receiver.url, force_answer=NO_MATCH), data_dir=data_dir
    )
    try:
        add_framed(store, data_dir, "door", T0, "a person at the door")
        add_framed(store, data_dir, "door", T0 + timedelta(seconds=5), "a person still at the door")
        drain(service)
    finally:
        service.stop()
    assert receiver.bodies() == []
    stored = decisions(store)
    assert [(d["match"], d["reason"], d["alert_id"], d["error"]) for d in stored] == [
        (False, NO_MATCH["reason"], None, None)
    ] * 2
    assert questions(service) == {"no_match": 2}


@pytest.mark.vllm
def test_a_stored_camera_no_header_can_carry_is_asked_about_without_one(
    vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver
) -> None:
    """A row's camera that is no camera id (non-ASCII, from a store written by something else) goes without the
    camera header: the question is answered and fires, not stored as a failed request."""
    store, data_dir = site
    anywhere = config(vllm_server.base_url, receiver.url, cameras=(), force_answer=MATCH)
    service = AlertService(store.engine, anywhere, data_dir=data_dir)
    try:
        row = add_framed(store, data_dir, "entrée", T0, "a person at the door")
        drain(service)
    finally:
        service.stop()
    assert [(d["caption_id"], d["match"], d["error"]) for d in decisions(store)] == [(row, True, None)]
    assert [body["caption_id"] for body in receiver.bodies()] == [row]


def test_only_camera_ids_go_as_the_camera_header() -> None:
    assert camera_headers("door-1.a") == {CAMERA_HEADER: "door-1.a"}
    for unfit in (None, "", "entrée", "door\n", "a b", "x" * 65, "-door"):
        assert camera_headers(unfit) == {}, unfit


@pytest.mark.vllm
def test_cooldown_and_deadline(vllm_server: VllmServer, site: tuple[CaptionStore, Path], receiver: Receiver) -> None:
    store, data_dir = site
    cooling = config(vllm_server.base_url, receiver.url, cooldown_s=60, force_answer=MATCH)
    service = AlertService(store.engine, cooling, data_dir=data_dir)
    try:
        first = add_framed(store, data_dir, "door", T0, "a person at the door")
        add_framed(store, data_dir, "door", T0 + timedelta(seconds=30), "a person at the door again")  # cooling
        later = add_framed(store, data_dir, "door", T0 + timedelta(seconds=90), "a person at the door later")
        drain(service)
        # A caption inside the cooldown is not asked about at all.
        assert service.engine.verifier is not None and service.engine.verifier.requests == 2
    finally:
        service.stop()
    assert [body["caption_id"] for body in receiver.bodies()] == [first, later]

    # No answer within the deadline: a stored decision with the error, nothing fires, the engine goes on.
    hurried = config(vllm_server.base_url, receiver.url, from_start=False, force_answer=MATCH, deadline_s=0.001)
    service = AlertService(store.engine, hurried, data_dir=data_dir)
    try:
        late = add_framed(store, data_dir, "door", T0 + timedelta(hours=1), "a person at the door at last")
        drain(service)
    finally:
        service.stop()
    decided = [d for d in decisions(store) if d["caption_id"] == late]
    assert [(d["match"], d["alert_id"]) for d in decided] == [(None, None)]
    assert decided[0]["error"].startswith("deadline")
    assert len(receiver.bodies()) == 2


def test_event_frames_own_first_then_the_newest_of_its_event(site: tuple[CaptionStore, Path]) -> None:
    """The frames a question goes with (the test server takes one image a prompt, so this is checked here)."""
    store, data_dir = site
    ids = [add_framed(store, data_dir, "door", T0 + timedelta(seconds=i), f"frame {i}") for i in range(4)]
    add_framed(store, data_dir, "yard", T0, "another camera's event")
    paths = {i: f"frames/door-{int((T0 + timedelta(seconds=n)).timestamp())}.jpg" for n, i in enumerate(ids)}
    with store.engine.connect() as conn:
        frames = event_frames(conn, data_dir, ids[1], paths[ids[1]], 3)
        assert frames == [(data_dir / paths[i]).read_bytes() for i in (ids[1], ids[3], ids[2])]
        assert event_frames(conn, data_dir, ids[1], "../outside.jpg", 1) == []
        assert event_frames(conn, None, ids[1], paths[ids[1]], 3) == []


def test_a_candidate_is_judged_once_a_page_not_again_in_its_transaction(site: tuple[CaptionStore, Path]) -> None:
    """The pre-pass decides which rows are a watch rule's candidates; the page's transaction reuses that, so a
    semantic rule embeds each caption once, not twice (the embedding is the costly part of a page). Here the
    similarity pre-filter keeps both candidates from the VLM: no question, no decision."""
    store, data_dir = site
    asked: list[tuple[str, str]] = []

    def similarity(rule_text: str, caption: str) -> float:
        asked.append((rule_text, caption))
        return 0.5

    alerts = AlertsConfig.model_validate(
        {
            "start_at_beginning": True,
            "rules": [
                {
                    "name": "package",
                    "semantic": {"text": "a parcel", "threshold": 0.4},
                    "verify": {"question": "a person leaves a package", "min_similarity": 0.9},
                }
            ],
        }
    )
    engine = AlertEngine(store.engine, alerts, AlertMetrics(), similarity=lambda: similarity, data_dir=data_dir)
    add_framed(store, data_dir, "door", T0, "one")
    add_framed(store, data_dir, "door", T0 + timedelta(seconds=5), "two")
    while engine.run_once() > 0:
        pass
    assert asked == [
        ("a parcel", "one"),
        ("a person leaves a package", "one"),
        ("a parcel", "two"),
        ("a person leaves a package", "two"),
    ]
    assert decisions(store) == []


def test_a_cooling_candidate_is_not_embedded_for_its_question(site: tuple[CaptionStore, Path]) -> None:
    """The similarity pre-filter (an embedding, the costly part) runs only for candidates the cheap look-ups leave:
    captions inside the rule's cooldown of an alert already fired are neither embedded for the question nor asked."""
    store, data_dir = site
    asked: list[str] = []

    def similarity(rule_text: str, caption: str) -> float:
        asked.append(caption)
        return 0.1

    alerts = AlertsConfig.model_validate(
        {
            "start_at_beginning": True,
            "rules": [
                {
                    "name": "package",
                    "cameras": ["door"],
                    "cooldown_s": 60,
                    "verify": {"question": "a person leaves a package", "min_similarity": 0.9},
                }
            ],
        }
    )
    with store.engine.begin() as conn:
        add_alert(
            conn,
            {"rule": "package", "camera": "door", "caption_id": 0, "captured_at": T0, "caption": "x"}
            | {"people_count": 1},
        )
    engine = AlertEngine(store.engine, alerts, AlertMetrics(), similarity=lambda: similarity, data_dir=data_dir)
    add_framed(store, data_dir, "door", T0 + timedelta(seconds=5), "cooling")
    add_framed(store, data_dir, "door", T0 + timedelta(seconds=90), "past the cooldown")
    while engine.run_once() > 0:
        pass
    assert asked == ["past the cooldown"]
    assert decisions(store) == []
