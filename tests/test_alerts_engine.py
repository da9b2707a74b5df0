"""Rules over a seeded stream of captions written through the real store (SQLite, and PostgreSQL): each rule fires
exactly the expected number of times, cooldowns and time windows hold, and a restarted engine neither repeats
nor skips a caption."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alerts_support import add_caption
from helpers import REPO
from sqlalchemy import func, select, update

from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.store import AlertFilter, list_alerts
from visioncap.config.alerts import AlertsConfig, load_alerts_config
from visioncap.errors import ConfigError
from visioncap.frames import Caption
from visioncap.store import CaptionStore
from visioncap.store.records import AlertDeliveryRecord, DeliveryState

T0 = datetime(2026, 1, 1, 21, 50, tzinfo=UTC)

RULES = {
    "webhooks": [{"name": "hook", "url": "http://127.0.0.1:9/never-called"}],
    "mqtt": {"name": "broker", "port": 9},
    "rules": [
        {"name": "crowd", "min_people": 3, "cooldown_s": 600},
        {"name": "forklift", "cameras": ["dock"], "words": ["forklift"], "cooldown_s": 0, "notify": ["hook"]},
        {"name": "night", "words": ["person"], "windows": [{"start": "22:00", "end": "06:00"}], "cooldown_s": 0},
        {"name": "running", "activities": ["run"], "cooldown_s": 0, "notify": ["broker"]},
    ],
}


def drain(engine: AlertEngine) -> None:
    while engine.run_once():
        pass


def fired(store: CaptionStore) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for alert, _ in reversed(list_alerts(store.engine, AlertFilter(), 1000)):
        found.setdefault(alert.rule, []).append(alert.caption_id)
    return found


def test_rules_fire_exactly_as_expected(store: CaptionStore) -> None:
    config = AlertsConfig.model_validate(RULES)
    metrics = AlertMetrics()
    before = add_caption(store, "dock", T0 - timedelta(hours=1), "a forklift before the engine started", people=5)
    engine = AlertEngine(store.engine, config, metrics)
    at = [T0 + timedelta(minutes=m) for m in range(0, 40)]
    ids = {
        "c0": add_caption(store, "dock", at[0], "A forklift moves pallets", people=3),  # crowd, forklift
        "c1": add_caption(store, "dock", at[5], "Three people near a FORKLIFT.", people=4),  # forklift; crowd cools
        "c2": add_caption(store, "yard", at[6], "forklifts parked", people=3),  # crowd (other camera); no word
        "c3": add_caption(store, "yard", at[12], "a person walks", people=1),  # night (22:02)
        "c4": add_caption(store, "dock", at[11], "people", people=3, activities=["Running fast"]),  # crowd, running
    }
    drain(engine)
    # Stopped and started again: the cursor and the cooldowns come from the database.
    engine = AlertEngine(store.engine, config, metrics)
    ids["c5"] = add_caption(store, "dock", at[19], "a person and a forklift", people=3)  # all but crowd, running
    ids["c6"] = add_caption(store, "dock", at[20], "crowd", people=9, activities=["standing"])  # cooling
    drain(engine)
    # Captioned again (regenerate): the change comes through the feed again and fires nothing new.
    assert store.requeue(ids["c0"]) is False  # no image: requeue refuses, so mark it captioned again directly
    store.mark_captioned(ids["c0"], store_caption("A forklift moves pallets again"), attempts=2)
    drain(engine)

    assert fired(store) == {
        "crowd": [ids["c0"], ids["c2"], ids["c4"]],
        "forklift": [ids["c0"], ids["c1"], ids["c5"]],
        "night": [ids["c3"], ids["c5"]],
        "running": [ids["c4"]],
    }
    assert all(before not in captions for captions in fired(store).values())
    assert metrics.registry.get_sample_value("visioncap_alerts_fired_total", {"rule": "crowd"}) == 3
    with store.engine.connect() as conn:
        per_destination = dict(
            conn.execute(
                select(AlertDeliveryRecord.destination, func.count())
                .where(AlertDeliveryRecord.alert_id.is_not(None))
                .group_by(AlertDeliveryRecord.destination)
            ).all()
        )
        captions = conn.scalar(select(func.count()).where(AlertDeliveryRecord.topic.like("visioncap/%/captions")))
    # hook: crowd 3 + forklift 3 + night 2; broker: crowd 3 + night 2 + running 1.
    assert per_destination == {"hook": 8, "broker": 6}
    # Every captioned change goes to MQTT, the regenerated one again (it is new text).
    assert captions == 8


def store_caption(text: str) -> Caption:
    return Caption(text, "tiny", 10, 5, 0.1)


@pytest.mark.embedder
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_semantic_rule_fires_on_meaning_not_words(store: CaptionStore) -> None:
    config = AlertsConfig.model_validate(
        {"rules": [{"name": "fire", "semantic": {"text": "smoke and flames, something is burning", "threshold": 0.4}}]}
    )
    engine = AlertEngine(store.engine, config, AlertMetrics())
    hit = add_caption(store, "dock", T0, "A fire has broken out and thick smoke rises from a pallet.")
    add_caption(store, "dock", T0 + timedelta(minutes=10), "Two people chat at a desk with coffee cups.")
    drain(engine)
    assert fired(store) == {"fire": [hit]}


def test_example_file_loads() -> None:
    config = load_alerts_config(REPO / "pipelines" / "alerts.example.yaml")
    assert [rule.name for rule in config.rules] == ["crowd-at-dock", "after-hours", "running", "smoke"]


def test_file_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "alerts.yaml"
    bad.write_text("rules:\n  - name: a\n    windows: [{start: '25:00', end: '06:00'}]\n    notify: [nowhere]\n")
    with pytest.raises(ConfigError, match=r"rules\.0\.windows\.0\.start"):
        load_alerts_config(bad)
    bad.write_text("rules:\n  - name: a\n    notify: [nowhere]\n")
    with pytest.raises(ConfigError, match="notifies unknown destinations"):
        load_alerts_config(bad)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_full_backlog_holds_the_engine_back_and_loses_nothing(store: CaptionStore) -> None:
    config = AlertsConfig.model_validate(
        {
            "webhooks": [{"name": "hook", "url": "http://127.0.0.1:9/never-called"}],
            "rules": [{"name": "any", "cooldown_s": 0}],
            "delivery": {"max_pending": 1, "batch": 1},
        }
    )
    engine = AlertEngine(store.engine, config, AlertMetrics())
    ids = [add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}") for m in range(3)]
    drain(engine)
    assert fired(store) == {"any": ids[:1]}  # one delivery pending: the backlog is full
    for expected in (ids[:2], ids):
        with store.engine.begin() as conn:  # the receiver acknowledged what is pending
            conn.execute(
                update(AlertDeliveryRecord)
                .where(AlertDeliveryRecord.state == DeliveryState.PENDING)
                .values(state=DeliveryState.DELIVERED)
            )
        drain(engine)
        assert fired(store) == {"any": expected}


def test_two_engines_on_one_cursor_fire_each_alert_once(store: CaptionStore) -> None:
    """An overlapping restart (or a commit whose reply was lost): the cursor is not where an engine last saw it. It
    reads the cursor again and goes on from there, and every caption fires once."""
    config = AlertsConfig.model_validate(
        {
            "webhooks": [{"name": "hook", "url": "http://127.0.0.1:9/never-called"}],
            "rules": [{"name": "any", "cooldown_s": 0}],
            "delivery": {"batch": 2},
        }
    )
    first = AlertEngine(store.engine, config, AlertMetrics())
    second = AlertEngine(store.engine, config, AlertMetrics())
    ids = [add_caption(store, "dock", T0 + timedelta(minutes=m), f"caption {m}") for m in range(7)]
    assert first.run_once() == 2
    second.run_once()  # its page was handled already: it rolls back and reads the cursor again
    for _ in range(20):  # taking turns, as two processes do
        if not (first.run_once() + second.run_once()):
            break
    assert fired(store) == {"any": ids}
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(AlertDeliveryRecord)) == len(ids)
    # Either goes on with later captions.
    later = add_caption(store, "dock", T0 + timedelta(hours=1), "later")
    drain(second)
    drain(first)
    assert fired(store) == {"any": [*ids, later]}
