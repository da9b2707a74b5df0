"""Two `visioncap alerts` processes on one PostgreSQL database (a rolling restart, or two replicas by mistake):
between them every alert is delivered exactly once, each delivery claimed by one process only; the claims
themselves (SQLite and PostgreSQL), and the schema step that adds them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from alerts_support import Receiver, add_caption
from helpers import REPO, wait_for
from pg import fresh_database
from sqlalchemy import select, text

from visioncap.alerts.store import add_delivery, due, record_attempt, release
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, DeliveryState
from visioncap.store.schema import SCHEMA_VERSION, ensure_schema

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ALERTS = 60


def test_two_alert_processes_deliver_each_alert_once(postgres: str, tmp_path: Path) -> None:
    url = fresh_database(postgres)
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    with Receiver([200]) as receiver:
        path = tmp_path / "alerts.yaml"
        config = {
            "webhooks": [{"name": "hook", "url": receiver.url}],
            "rules": [{"name": "crowd", "min_people": 2, "cooldown_s": 0}],
            "start_at_beginning": True,
            # Small pages and batches: the two processes take turns at the cursor and at the deliveries often.
            "delivery": {"poll_s": 0.02, "batch": 3},
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        env = {"VISIONCAP_DATABASE_URL": url, "VISIONCAP_DATA_DIR": str(tmp_path / "data")}
        processes: list[subprocess.Popen[bytes]] = []
        logs = [tmp_path / f"alerts-{n}.log" for n in range(2)]
        try:
            for log in logs:
                with log.open("wb") as out:
                    processes.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "visioncap", "alerts", "--config", str(path)],
                            stdout=out,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, **env},
                            cwd=REPO,
                        )
                    )
            # The captions come once both processes run (both said so): otherwise the first could deliver every
            # alert while the second still imports, and nothing would be shared.
            wait_for(
                lambda: all("alerts: started" in log.read_text() for log in logs),
                120,
                lambda: f"both alert processes to start: {[log.read_text()[-2000:] for log in logs]}",
            )
            ids = [
                add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}", people=2) for m in range(ALERTS)
            ]

            def delivered() -> bool:
                assert all(p.poll() is None for p in processes), [log.read_text() for log in logs]
                with store.engine.connect() as conn:
                    found = list(conn.scalars(select(AlertDeliveryRecord.state)))
                return len(found) == ALERTS and set(found) == {DeliveryState.DELIVERED}

            wait_for(delivered, 120, "every alert to be delivered")
        finally:
            for process in processes:
                process.send_signal(signal.SIGTERM)
            codes = [process.wait(60) for process in processes]
    assert codes == [0, 0], [log.read_text() for log in logs]
    keys = Counter(headers["Idempotency-Key"] for _, headers, _ in receiver.requests)
    assert len(keys) == ALERTS
    assert [key for key, count in keys.items() if count > 1] == []
    assert sorted(body["caption_id"] for body in receiver.bodies()) == ids
    # Neither failed a pass: an engine whose cursor the other moved reads it again (it used to fail every pass).
    assert all("Traceback" not in log.read_text() for log in logs), [log.read_text() for log in logs]


def test_claimed_deliveries_go_to_one_claimant_until_released_or_lapsed(store: CaptionStore) -> None:
    engine = store.engine
    with engine.begin() as conn:
        for n in range(4):
            add_delivery(conn, "hook", "alert", f'{{"n": {n}}}', None, retain=False)
    now = datetime.now(UTC)
    first = [d.id for d in due(engine, now, 3, "hook", "first", lease_s=60)]
    second = [d.id for d in due(engine, now, 3, "hook", "second", lease_s=60)]
    assert len(first) == 3 and len(second) == 1 and not set(first) & set(second)
    assert due(engine, now, 3, "other", "second") == []  # another destination's worker sees none of them
    release(engine, first[1:], "first")
    assert [d.id for d in due(engine, now, 3, "hook", "second", lease_s=60)] == first[1:]
    # The first claimant died: its claim lapses and another takes the row; an attempt's record ends a claim.
    assert [d.id for d in due(engine, now + timedelta(seconds=61), 5, "hook", "third")] == [*first, *second]
    record_attempt(engine, first[0], 1, DeliveryState.DELIVERED)
    assert [d.id for d in due(engine, now + timedelta(seconds=200), 5, "hook", "fourth")] == [*first[1:], *second]


def test_a_database_from_before_delivery_claims_gets_them(tmp_path: Path) -> None:
    engine = create_db_engine(f"sqlite:///{tmp_path / 'old.db'}")
    ensure_schema(engine)
    with engine.begin() as conn:
        for column in ("claimed_by", "claimed_until"):
            conn.execute(text(f"ALTER TABLE alert_deliveries DROP COLUMN {column}"))
        conn.execute(text("UPDATE visioncap_schema SET version = 14"))
        add_delivery(conn, "hook", "alert", "{}", None, retain=False)
    assert ensure_schema(engine) == SCHEMA_VERSION
    assert [d.body for d in due(engine, datetime.now(UTC) + timedelta(seconds=1), 5, "hook", "me")] == ["{}"]
