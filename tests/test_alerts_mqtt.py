"""MQTT delivery through a real Mosquitto broker, stopped and restarted mid-run: every caption, state and alert
message reaches a QoS 1 subscriber, the ones made while the broker was down included; camera state is retained."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alerts_support import Mosquitto, Subscriber, add_caption, mosquitto
from helpers import wait_for
from sqlalchemy import select

from visioncap.alerts.service import AlertService
from visioncap.config.alerts import AlertsConfig
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, DeliveryState

pytestmark = pytest.mark.mqtt

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with mosquitto(tmp_path) as running:
        yield running


def test_broker_restart_mid_run_loses_nothing(broker: Mosquitto, tmp_path: Path) -> None:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    store.create_schema()
    config = AlertsConfig.model_validate(
        {
            "mqtt": {"port": broker.port, "home_assistant": True, "ack_timeout_s": 2},
            "rules": [{"name": "crowd", "min_people": 2, "cooldown_s": 0}],
            "delivery": {"poll_s": 0.05, "retry_initial_s": 0.2, "retry_max_s": 1},
        }
    )
    subscriber = Subscriber(broker.port)
    assert subscriber.subscribed.wait(20)
    service = AlertService(store.engine, config)
    ids: list[int] = []
    try:
        service.start()
        ids += [add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}", people=m % 3) for m in range(3)]
        wait_for(lambda: subscriber.ids("visioncap/dock/captions", "caption_id") == ids, 30, "the first captions")

        broker.stop()
        ids += [
            add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}", people=m % 3) for m in range(3, 6)
        ]

        def failing() -> bool:
            with store.engine.connect() as conn:
                return (
                    conn.scalar(select(AlertDeliveryRecord.id).where(AlertDeliveryRecord.attempts > 0).limit(1))
                    is not None
                )

        wait_for(failing, 30, "deliveries to fail while the broker is down")
        broker.start()

        def all_delivered() -> bool:
            with store.engine.connect() as conn:
                states = set(conn.scalars(select(AlertDeliveryRecord.state)))
            return states == {DeliveryState.DELIVERED}

        wait_for(all_delivered, 60, "every delivery to be acknowledged after the restart")
        wait_for(lambda: len(set(subscriber.ids("visioncap/dock/captions", "caption_id"))) == 6, 30, "captions")
    finally:
        service.stop()
        subscriber.close()

    # QoS 1 is at least once: a message in flight when the broker went down may come twice, none may be missing.
    assert sorted(set(subscriber.ids("visioncap/dock/captions", "caption_id"))) == ids
    crowd = [row for row, m in zip(ids, range(6), strict=True) if m % 3 == 2]
    assert sorted(set(subscriber.ids("visioncap/alerts/crowd", "caption_id"))) == crowd
    assert set(subscriber.ids("visioncap/dock/state", "caption_id")) == set(ids)
    # A newcomer gets the retained state (the newest caption) and the Home Assistant config at once.
    newcomer = Subscriber(broker.port, client_id="newcomer", clean=True, topics=("visioncap/#", "homeassistant/#"))
    try:
        wait_for(lambda: newcomer.ids("visioncap/dock/state", "caption_id") == [ids[-1]], 20, "retained state")
        wait_for(
            lambda: any(topic.startswith("homeassistant/sensor/") for topic, _, _ in newcomer.messages), 20, "discovery"
        )
    finally:
        newcomer.close()
    with store.engine.connect() as conn:
        attempts = list(conn.scalars(select(AlertDeliveryRecord.attempts)))
    assert max(attempts) > 1  # some did fail while the broker was down, and went out on a later attempt
