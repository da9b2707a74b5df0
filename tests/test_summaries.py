"""Summaries: a busy camera's day (2,000 seeded captions) summarised by the real tiny VLM through the gateway's
background class, in parts then a summary of the parts, each request within the model's context; citations kept
only when they are the window's; stored once, and delivered to a real Mosquitto and a webhook by the alerts'
delivery workers. The tiny model writes noise, so what is checked is the hierarchy, the budgets, the validated
citations, storage and delivery, never the words."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from alerts_support import Receiver, Subscriber, mosquitto
from helpers import TINY_MODEL, scrape_metric, wait_for
from sqlalchemy import Engine, insert, select

from visioncap.alerts.delivery import DeliveryWorker
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.mqtt import MqttSender
from visioncap.alerts.service import DIGEST_STOP_S, build_alerts
from visioncap.alerts.webhook import WebhookSender
from visioncap.api.auth import hash_key
from visioncap.config.alerts import AlertsConfig
from visioncap.config.gateway import GatewayConfig
from visioncap.config.settings import load_settings
from visioncap.config.summaries import SummariesConfig
from visioncap.errors import ConfigError, VisioncapError
from visioncap.frames import SelectionReason
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, CaptionRecord, CaptionStatus, DeliveryState
from visioncap.summaries import chunking
from visioncap.summaries import store as summary_store
from visioncap.summaries.schedule import Digests, last_complete_window
from visioncap.summaries.store import Summary, WindowCaption
from visioncap.summaries.writer import SummaryWriter

BACKGROUND_KEY = "summaries-background-key"
ZONE = ZoneInfo("Europe/Berlin")
DAY = datetime(2026, 3, 28, tzinfo=ZONE)  # the night after it, clocks go forward: a 23-hour day follows
ACTIONS = (
    "A courier leaves a parcel at the door.",
    "Two people walk past the gate.",
    "A person in a grey hoodie looks at the car.",
    "A cyclist stops at the gate.",
    "A woman walks a dog across the yard.",
)


def seed_day(
    engine: Engine, camera: str, count: int, start: datetime = DAY, span: timedelta = timedelta(hours=24)
) -> list[int]:
    """`count` captioned rows spread over `span` from `start` (DAY, local, by default), written in one statement:
    the pipeline's row shape. The ids of the camera's rows."""
    rng = random.Random(7)
    start = start.astimezone(UTC)
    step = span / count
    rows = [
        {
            "pipeline": "p",
            "camera": camera,
            "source": f"/videos/{camera}.mp4",
            "frame_index": index,
            "offset_s": 0.0,
            "captured_at": start + step * index,
            "reason": SelectionReason.NEW_EVENT,
            "event_key": f"{camera}:{index}",
            "people": [],
            "people_count": 1,
            "image_width": 16,
            "image_height": 16,
            "status": CaptionStatus.CAPTIONED,
            "caption": rng.choice(ACTIONS),
            "model": TINY_MODEL,
        }
        for index in range(count)
    ]
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), rows)
        return list(conn.scalars(select(CaptionRecord.id).where(CaptionRecord.camera == camera)))


def item(caption_id: int, tokens: int) -> chunking.Item:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return chunking.Item(f"[c{caption_id}]", tokens, (caption_id,), at, at)


def test_citations_keep_only_the_windows_ids() -> None:
    text = "A courier came [c12] and left [c12, c99999]; later c13 and [c7] (not in the window), c1x is no id."
    assert chunking.citations(text, {12, 13, 14}) == [12, 13]


def test_parts_fill_the_budget_and_keep_order() -> None:
    parts = chunking.cut([item(index, 30) for index in range(10)], 100)
    assert [[i.ids[0] for i in part] for part in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert all(sum(i.tokens for i in part) <= 100 for part in parts)


def test_a_line_counts_digits_as_tokens() -> None:
    # Qwen's tokenizer splits numbers into digits: a line of ids and times is far more tokens than chars / 4.
    line = chunking.caption_item(123456, "front", datetime(2026, 1, 1, tzinfo=UTC), "a b", ZONE, 400, 3.0)
    assert line.tokens >= 6 + 4 + 1  # the id's digits, the time's, and the line break


def test_digest_windows_follow_the_local_calendar() -> None:
    after = datetime(2026, 3, 29, 12, 0, tzinfo=ZONE)  # clocks went forward at 02:00 that morning
    assert last_complete_window(after, "daily", ZONE) == (
        datetime(2026, 3, 28, tzinfo=ZONE).astimezone(UTC),
        datetime(2026, 3, 29, tzinfo=ZONE).astimezone(UTC),
    )
    next_day = datetime(2026, 3, 30, 0, 30, tzinfo=ZONE)
    start, end = last_complete_window(next_day, "daily", ZONE)
    assert end - start == timedelta(hours=23)
    start, end = last_complete_window(datetime(2026, 3, 29, 12, 40, tzinfo=ZONE), "hourly", ZONE)
    assert (start.astimezone(ZONE).hour, end - start) == (11, timedelta(hours=1))


def test_config_refuses_a_context_that_cannot_shrink() -> None:
    with pytest.raises(ValueError, match="twice max_tokens"):
        SummariesConfig(context_tokens=1024, max_tokens=400, prompt_overhead_tokens=256)


def test_summaries_are_stored_listed_and_queued_once(store: CaptionStore) -> None:
    """The table on SQLite and PostgreSQL: a digest stored twice is stored once; each stored summary queues one
    delivery per destination; the list filters by camera, newest first."""
    store.create_schema()
    store_engine = store.engine
    alerts = AlertsConfig.model_validate(
        {"mqtt": {"host": "127.0.0.1", "port": 1883}, "webhooks": [{"name": "hook", "url": "http://127.0.0.1:9/"}]}
    )
    summary_store.ensure_table(store_engine)
    summary_store.ensure_table(store_engine)  # idempotent: every process makes it on start
    start = datetime(2026, 3, 28, tzinfo=UTC)
    made = [
        Summary("hourly", (camera,), start, start + timedelta(hours=1), f"{camera} text", (1, 2), 2, 1, 1, 9, "m")
        for camera in ("front", "back_yard", "front")
    ]
    key = summary_store.digest_key("hourly", "front", start)
    first = summary_store.add_summary(store_engine, made[0], alerts, key)
    assert first is not None and first.id is not None
    assert summary_store.add_summary(store_engine, made[2], alerts, key) is None  # the same digest again
    assert summary_store.add_summary(store_engine, made[1], alerts, None) is not None
    assert [s.cameras for s in summary_store.list_summaries(store_engine, None, 10)] == [("back_yard",), ("front",)]
    fronts = summary_store.list_summaries(store_engine, "front", 10)
    assert [(s.id, s.citations, s.text) for s in fronts] == [(first.id, (1, 2), "front text")]
    # `_` in a camera id is no LIKE wildcard.
    assert summary_store.list_summaries(store_engine, "back_yar_", 10) == []
    with store_engine.connect() as conn:
        queued = conn.execute(select(AlertDeliveryRecord.destination, AlertDeliveryRecord.topic)).all()
    assert sorted(queued) == sorted(
        [
            ("mqtt", "visioncap/summaries/front"),
            ("hook", "summary"),
            ("mqtt", "visioncap/summaries/back_yard"),
            ("hook", "summary"),
        ]
    )


@pytest.fixture
def gateway(vllm_server: VllmServer) -> Iterator[GatewayThread]:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": vllm_server.base_url, "metrics_poll_s": 0.5}],
            "keys": [{"name": "summaries", "sha256": hash_key(BACKGROUND_KEY), "traffic_class": "background"}],
        }
    )
    with GatewayThread(config) as gw:
        yield gw


def background_requests(gw: GatewayThread) -> float:
    return scrape_metric(gw.root_url, "visioncap_gateway_requests_total", traffic_class="background")


def served_context(vllm_server: VllmServer) -> int:
    models = httpx.get(f"{vllm_server.base_url}/models", timeout=10).json()["data"]
    return int(next(model["max_model_len"] for model in models if model["id"] == TINY_MODEL))


@pytest.mark.mqtt
def test_a_busy_day_is_summarised_in_parts_and_delivered(
    vllm_server: VllmServer, gateway: GatewayThread, tmp_path: Path
) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}")
    CaptionStore(engine).create_schema()
    summary_store.ensure_table(engine)
    ids = seed_day(engine, "front", 2000)
    other = seed_day(engine, "back", 3)  # another camera's captions stay out of the window
    context = served_context(vllm_server)
    config = SummariesConfig(
        context_tokens=context,
        max_tokens=48,
        time_zone=ZONE.key,
        digests=[{"camera": "front", "every": "daily"}],
    )
    with mosquitto(tmp_path) as broker, Receiver([200]) as receiver:
        alerts = AlertsConfig.model_validate(
            {
                "mqtt": {"host": "127.0.0.1", "port": broker.port, "client_id": "summaries-test"},
                "webhooks": [{"name": "hook", "url": receiver.url}],
            }
        )
        writer = SummaryWriter(config, gateway.base_url, BACKGROUND_KEY, TINY_MODEL)
        digests = Digests(engine, writer, config, alerts)
        before = background_requests(gateway)
        now = datetime(2026, 3, 29, 6, 0, tzinfo=ZONE)
        assert digests.run_once(now) == 1
        assert digests.run_once(now) == 0  # written once
        writer.close()
        [summary] = summary_store.list_summaries(engine, "front", 10)
        assert summary.caption_count == 2000
        assert (summary.window_start, summary.window_end) == (DAY.astimezone(UTC), (DAY + timedelta(days=1)))
        # 2,000 captions are far more than one request holds: parts, then the summary of the parts.
        assert summary.depth >= 2
        assert summary.requests > 2
        # Every request, as vLLM counted it, fit the context with room for the answer.
        assert 0 < summary.max_prompt_tokens <= context - config.max_tokens
        assert set(summary.citations) <= set(ids) and not set(summary.citations) & set(other)
        assert background_requests(gateway) - before == summary.requests

        subscriber = Subscriber(broker.port, client_id="summaries-sub", topics=("visioncap/summaries/#",))
        try:
            assert subscriber.subscribed.wait(20)
            metrics = AlertMetrics()
            senders = {"mqtt": MqttSender(alerts.mqtt), "hook": WebhookSender(alerts.webhooks[0])}  # type: ignore[arg-type]
            workers = [
                DeliveryWorker(engine, name, sender, alerts.delivery, metrics, "summaries-test")
                for name, sender in senders.items()
            ]

            def delivered() -> bool:
                for worker in workers:
                    worker.run_once()
                return bool(subscriber.ids("visioncap/summaries/front", "id")) and bool(receiver.bodies())

            wait_for(delivered, 30, "the summary at the broker and the webhook")
            for sender in senders.values():
                sender.close()
        finally:
            subscriber.close()
    assert subscriber.ids("visioncap/summaries/front", "id") == [summary.id]
    [body] = receiver.bodies()
    assert body["citations"] == list(summary.citations) and body["caption_count"] == 2000
    assert body["kind"] == "daily" and body["cameras"] == ["front"]
    with engine.connect() as conn:
        states = conn.scalars(select(AlertDeliveryRecord.state)).all()
    assert states == [DeliveryState.DELIVERED, DeliveryState.DELIVERED]
    assert json.loads(json.dumps(body))["window_start"] == DAY.astimezone(UTC).isoformat()


def test_a_tokenizer_denser_than_estimated_halves_the_refused_parts(vllm_server: VllmServer, tmp_path: Path) -> None:
    """An estimate far too low (8 characters a token) makes parts vLLM refuses as longer than its context: they
    are halved and sent again, in order, until each fits, and the summary is still written."""
    engine = create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}")
    CaptionStore(engine).create_schema()
    ids = seed_day(engine, "front", 400)
    config = SummariesConfig(context_tokens=served_context(vllm_server), max_tokens=16, chars_per_token=8.0)
    captions = summary_store.window_captions(engine, ["front"], DAY.astimezone(UTC), DAY + timedelta(days=1), 400)
    # No key at all (VISIONCAP_VLM_API_KEY= in .env): sent as vLLM's any-key, not as an illegal empty header.
    writer = SummaryWriter(config, vllm_server.base_url, "", TINY_MODEL)
    try:
        summary = writer.write("request", ["front"], DAY, DAY + timedelta(days=1), captions)
    finally:
        writer.close()
    assert summary.caption_count == 400 and summary.depth >= 2
    assert 0 < summary.max_prompt_tokens <= config.context_tokens - config.max_tokens
    assert set(summary.citations) <= set(ids)


def test_an_empty_window_is_written_without_the_model() -> None:
    config = SummariesConfig()
    writer = SummaryWriter(config, "http://127.0.0.1:9/v1", "unused", TINY_MODEL)  # never reached
    start = datetime(2026, 3, 28, tzinfo=UTC)
    captions: list[WindowCaption] = []
    summary = writer.write("request", ["front"], start, start + timedelta(hours=1), captions)
    writer.close()
    assert (summary.requests, summary.depth, summary.citations) == (0, 0, ())


def test_the_alerts_service_writes_the_due_digests_and_refuses_a_schedule_without_a_model(
    vllm_server: VllmServer, gateway: GatewayThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`visioncap alerts` runs the scheduled digests (VISIONCAP_SUMMARIES_CONFIG): at its start, the last complete
    hour of the camera is summarised once, by the VLM through the gateway's background class."""
    database = f"sqlite:///{tmp_path / 'visioncap.db'}"
    engine = create_db_engine(database)
    CaptionStore(engine).create_schema()
    # Captions in each of the last two complete hours: whichever is the last complete one when the service looks
    # (the clock may pass an hour meanwhile) has some.
    _, end = last_complete_window(datetime.now(UTC), "hourly", ZoneInfo("UTC"))
    seed_day(engine, "front", 40, start=end - timedelta(hours=2), span=timedelta(hours=2))
    with engine.connect() as conn:
        seeded = {row.id: row.captured_at for row in conn.execute(select(CaptionRecord.id, CaptionRecord.captured_at))}
    config = {"context_tokens": served_context(vllm_server), "max_tokens": 48,
              "digests": [{"camera": "front", "every": "hourly"}]}  # fmt: skip
    for name, value in {
        "VISIONCAP_DATABASE_URL": database,
        "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
        "VISIONCAP_VLM_BASE_URL": gateway.base_url,
        "VISIONCAP_VLM_API_KEY": BACKGROUND_KEY,
        "VISIONCAP_SUMMARIES_CONFIG": json.dumps(config),
        "VISIONCAP_SUMMARIES_MODEL": TINY_MODEL,
    }.items():
        monkeypatch.setenv(name, value)
    before = background_requests(gateway)
    with build_alerts(AlertsConfig(), load_settings()) as service:
        assert service.digests is not None
        wait_for(lambda: summary_store.list_summaries(engine, "front", 10), 120, "the hourly digest")
    [summary] = summary_store.list_summaries(engine, "front", 10)
    assert summary.window_end - summary.window_start == timedelta(hours=1)
    inside = {row_id for row_id, at in seeded.items() if summary.window_start <= at < summary.window_end}
    assert summary.caption_count == len(inside) == 20
    assert set(summary.citations) <= inside
    assert background_requests(gateway) - before == summary.requests
    # A schedule with no model to write it: refused at the start, naming the setting.
    monkeypatch.delenv("VISIONCAP_SUMMARIES_MODEL")
    monkeypatch.delenv("VISIONCAP_ASK_MODEL", raising=False)
    with pytest.raises(VisioncapError, match="VISIONCAP_SUMMARIES_MODEL"):
        build_alerts(AlertsConfig(), load_settings())


def test_the_alerts_service_stops_without_waiting_out_a_digest_request_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A VLM that took the digest's request and never answers (a real socket that accepts and stays silent):
    stop() returns after DIGEST_STOP_S, not after the summaries' timeout_s, and nothing half-written is stored,
    so the digest is still due at the next start."""
    database = f"sqlite:///{tmp_path / 'visioncap.db'}"
    engine = create_db_engine(database)
    CaptionStore(engine).create_schema()
    _, end = last_complete_window(datetime.now(UTC), "hourly", ZoneInfo("UTC"))
    seed_day(engine, "front", 40, start=end - timedelta(hours=2), span=timedelta(hours=2))
    taken = threading.Event()
    held: list[socket.socket] = []
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)

        def accept() -> None:
            connection, _ = listener.accept()
            held.append(connection)
            taken.set()

        threading.Thread(target=accept, daemon=True).start()
        config = {"timeout_s": 600, "digests": [{"camera": "front", "every": "hourly"}]}
        for name, value in {
            "VISIONCAP_DATABASE_URL": database,
            "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
            "VISIONCAP_VLM_BASE_URL": f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
            "VISIONCAP_SUMMARIES_CONFIG": json.dumps(config),
            "VISIONCAP_SUMMARIES_MODEL": TINY_MODEL,
        }.items():
            monkeypatch.setenv(name, value)
        service = build_alerts(AlertsConfig(), load_settings())
        service.start()
        try:
            assert taken.wait(60), "the digest's request never reached the VLM"
        finally:
            started = time.monotonic()
            service.stop()
            stopped_in = time.monotonic() - started
        for connection in held:
            connection.close()
    assert stopped_in < DIGEST_STOP_S + 10 < 600
    assert summary_store.list_summaries(engine, "front", 10) == []


def test_a_malformed_summaries_setting_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIONCAP_DATABASE_URL", f"sqlite:///{tmp_path / 'visioncap.db'}")
    monkeypatch.setenv("VISIONCAP_SUMMARIES_CONFIG", '{"digests": [{"camera": "front", "every": "weekly"}]}')
    with pytest.raises(ConfigError, match="VISIONCAP_SUMMARIES_CONFIG") as raised:
        build_alerts(AlertsConfig(), load_settings())
    assert "\n" not in str(raised.value)
