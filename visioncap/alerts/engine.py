"""The alerts engine: tails the caption change feed from a durable cursor and turns each stored caption into
alerts and deliveries.

One transaction per page: the alerts, their deliveries, the caption messages and the cursor's move commit
together, so a crash anywhere repeats the page as a whole or not at all, and every caption change is handled
exactly once. The cooldown is checked against the stored alerts, so a restart does not fire a rule again early.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine

from visioncap.alerts import store
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.rules import CaptionFacts, Similarity, matches, needs_embeddings
from visioncap.config.alerts import AlertRule, AlertsConfig
from visioncap.store.changes import ChangePosition, ChangeRow, changes_after, stream_start

ALERT_TOPIC = "visioncap/alerts/{rule}"
CAPTION_TOPIC = "visioncap/{camera}/captions"
STATE_TOPIC = "visioncap/{camera}/state"
DISCOVERY_TOPIC = "homeassistant/sensor/visioncap_{camera}_people/config"
WEBHOOK_TOPIC = "alert"  # what a webhook delivery carries (webhooks have no topics)


def topic_level(camera: str) -> str:
    """A camera id as one MQTT topic level: '/', '+' and '#' would change what the topic means."""
    return re.sub(r"[/+#\s]", "_", camera) or "_"


def _json(data: dict[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def facts_of(row: ChangeRow) -> CaptionFacts:
    return CaptionFacts(
        caption_id=row.id,
        camera=row.camera,
        captured_at=row.captured_at,
        text=row.caption or "",
        people_count=row.people_count,
        structured=row.structured if isinstance(row.structured, dict) else None,
    )


class AlertEngine:
    """Reads pages of caption changes and writes what they fire; `run_once` handles one page."""

    def __init__(
        self,
        engine: Engine,
        config: AlertsConfig,
        metrics: AlertMetrics,
        similarity: Callable[[], Similarity] | None = None,
    ) -> None:
        self._engine = engine
        self._config = config
        self._metrics = metrics
        self._zone = ZoneInfo(config.timezone)
        self._similarity_factory = similarity or _embedding_similarity
        self._similarity: Similarity | None = None
        self._announced: set[str] = set()  # cameras whose Home Assistant config this process has queued
        start = ChangePosition(0, 0) if config.start_at_beginning else stream_start(engine).position
        self.position = store.create_cursor(engine, start)

    def rules(self) -> list[AlertRule]:
        """The file's rules and those made through the API (re-read every page, so API changes apply at once)."""
        file_names = {rule.name for rule in self._config.rules}
        return [*self._config.rules, *(rule for rule in store.api_rules(self._engine) if rule.name not in file_names)]

    def run_once(self) -> int:
        """Handles one page of changes; returns how many captions it read, at least 1 when more changes wait (0:
        nothing new, or the backlog of deliveries is full and the engine waits for it)."""
        if store.pending_count(self._engine) >= self._config.delivery.max_pending:
            return 0
        rules = self.rules()
        if needs_embeddings(rules) and self._similarity is None:
            self._similarity = self._similarity_factory()
        page = changes_after(self._engine, self.position, limit=self._config.delivery.batch)
        if page.position == self.position:
            return 0
        fired: list[str] = []
        with self._engine.begin() as conn:
            for row in page.rows:
                fired += self._handle(conn, rules, row)
            if not store.advance_cursor(conn, self.position, page.position):
                conn.rollback()
                raise RuntimeError("the alerts cursor moved under this engine: is another `visioncap alerts` running?")
        self.position = page.position
        for rule in fired:
            self._metrics.fired.labels(rule).inc()
        # A walk bounded by its scan may have found only changes of rows not captioned: more may follow at once.
        return max(len(page.rows), int(page.more))

    def _handle(self, conn: Connection, rules: list[AlertRule], row: ChangeRow) -> list[str]:
        facts = facts_of(row)
        fired = []
        for rule in rules:
            if not matches(rule, facts, self._zone, self._similarity):
                continue
            if store.fired_before(conn, rule.name, facts.caption_id):
                continue
            if store.cooling(conn, rule, facts.camera, facts.captured_at):
                continue
            self._fire(conn, rule, facts)
            fired.append(rule.name)
        mqtt = self._config.mqtt
        if mqtt is not None and mqtt.captions:
            self._caption_messages(conn, mqtt.name, mqtt.home_assistant, facts)
        return fired

    def _fire(self, conn: Connection, rule: AlertRule, facts: CaptionFacts) -> None:
        values = {
            "rule": rule.name,
            "camera": facts.camera,
            "caption_id": facts.caption_id,
            "captured_at": facts.captured_at,
            "caption": facts.text,
            "people_count": facts.people_count,
            "fired_at": datetime.now(UTC),
        }
        alert_id = store.add_alert(conn, values)
        body = _json(
            {
                "alert_id": alert_id,
                "rule": rule.name,
                "camera": facts.camera,
                "caption_id": facts.caption_id,
                "captured_at": facts.captured_at.isoformat(),
                "caption": facts.text,
                "people_count": facts.people_count,
                "activities": facts.activities,
            }
        )
        wanted = set(rule.notify)
        for hook in self._config.webhooks:
            if not wanted or hook.name in wanted:
                store.add_delivery(conn, hook.name, WEBHOOK_TOPIC, body, alert_id, retain=False)
        mqtt = self._config.mqtt
        if mqtt is not None and (not wanted or mqtt.name in wanted):
            topic = ALERT_TOPIC.format(rule=rule.name)
            store.add_delivery(conn, mqtt.name, topic, body, alert_id, retain=False)

    def _caption_messages(self, conn: Connection, destination: str, announce: bool, facts: CaptionFacts) -> None:
        level = topic_level(facts.camera)
        if announce and level not in self._announced:
            # Retained on the broker, so sending it again after a restart is harmless.
            config = {
                "name": f"{facts.camera} people",
                "unique_id": f"visioncap_{level}_people",
                "state_topic": STATE_TOPIC.format(camera=level),
                "value_template": "{{ value_json.people_count }}",
                "unit_of_measurement": "people",
                "device": {"identifiers": [f"visioncap_{level}"], "name": f"visioncap {facts.camera}"},
            }
            store.add_delivery(conn, destination, DISCOVERY_TOPIC.format(camera=level), _json(config), None, True)
            self._announced.add(level)
        body = _json(
            {
                "caption_id": facts.caption_id,
                "camera": facts.camera,
                "captured_at": facts.captured_at.isoformat(),
                "caption": facts.text,
                "people_count": facts.people_count,
                "structured": facts.structured,
            }
        )
        store.add_delivery(conn, destination, CAPTION_TOPIC.format(camera=level), body, None, retain=False)
        store.add_delivery(conn, destination, STATE_TOPIC.format(camera=level), body, None, retain=True)


def _embedding_similarity() -> Similarity:
    """Cosine similarity with the shared sentence model; the rule's vectors are kept, the caption's last one too
    (one caption is compared with every semantic rule in turn)."""
    from visioncap.store.embeddings import TextEmbedder

    embedder = TextEmbedder()
    cache: dict[str, Any] = {}

    def similarity(rule_text: str, caption: str) -> float:
        for text in (rule_text, caption):
            if text not in cache:
                if len(cache) > 1000:
                    cache.clear()
                cache[text] = embedder.encode([text])[0]
        return float(cache[rule_text] @ cache[caption])

    return similarity
