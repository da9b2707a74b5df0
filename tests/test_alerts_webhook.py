"""Webhook delivery against a real HTTP receiver: 500s then 200, signed bodies, the delivery id as idempotency
key, the backoff between attempts, nothing sent again once acknowledged, refusals and give-ups recorded."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pytest
import yaml
from alerts_support import Receiver, add_caption
from helpers import start_cli, wait_for
from sqlalchemy import select, update

from visioncap.alerts.delivery import Housekeeping
from visioncap.alerts.service import AlertService
from visioncap.alerts.store import add_delivery, due, record_attempt
from visioncap.alerts.webhook import signature
from visioncap.config.alerts import AlertsConfig
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, DeliveryState

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECRET = "s3cret-for-tests"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> CaptionStore:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    store.create_schema()
    return store


def config(url: str, **delivery: float) -> AlertsConfig:
    return AlertsConfig.model_validate(
        {
            "webhooks": [{"name": "hook", "url": url, "secret_env": "VISIONCAP_TEST_HOOK_SECRET", "timeout_s": 5}],
            "rules": [{"name": "crowd", "min_people": 2, "cooldown_s": 0}],
            "delivery": {"poll_s": 0.05, "retry_initial_s": 0.3, "retry_max_s": 0.6, **delivery},
        }
    )


def deliveries(store: CaptionStore) -> list[AlertDeliveryRecord]:
    with store.engine.connect() as conn:
        return list(conn.execute(select(AlertDeliveryRecord).order_by(AlertDeliveryRecord.id)).all())  # type: ignore[arg-type]


@pytest.fixture
def service_of(sqlite_store: CaptionStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[AlertService]]:
    monkeypatch.setenv("VISIONCAP_TEST_HOOK_SECRET", SECRET)
    started: list[AlertService] = []
    yield started
    for service in started:
        service.stop()


def test_500s_then_200_delivers_each_alert_once_with_backoff(
    sqlite_store: CaptionStore, service_of: list[AlertService]
) -> None:
    with Receiver([500, 500, 500, 200]) as receiver:
        service = AlertService(sqlite_store.engine, config(receiver.url))
        service_of.append(service)
        service.start()
        first = add_caption(sqlite_store, "dock", T0, "a crowd", people=3)
        wait_for(lambda: any(d.state == DeliveryState.DELIVERED for d in deliveries(sqlite_store)), 30, "delivery")
        # Acknowledged: later alerts go out, the first is never sent again.
        second = add_caption(sqlite_store, "dock", T0 + timedelta(minutes=1), "a bigger crowd", people=5)
        add_caption(sqlite_store, "dock", T0 + timedelta(minutes=2), "one person", people=1)  # fires nothing
        wait_for(lambda: len(receiver.requests) == 5, 30, "the second alert")
        service.stop()

    times = [at for at, _, _ in receiver.requests]
    keys = [headers["Idempotency-Key"] for _, headers, _ in receiver.requests]
    stored = deliveries(sqlite_store)
    assert [d.state for d in stored] == [DeliveryState.DELIVERED, DeliveryState.DELIVERED]
    assert [d.attempts for d in stored] == [4, 1]
    assert keys == [str(stored[0].id)] * 4 + [str(stored[1].id)]
    for _, headers, body in receiver.requests:
        assert headers["X-Visioncap-Signature"] == signature(SECRET.encode(), body)
        assert headers["Content-Type"] == "application/json"
    assert [body["caption_id"] for body in receiver.bodies()] == [first] * 4 + [second]
    # Waits of 0.3, 0.6, then 0.6 s (doubling up to retry_max_s); the worker wakes every poll_s (0.05 s).
    # (Clocks: the worker's wall clock against the receiver's monotonic one; 10 ms covers their skew.)
    gaps = [later - earlier for earlier, later in pairwise(times[:4])]
    assert [gap >= want - 0.01 for gap, want in zip(gaps, (0.3, 0.6, 0.6), strict=True)] == [True] * 3, gaps


def test_a_refusal_fails_at_once_and_repeated_errors_give_up(
    sqlite_store: CaptionStore, service_of: list[AlertService]
) -> None:
    with Receiver([400]) as refusing, Receiver([503]) as broken:
        settings = config(refusing.url, max_attempts=3).model_dump()
        settings["webhooks"].append({"name": "down", "url": broken.url, "timeout_s": 5})
        service = AlertService(sqlite_store.engine, AlertsConfig.model_validate(settings))
        service_of.append(service)
        service.start()
        add_caption(sqlite_store, "dock", T0, "a crowd", people=3)
        wait_for(
            lambda: (
                all(d.state == DeliveryState.FAILED for d in deliveries(sqlite_store))
                and len(deliveries(sqlite_store)) == 2
            ),
            30,
            "both deliveries to fail",
        )
        service.stop()
    refused, gave_up = deliveries(sqlite_store)
    assert (refused.destination, refused.attempts, refused.last_error) == ("hook", 1, "HTTP 400")
    assert (gave_up.destination, gave_up.attempts, gave_up.last_error) == ("down", 3, "HTTP 503")
    assert len(refusing.requests) == 1 and len(broken.requests) == 3
    assert "X-Visioncap-Signature" not in broken.requests[0][1]  # no secret configured for it
    samples = service.metrics.registry
    assert (
        samples.get_sample_value("visioncap_alert_deliveries_total", {"destination": "down", "outcome": "retry"}) == 2
    )
    assert (
        samples.get_sample_value("visioncap_alert_deliveries_total", {"destination": "down", "outcome": "failed"}) == 1
    )


def test_the_alerts_command_delivers_and_stops_on_sigterm(sqlite_store: CaptionStore, tmp_path: Path) -> None:
    """`visioncap alerts` as a user runs it: a file, the database from the environment, SIGTERM to stop."""
    fired = add_caption(sqlite_store, "dock", T0, "a crowd at the dock", people=3)
    add_caption(sqlite_store, "dock", T0 + timedelta(minutes=1), "one person", people=1)  # fires nothing
    with Receiver([200]) as receiver:
        data = config(receiver.url).model_dump(mode="json") | {"start_at_beginning": True}
        path = tmp_path / "alerts.yaml"
        path.write_text(yaml.safe_dump(data), encoding="utf-8")
        env = {
            "VISIONCAP_DATABASE_URL": str(sqlite_store.engine.url),
            "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
            "VISIONCAP_TEST_HOOK_SECRET": SECRET,
        }
        process = start_cli("alerts", "--config", str(path), env=env)
        try:
            wait_for(lambda: len(receiver.requests) >= 1 or process.poll() is not None, 60, "the alert")
            assert process.poll() is None, process.communicate()[1]
            wait_for(lambda: [d.state for d in deliveries(sqlite_store)] == [DeliveryState.DELIVERED], 30, "its mark")
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 0, stderr
    assert [body["caption_id"] for body in receiver.bodies()] == [fired]
    _, headers, body = receiver.requests[0]
    assert headers["X-Visioncap-Signature"] == signature(SECRET.encode(), body)


def test_finished_deliveries_expire_and_pending_ones_never_do(sqlite_store: CaptionStore) -> None:
    """With MQTT every caption makes two deliveries: the finished ones go after keep_finished_days."""
    engine = sqlite_store.engine
    now = datetime.now(UTC)
    with engine.begin() as conn:
        for _ in range(3):
            add_delivery(conn, "hook", "alert", "{}", None, retain=False)
    old, recent, waiting = (d.id for d in deliveries(sqlite_store))
    record_attempt(engine, old, 1, DeliveryState.DELIVERED)
    record_attempt(engine, recent, 3, DeliveryState.FAILED, "refused")
    with engine.begin() as conn:
        table = AlertDeliveryRecord
        conn.execute(update(table).where(table.id == old).values(finished_at=now - timedelta(days=8)))
        conn.execute(update(table).where(table.id == recent).values(finished_at=now - timedelta(days=6)))
        # Pending and long overdue for a retry, but not due yet: the pass below sends nothing.
        conn.execute(
            update(table)
            .where(table.id == waiting)
            .values(created_at=now - timedelta(days=30), next_attempt_at=now + timedelta(days=1))
        )
    keeper = Housekeeping(engine, ["hook"], config("http://127.0.0.1:9/hook").delivery)
    keeper.run_once()
    assert [d.id for d in deliveries(sqlite_store)] == [recent, waiting], "the first pass purged the 8-day-old one"
    assert keeper.purge() == 0
    assert [d.state for d in deliveries(sqlite_store)] == [DeliveryState.FAILED, DeliveryState.PENDING]


def test_a_retained_message_sent_after_a_newer_one_of_its_topic_goes_out_unretained(
    sqlite_store: CaptionStore,
) -> None:
    """Retries after a broker outage can send camera states out of order: the broker must keep the newest."""
    engine = sqlite_store.engine
    with engine.begin() as conn:
        add_delivery(conn, "mqtt", "visioncap/dock/state", '{"caption_id": 1}', None, retain=True)
        add_delivery(conn, "mqtt", "visioncap/dock/state", '{"caption_id": 2}', None, retain=True)
        add_delivery(conn, "mqtt", "visioncap/yard/state", '{"caption_id": 3}', None, retain=True)
    older, newer, other = (d.id for d in deliveries(sqlite_store))
    # The newer one went out first (its backoff ended sooner); the older one is due now.
    record_attempt(engine, newer, 2, DeliveryState.DELIVERED)
    found = {d.id: d.retain for d in due(engine, datetime.now(UTC) + timedelta(seconds=1), 10)}
    assert found == {older: False, other: True}
