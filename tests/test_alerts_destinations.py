"""Each destination has its own delivery worker and its own bound: a webhook receiver that takes the request and
never answers holds up none of the others (a real Mosquitto beside it), and a destination whose backlog is full
lets the engine go on for the others."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from alerts_support import Mosquitto, Subscriber, add_caption, mosquitto
from helpers import wait_for
from sqlalchemy import select, update

from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.service import AlertService
from visioncap.config.alerts import AlertsConfig
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, DeliveryState

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


class HangingReceiver:
    """An HTTP server that reads each request whole and never answers it (until the test ends)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.arrived: list[bytes] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.arrived.append(body)
                receiver.released.wait()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HangingReceiver:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()

    def count(self) -> int:
        with self.lock:
            return len(self.arrived)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with mosquitto(tmp_path) as running:
        yield running


def states(store: CaptionStore, destination: str) -> list[DeliveryState]:
    with store.engine.connect() as conn:
        table = AlertDeliveryRecord
        query = select(table.state).where(table.destination == destination).order_by(table.id)
        return list(conn.scalars(query))


@pytest.mark.mqtt
def test_a_hanging_webhook_holds_up_no_other_destination(broker: Mosquitto, tmp_path: Path) -> None:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    store.create_schema()
    subscriber = Subscriber(broker.port)
    assert subscriber.subscribed.wait(20)
    with HangingReceiver() as hanging:
        config = AlertsConfig.model_validate(
            {
                # Its requests outlast the test's waits below: the hook's worker is stuck in its first one throughout.
                "webhooks": [{"name": "stuck", "url": hanging.url, "timeout_s": 120}],
                "mqtt": {"port": broker.port, "ack_timeout_s": 5},
                "rules": [{"name": "any", "cooldown_s": 0}],
                # A batch smaller than the hook's backlog: one shared queue would be all hook.
                "delivery": {"poll_s": 0.05, "batch": 2},
            }
        )
        service = AlertService(store.engine, config)
        try:
            service.start()
            ids = [add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}") for m in range(6)]
            wait_for(lambda: hanging.count() == 1, 30, "the hook's first request")
            # Every MQTT message arrives while the hook's first request still hangs.
            wait_for(lambda: sorted(set(subscriber.ids("visioncap/alerts/any", "caption_id"))) == ids, 60, "alerts")
            wait_for(
                lambda: sorted(set(subscriber.ids("visioncap/dock/captions", "caption_id"))) == ids, 60, "captions"
            )
            wait_for(lambda: set(states(store, "mqtt")) == {DeliveryState.DELIVERED}, 30, "MQTT marks")
            assert hanging.count() == 1
            assert states(store, "stuck") == [DeliveryState.PENDING] * 6  # none lost, none failed: still owed
        finally:
            hanging.released.set()
            service.stop()
            subscriber.close()


def test_a_full_destination_gets_failures_and_the_others_go_on(tmp_path: Path) -> None:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    store.create_schema()
    config = AlertsConfig.model_validate(
        {
            "webhooks": [
                {"name": "down", "url": "http://127.0.0.1:9/never-called"},
                {"name": "up", "url": "http://127.0.0.1:9/never-called"},
            ],
            "rules": [{"name": "any", "cooldown_s": 0}],
            "delivery": {"max_pending": 2, "batch": 1},
        }
    )
    metrics = AlertMetrics()
    engine = AlertEngine(store.engine, config, metrics)
    for m in range(5):
        add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}")

    def drain() -> None:
        while engine.run_once():
            pass

    def acknowledge(destination: str) -> None:
        with store.engine.begin() as conn:
            table = AlertDeliveryRecord
            conn.execute(
                update(table)
                .where(table.destination == destination, table.state == DeliveryState.PENDING)
                .values(state=DeliveryState.DELIVERED)
            )

    drain()
    # Both at their bound: the engine waits, nothing is lost.
    assert states(store, "down") == states(store, "up") == [DeliveryState.PENDING] * 2
    acknowledge("up")
    drain()
    # "down" is still full: the engine goes on for "up", and the alerts record what "down" did not get.
    pending, delivered, failed = DeliveryState.PENDING, DeliveryState.DELIVERED, DeliveryState.FAILED
    assert states(store, "up") == [delivered, delivered, pending, pending]
    assert states(store, "down") == [pending, pending, failed, failed]
    acknowledge("up")
    drain()
    assert states(store, "up") == [delivered] * 4 + [pending]
    assert states(store, "down") == [pending, pending, failed, failed, failed]
    with store.engine.connect() as conn:
        errors = set(conn.scalars(select(AlertDeliveryRecord.last_error).where(AlertDeliveryRecord.state == failed)))
    assert errors == {"not queued: 2 deliveries already wait (delivery.max_pending)"}
    samples = metrics.registry
    assert (
        samples.get_sample_value("visioncap_alert_deliveries_total", {"destination": "down", "outcome": "failed"}) == 3
    )
