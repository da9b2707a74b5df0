"""The alerts engine: tails the caption change feed from a durable cursor and turns each stored caption into
alerts and deliveries.

One transaction per page: the alerts, their deliveries, the caption messages and the cursor's move commit
together, so a crash anywhere repeats the page as a whole or not at all, and every caption change is handled
exactly once. The cursor moves by compare-and-set: when it is not where this engine last saw it (another engine
moved it, or a commit whose reply was lost did), the page is rolled back and the cursor read again. The cooldown
is checked against the stored alerts, so a restart does not fire a rule again early.

Each destination's backlog has its own bound (`delivery.max_pending`): a destination at its bound gets its new
messages recorded as failed, and the others go on; only when every destination is at its bound does the engine
wait (the captions wait in the database, nothing is lost).
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, Engine

from visioncap.alerts import home_assistant as ha
from visioncap.alerts import store
from visioncap.alerts import verify as watch
from visioncap.alerts.decisions import add_decision
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.rules import CaptionFacts, Similarity, matches, needs_embeddings
from visioncap.config.alerts import AlertRule, AlertsConfig
from visioncap.config.settings import load_settings
from visioncap.store.changes import ChangePosition, ChangeRow, changes_after, stream_start

log = logging.getLogger(__name__)

ALERT_TOPIC = "visioncap/alerts/{rule}"
CAPTION_TOPIC = "visioncap/{camera}/captions"
STATE_TOPIC = "visioncap/{camera}/state"
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
        zones=tuple(
            (str(stay["zone"]), float(stay["dwell_s"]))
            for stay in (row.zones or [])
            if isinstance(stay, dict) and "zone" in stay and "dwell_s" in stay
        ),
    )


class AlertEngine:
    """Reads pages of caption changes and writes what they fire; `run_once` handles one page."""

    def __init__(
        self,
        engine: Engine,
        config: AlertsConfig,
        metrics: AlertMetrics,
        similarity: Callable[[], Similarity] | None = None,
        data_dir: Path | None = None,
        verifier: watch.Verifier | None = None,
    ) -> None:
        self._engine = engine
        # Watch rules' VLM; made at the first question when not given (rules may come later through the API).
        self.verifier = verifier
        self._config = config
        self._metrics = metrics
        self._zone = ZoneInfo(config.timezone)
        self._similarity_factory = similarity or _embedding_similarity
        self._similarity: Similarity | None = None
        self._announced: set[str] = set()  # cameras whose Home Assistant config this process has queued
        self._rules_announced: set[str] = set()  # rules whose Home Assistant event entity this process has queued
        self._data_dir = data_dir  # where frames are (snapshots); None: no snapshots
        mqtt = config.mqtt
        self._ha = mqtt if mqtt is not None and mqtt.home_assistant else None
        self._occupancy = ha.Occupancy(mqtt.occupancy_quiet_s) if mqtt is not None else None
        self._destinations = config.destination_names()
        self._full: dict[str, str] = {}  # this page's destinations at their bound -> the error their messages get
        start = ChangePosition(0, 0) if config.start_at_beginning else stream_start(engine).position
        self.position = store.create_cursor(engine, start)
        self._stale = False  # whether `position` may no longer be the stored cursor
        # This page's watch-rule answers, asked before its transaction: (rule, caption id) -> (verdict, frames sent),
        # or None where the rule's own similarity pre-filter said no.
        self._answers: dict[tuple[str, int], tuple[watch.Verdict, int] | None] = {}
        # Whether each watch rule matched each of the page's rows, as the pre-pass found: the transaction reuses it
        # (a similarity pre-filter embeds the caption; once a page is enough).
        self._matched: dict[tuple[str, int], bool] = {}

    def rules(self) -> list[AlertRule]:
        """The file's rules and those made through the API (re-read every page, so API changes apply at once)."""
        file_names = {rule.name for rule in self._config.rules}
        return [*self._config.rules, *(rule for rule in store.api_rules(self._engine) if rule.name not in file_names)]

    def run_once(self) -> int:
        """Handles one page of changes; returns how many captions it read, at least 1 when more changes wait (0:
        nothing new, or every destination's backlog is full and the engine waits for them)."""
        if self._stale:
            stored = store.read_cursor(self._engine)
            self.position = stored if stored is not None else store.create_cursor(self._engine, self.position)
            self._stale = False
        max_pending = self._config.delivery.max_pending
        pending = store.pending_by_destination(self._engine)
        full = [name for name in self._destinations if pending.get(name, 0) >= max_pending]
        if full and len(full) == len(self._destinations):
            return 0
        self._full = {
            name: f"not queued: {pending[name]} deliveries already wait (delivery.max_pending)" for name in full
        }
        rules = self.rules()
        self._home_assistant(rules)
        if (needs_embeddings(rules) or watch.needs_embeddings(rules)) and self._similarity is None:
            self._similarity = self._similarity_factory()
        page = changes_after(self._engine, self.position, limit=self._config.delivery.batch)
        if page.position == self.position:
            return 0
        fired: list[tuple[AlertRule, CaptionFacts]] = []
        refused: list[str] = []
        announced = set(self._announced)
        # The VLM is asked before the page's transaction opens: a question may take its whole deadline, and a
        # transaction open that long would hold the database (SQLite's one writer, PostgreSQL's change positions)
        # for every other writer and reader of the stream.
        self._ask_first(rules, page.rows)
        try:
            with self._engine.begin() as conn:
                moved = store.hold_cursor(conn, self.position)
                if moved:
                    for row in page.rows:
                        fired += self._handle(conn, rules, row, announced, refused)
                    moved = store.advance_cursor(conn, self.position, page.position)
                if not moved:
                    conn.rollback()
        except BaseException:
            self._stale = True  # the commit may have happened, its reply lost: the cursor says
            raise
        if not moved:
            # Another engine handled this page (an overlapping restart, a second `visioncap alerts`), or an earlier
            # commit of ours did and its reply was lost: read where the cursor is and go on from there.
            log.info("alerts: the cursor moved under this engine (another engine?); reading it again")
            self._stale = True
            return 1
        self.position = page.position
        self._announced = announced
        for rule, facts in fired:
            self._metrics.fired.labels(rule.name).inc()
            log.info(
                "alerts: rule %s fired on camera %s (caption %d, %s): %s",
                rule.name,
                facts.camera,
                facts.caption_id,
                facts.captured_at.isoformat(timespec="seconds"),
                reason(rule, facts),
            )
        for destination in refused:
            self._metrics.deliveries.labels(destination, "failed").inc()
        # A walk bounded by its scan may have found only changes of rows not captioned: more may follow at once.
        return max(len(page.rows), int(page.more))

    def _deliver(
        self,
        conn: Connection,
        refused: list[str],
        destination: str,
        topic: str,
        body: str,
        alert_id: int | None,
        retain: bool,
    ) -> None:
        error = self._full.get(destination)
        store.add_delivery(conn, destination, topic, body, alert_id, retain, refused=error)
        if error is not None:
            refused.append(destination)

    def _home_assistant(self, rules: list[AlertRule]) -> None:
        """Publishes the OFF of cameras whose quiet time has passed, and the event entities of rules new (or gone)
        since the last pass, in a transaction of their own; each pass, so an OFF is late by `poll_s` at most."""
        mqtt = self._config.mqtt
        if mqtt is None or self._occupancy is None:
            return
        ended = self._occupancy.expired(datetime.now(UTC)) if mqtt.captions and mqtt.home_assistant else []
        names = {rule.name for rule in rules} if self._ha is not None else set()
        new, gone = names - self._rules_announced, self._rules_announced - names
        if not (ended or new or gone):
            return
        with self._engine.begin() as conn:
            for level in ended:
                body = _json({"state": ha.OFF, "people_count": 0, "until": None})
                store.add_delivery(conn, mqtt.name, ha.OCCUPANCY_TOPIC.format(camera=level), body, None, True)
            for name in sorted(new):
                topic, config = ha.rule_config(mqtt.discovery_prefix, name, ALERT_TOPIC.format(rule=name))
                store.add_delivery(conn, mqtt.name, topic, _json(config), None, True)
            for name in sorted(gone):
                # An empty retained config is how HA is told the entity is gone (a rule deleted through the API).
                store.add_delivery(conn, mqtt.name, ha.rule_config_topic(mqtt.discovery_prefix, name), "", None, True)
        self._rules_announced = names
        for level in ended:
            log.info("alerts: camera %s quiet for %.0f s: occupancy off", level, mqtt.occupancy_quiet_s)

    def _handle(
        self, conn: Connection, rules: list[AlertRule], row: ChangeRow, announced: set[str], refused: list[str]
    ) -> list[tuple[AlertRule, CaptionFacts]]:
        facts = facts_of(row)
        fired: list[tuple[AlertRule, CaptionFacts]] = []
        for rule in rules:
            hit = self._matched.get((rule.name, facts.caption_id))
            if not (matches(rule, facts, self._zone, self._similarity) if hit is None else hit):
                continue
            if store.fired_before(conn, rule.name, facts.caption_id):
                continue
            if store.cooling(conn, rule, facts.camera, facts.captured_at):
                continue
            if rule.verify is not None:
                if not self._verified(conn, rule, row, facts, refused):
                    continue
            else:
                self._fire(conn, rule, facts, refused)
            fired.append((rule, facts))
        mqtt = self._config.mqtt
        if mqtt is not None and mqtt.captions:
            self._caption_messages(conn, mqtt.name, mqtt.home_assistant, facts, announced, refused)
            if mqtt.home_assistant:
                self._home_assistant_messages(conn, refused, facts, getattr(row, "image_path", None))
        return fired

    def _ask_first(self, rules: list[AlertRule], rows: list[ChangeRow]) -> None:
        """Ask the watch rules' questions about this page's candidates: each candidate's checks, then its frames,
        read in short connections, the VLM asked with none open. A candidate the page's own earlier answers put in a
        rule's cooldown is not asked (the page's transaction finds it cooling too)."""
        self._answers, self._matched = {}, {}
        watched = [rule for rule in rules if rule.verify is not None]
        if not watched:
            return
        matched: dict[tuple[str, str], list[datetime]] = {}
        for row in rows:
            facts = facts_of(row)
            for rule in watched:
                key = (rule.name, facts.caption_id)
                self._matched[key] = matches(rule, facts, self._zone, self._similarity)
                if not self._matched[key]:
                    continue
                window = timedelta(seconds=rule.cooldown_s)
                earlier = matched.get((rule.name, facts.camera), [])
                if rule.cooldown_s > 0 and any(abs(facts.captured_at - at) < window for at in earlier):
                    continue
                with self._engine.connect() as conn:
                    if store.fired_before(conn, rule.name, facts.caption_id):
                        continue
                    if store.cooling(conn, rule, facts.camera, facts.captured_at):
                        continue
                # The embedding only for a candidate the look-ups left, and with no connection held meanwhile.
                if not self._similar_enough(rule, facts):
                    self._answers[key] = None
                    continue
                with self._engine.connect() as conn:
                    frames = self._frames(conn, rule, row, facts)
                answer = self._answers[key] = self._ask(rule, facts, frames)
                if answer[0].match:
                    matched.setdefault((rule.name, facts.camera), []).append(facts.captured_at)

    def _similar_enough(self, rule: AlertRule, facts: CaptionFacts) -> bool:
        """Whether the rule's similarity pre-filter (if it has one) lets the candidate go to the VLM."""
        spec = rule.verify
        assert spec is not None
        if spec.min_similarity is None:
            return True
        assert self._similarity is not None
        return self._similarity(spec.question, facts.text) >= spec.min_similarity

    def _frames(self, conn: Connection, rule: AlertRule, row: ChangeRow, facts: CaptionFacts) -> list[bytes]:
        assert rule.verify is not None
        image_path = getattr(row, "image_path", None)
        return watch.event_frames(conn, self._data_dir, facts.caption_id, image_path, rule.verify.max_frames)

    def _ask(self, rule: AlertRule, facts: CaptionFacts, frames: list[bytes]) -> tuple[watch.Verdict, int]:
        """The VLM's answer about one candidate from these frames, and how many were sent."""
        spec = rule.verify
        assert spec is not None
        if self.verifier is None:
            # As `visioncap alerts` builds it: the alerts file's `vlm`, else the process's VISIONCAP_VLM_BASE_URL and
            # key, never an address of its own.
            settings = load_settings()
            self.verifier = watch.Verifier(
                self._config.vlm, settings.vlm_base_url, settings.vlm_api_key.get_secret_value()
            )
        verdict = self.verifier.ask(spec, facts.text, frames, facts.camera)
        self._metrics.question(rule.name, verdict.match, verdict.latency_ms)
        return verdict, len(frames)

    def _verified(
        self, conn: Connection, rule: AlertRule, row: ChangeRow, facts: CaptionFacts, refused: list[str]
    ) -> bool:
        """Stores the decision about a candidate of a watch rule (its answer asked before the page's transaction)
        and fires on a match; whether it fired. A page that rolls back asks again rather than losing an answer."""
        spec = rule.verify
        assert spec is not None
        key = (rule.name, facts.caption_id)
        if key not in self._answers:
            # Not a candidate when the page was asked about (another engine's alert ended a cooldown meanwhile):
            # asked now, in the transaction, rather than lost. Rare: the same rules and rows decide both passes.
            log.info("alerts: rule %s, caption %d: asked inside the page", rule.name, facts.caption_id)
            similar = self._similar_enough(rule, facts)
            self._answers[key] = self._ask(rule, facts, self._frames(conn, rule, row, facts)) if similar else None
        answer = self._answers.pop(key)
        if answer is None:
            return False
        verdict, frames = answer
        alert_id = self._fire(conn, rule, facts, refused, verdict) if verdict.match else None
        add_decision(
            conn,
            {
                "rule": rule.name,
                "caption_id": facts.caption_id,
                "camera": facts.camera,
                "captured_at": facts.captured_at,
                "question": spec.question,
                "frames": frames,
                "match": verdict.match,
                "reason": verdict.reason,
                "latency_ms": verdict.latency_ms,
                "prompt_tokens": verdict.prompt_tokens,
                "completion_tokens": verdict.completion_tokens,
                "error": verdict.error,
                "alert_id": alert_id,
                "decided_at": datetime.now(UTC),
            },
        )
        if verdict.error is not None:
            log.warning("alerts: rule %s, caption %d: no answer: %s", rule.name, facts.caption_id, verdict.error)
        return alert_id is not None

    def _fire(
        self,
        conn: Connection,
        rule: AlertRule,
        facts: CaptionFacts,
        refused: list[str],
        verdict: watch.Verdict | None = None,
    ) -> int:
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
                "event_type": ha.EVENT_TYPE,  # what HA's MQTT event entity of the rule reads
                "reason": reason(rule, facts),
                **(
                    {
                        "verification": {
                            "question": rule.verify.question,
                            "reason": verdict.reason,
                            "frame": f"/v1/captions/{facts.caption_id}/image",
                        }
                    }
                    if verdict is not None and rule.verify is not None
                    else {}
                ),
            }
        )
        wanted = set(rule.notify)
        for hook in self._config.webhooks:
            if not wanted or hook.name in wanted:
                self._deliver(conn, refused, hook.name, WEBHOOK_TOPIC, body, alert_id, retain=False)
        mqtt = self._config.mqtt
        if mqtt is not None and (not wanted or mqtt.name in wanted):
            topic = ALERT_TOPIC.format(rule=rule.name)
            self._deliver(conn, refused, mqtt.name, topic, body, alert_id, retain=False)
        return alert_id

    def _caption_messages(
        self,
        conn: Connection,
        destination: str,
        announce: bool,
        facts: CaptionFacts,
        announced: set[str],
        refused: list[str],
    ) -> None:
        level = topic_level(facts.camera)
        if announce and level not in announced and destination not in self._full:
            # Retained on the broker, so sending it again after a restart is harmless.
            assert self._config.mqtt is not None
            prefix = self._config.mqtt.discovery_prefix
            for topic, config in ha.camera_configs(prefix, facts.camera, level, STATE_TOPIC.format(camera=level)):
                store.add_delivery(conn, destination, topic, _json(config), None, True)
            announced.add(level)  # kept once the page commits
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
        self._deliver(conn, refused, destination, CAPTION_TOPIC.format(camera=level), body, None, retain=False)
        self._deliver(conn, refused, destination, STATE_TOPIC.format(camera=level), body, None, retain=True)

    def _home_assistant_messages(
        self, conn: Connection, refused: list[str], facts: CaptionFacts, image_path: str | None
    ) -> None:
        """The camera's occupancy (retained: on while people were seen within the quiet time) and its snapshot."""
        mqtt = self._config.mqtt
        assert mqtt is not None and self._occupancy is not None
        level = topic_level(facts.camera)
        until = self._occupancy.seen(level, facts.captured_at, facts.people_count, datetime.now(UTC))
        body = _json(
            {
                "state": ha.ON if until is not None else ha.OFF,
                "people_count": facts.people_count if until is not None else 0,
                "caption_id": facts.caption_id,
                "until": until.isoformat() if until is not None else None,
            }
        )
        self._deliver(conn, refused, mqtt.name, ha.OCCUPANCY_TOPIC.format(camera=level), body, None, retain=True)
        jpeg = _frame(self._data_dir, image_path, mqtt.snapshot_max_bytes)
        if jpeg is not None:
            encoded = base64.b64encode(jpeg).decode()
            self._deliver(conn, refused, mqtt.name, ha.SNAPSHOT_TOPIC.format(camera=level), encoded, None, True)


def reason(rule: AlertRule, facts: CaptionFacts) -> str:
    """Why a rule fired, in a few words: the conditions it gives, as the caption met them."""
    parts: list[str] = []
    if rule.cameras:
        parts.append(f"camera {facts.camera}")
    if rule.min_people is not None or rule.max_people is not None:
        parts.append(f"{facts.people_count} people")
    if rule.words:
        parts.append(("all of " if rule.all_words else "any of ") + ", ".join(rule.words))
    if rule.semantic is not None:
        parts.append(f"about {rule.semantic.text!r}")
    if rule.activities:
        parts.append("activity " + ", ".join(rule.activities))
    if rule.windows:
        parts.append("within " + ", ".join(f"{w.start}-{w.end}" for w in rule.windows))
    if rule.zones or rule.min_dwell_s is not None:
        stays = [
            f"{zone} {dwell:.0f} s"
            for zone, dwell in facts.zones
            if (not rule.zones or zone in rule.zones) and dwell >= (rule.min_dwell_s or 0.0)
        ]
        parts.append("in " + ", ".join(stays))
    return "; ".join(parts) or "every caption"


def _frame(data_dir: Path | None, image_path: str | None, max_bytes: int) -> bytes | None:
    """A caption's stored JPEG, when it is inside the data directory and at most `max_bytes`."""
    if data_dir is None or not image_path or max_bytes <= 0:
        return None
    root = data_dir.resolve()
    path = (root / image_path).resolve()
    # A row written by something else must not make this process publish a file outside the data directory.
    if not path.is_relative_to(root) or path.suffix.lower() not in (".jpg", ".jpeg"):
        return None
    try:
        if path.stat().st_size > max_bytes:
            return None
        return path.read_bytes()
    except OSError:
        return None  # gone (retention, or replaced): the snapshot is a nicety, the caption goes on


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
