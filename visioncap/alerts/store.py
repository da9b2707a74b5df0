"""The alert tables: rules made through the API, the engine's cursor, what fired, and deliveries."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, Engine, delete, exists, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from visioncap.config.alerts import AlertRule
from visioncap.store.changes import ChangePosition
from visioncap.store.records import (
    AlertCursorRecord,
    AlertDeliveryRecord,
    AlertRecord,
    AlertRuleRecord,
    DeliveryState,
    utcnow,
)
from visioncap.store.safety import MAX_ERROR_CHARS, clean_text

CURSOR_NAME = "default"

log = logging.getLogger(__name__)


def api_rules(engine: Engine) -> list[AlertRule]:
    """The rules made through the API. One stored by an older version that this one refuses (a text with a NUL,
    say) is left out with an error in the log, rather than stopping every rule: it can still be deleted."""
    with engine.connect() as conn:
        rows = list(
            conn.execute(select(AlertRuleRecord.name, AlertRuleRecord.definition).order_by(AlertRuleRecord.name))
        )
    rules = []
    for name, definition in rows:
        try:
            rules.append(AlertRule.model_validate(definition))
        except ValidationError as exc:
            log.error(
                "alerts: stored rule %r is not valid any more, left out (delete it and add it again): %s", name, exc
            )
    return rules


def add_rule(engine: Engine, rule: AlertRule) -> bool:
    """False when a rule of that name is already stored."""
    with engine.begin() as conn:
        if conn.scalar(select(exists().where(AlertRuleRecord.name == rule.name))):
            return False
        conn.execute(insert(AlertRuleRecord).values(name=rule.name, definition=rule.model_dump(mode="json")))
        return True


def replace_rule(engine: Engine, rule: AlertRule) -> bool:
    with engine.begin() as conn:
        query = update(AlertRuleRecord).where(AlertRuleRecord.name == rule.name)
        return conn.execute(query.values(definition=rule.model_dump(mode="json"), updated_at=utcnow())).rowcount == 1


def delete_rule(engine: Engine, name: str) -> bool:
    with engine.begin() as conn:
        return conn.execute(delete(AlertRuleRecord).where(AlertRuleRecord.name == name)).rowcount == 1


def load_cursor(conn: Connection) -> ChangePosition | None:
    row = conn.execute(
        select(AlertCursorRecord.change_xid, AlertCursorRecord.change_seq).where(AlertCursorRecord.name == CURSOR_NAME)
    ).first()
    return None if row is None else ChangePosition(row[0], row[1])


def create_cursor(engine: Engine, position: ChangePosition) -> ChangePosition:
    """The stored cursor, made at `position` when there is none yet (or the one another engine made meanwhile)."""
    try:
        with engine.begin() as conn:
            stored = load_cursor(conn)
            if stored is not None:
                return stored
            conn.execute(
                insert(AlertCursorRecord).values(name=CURSOR_NAME, change_xid=position.xid, change_seq=position.seq)
            )
            return position
    except IntegrityError:
        # Two engines started at once and the other one's insert won: its cursor is the cursor.
        with engine.connect() as conn:
            stored = load_cursor(conn)
        if stored is None:
            raise
        return stored


def read_cursor(engine: Engine) -> ChangePosition | None:
    with engine.connect() as conn:
        return load_cursor(conn)


def hold_cursor(conn: Connection, at: ChangePosition) -> bool:
    """Whether the cursor is still at `at`; if so, it stays locked for the rest of the caller's transaction (an
    update that changes nothing), so that another engine handling the same page waits here instead of writing
    the page's alerts twice and failing at their unique key."""
    query = (
        update(AlertCursorRecord)
        .where(
            AlertCursorRecord.name == CURSOR_NAME,
            AlertCursorRecord.change_xid == at.xid,
            AlertCursorRecord.change_seq == at.seq,
        )
        .values(change_xid=at.xid)
    )
    return conn.execute(query).rowcount == 1


def advance_cursor(conn: Connection, old: ChangePosition, new: ChangePosition) -> bool:
    """Moves the cursor from `old` to `new`; False when it is no longer at `old` (another engine moved it), and
    the caller's transaction must then be rolled back so that nothing is handled twice."""
    query = (
        update(AlertCursorRecord)
        .where(
            AlertCursorRecord.name == CURSOR_NAME,
            AlertCursorRecord.change_xid == old.xid,
            AlertCursorRecord.change_seq == old.seq,
        )
        .values(change_xid=new.xid, change_seq=new.seq)
    )
    return conn.execute(query).rowcount == 1


def cooling(conn: Connection, rule: AlertRule, camera: str, captured_at: datetime) -> bool:
    """Whether an alert of `rule` for `camera` was captured within the cooldown of `captured_at` (either side:
    captions of one camera may be stored out of capture order)."""
    if rule.cooldown_s <= 0:
        return False
    window = timedelta(seconds=rule.cooldown_s)
    return bool(
        conn.scalar(
            select(
                exists().where(
                    AlertRecord.rule == rule.name,
                    AlertRecord.camera == camera,
                    AlertRecord.captured_at > captured_at - window,
                    AlertRecord.captured_at < captured_at + window,
                )
            )
        )
    )


def fired_before(conn: Connection, rule: str, caption_id: int) -> bool:
    return bool(conn.scalar(select(exists().where(AlertRecord.rule == rule, AlertRecord.caption_id == caption_id))))


def add_alert(conn: Connection, values: dict[str, Any]) -> int:
    return int(conn.execute(insert(AlertRecord).values(**values).returning(AlertRecord.id)).scalar_one())


def add_delivery(
    conn: Connection,
    destination: str,
    topic: str,
    body: str,
    alert_id: int | None,
    retain: bool,
    refused: str | None = None,
) -> None:
    """A pending delivery; with `refused`, one recorded as failed at once with that error (its destination's
    backlog is full), so that the alert shows what it did not get."""
    values: dict[str, Any] = {"state": DeliveryState.PENDING}
    if refused is not None:
        values = {"state": DeliveryState.FAILED, "last_error": clean_text(refused, MAX_ERROR_CHARS)}
        values["finished_at"] = utcnow()
    conn.execute(
        insert(AlertDeliveryRecord).values(
            alert_id=alert_id, destination=destination, topic=topic, retain=retain, body=body, attempts=0, **values
        )
    )


def pending_count(engine: Engine) -> int:
    query = select(func.count()).where(AlertDeliveryRecord.state == DeliveryState.PENDING)
    with engine.connect() as conn:
        return int(conn.scalar(query) or 0)


def pending_by_destination(engine: Engine) -> dict[str, int]:
    """Pending deliveries per destination (those with none are absent)."""
    table = AlertDeliveryRecord
    query = select(table.destination, func.count()).where(table.state == DeliveryState.PENDING)
    with engine.connect() as conn:
        return {destination: int(count) for destination, count in conn.execute(query.group_by(table.destination))}


def fail_unknown_destinations(engine: Engine, known: Sequence[str]) -> int:
    """Fail the pending deliveries of destinations no longer configured (no worker would ever take them); how many."""
    table = AlertDeliveryRecord
    query = (
        update(table)
        .where(table.state == DeliveryState.PENDING, table.destination.not_in(list(known)))
        .values(
            state=DeliveryState.FAILED,
            last_error="no such destination is configured",
            finished_at=utcnow(),
            claimed_by=None,
            claimed_until=None,
        )
    )
    with engine.begin() as conn:
        return conn.execute(query).rowcount or 0


@dataclass(frozen=True, slots=True)
class Due:
    """A pending delivery whose time has come."""

    id: int
    destination: str
    topic: str
    retain: bool
    body: str
    attempts: int
    created_at: datetime


def due(
    engine: Engine,
    now: datetime,
    limit: int,
    destination: str | None = None,
    claimant: str | None = None,
    lease_s: float = 60.0,
) -> list[Due]:
    """Oldest first, so that each destination gets its messages in the order they were made; of one destination
    only, when given (each destination has its own worker: one that hangs holds up no other).

    With a `claimant`, the rows come claimed for it until `now + lease_s`: no other claimant gets them meanwhile
    (`FOR UPDATE SKIP LOCKED` on PostgreSQL; SQLite has one writer at a time), so two delivery processes never
    send one delivery at once. `record_attempt` or `release` ends the claim; a crashed claimant's lapses.

    Retries can still send an older message after a newer one of the same topic (their backoffs differ). For a
    retained topic (a camera's state) that would leave the broker holding the older one for every newcomer, so a
    retained message with a newer one of its topic made since (sent or not) goes out unretained."""
    table = AlertDeliveryRecord
    columns = (table.id, table.destination, table.topic, table.retain, table.body, table.attempts, table.created_at)
    where = [table.state == DeliveryState.PENDING, table.next_attempt_at <= now]
    if destination is not None:
        where.append(table.destination == destination)
    with engine.begin() as conn:
        if claimant is None:
            found = [Due(*row) for row in conn.execute(select(*columns).where(*where).order_by(table.id).limit(limit))]
        else:
            free = or_(table.claimed_until.is_(None), table.claimed_until <= now)
            locked = (
                select(table.id).where(*where, free).order_by(table.id).limit(limit).with_for_update(skip_locked=True)
            )
            claim = (
                update(table)
                .where(table.id.in_(locked.scalar_subquery()))
                .values(claimed_by=claimant, claimed_until=now + timedelta(seconds=lease_s))
                .returning(*columns)
            )
            found = sorted((Due(*row) for row in conn.execute(claim)), key=lambda d: d.id)
        retained = [d for d in found if d.retain]
        if not retained:
            return found
        # Only ids above the oldest retained one in the batch: a primary-key range, however long deliveries stay.
        newest_query = (
            select(table.destination, table.topic, func.max(table.id))
            .where(
                table.id > min(d.id for d in retained),
                table.retain.is_(True),
                table.topic.in_({d.topic for d in retained}),
            )
            .group_by(table.destination, table.topic)
        )
        newest = {(dest, topic): top for dest, topic, top in conn.execute(newest_query)}
    return [
        replace(d, retain=False) if d.retain and newest.get((d.destination, d.topic), d.id) > d.id else d for d in found
    ]


def record_attempt(
    engine: Engine,
    delivery_id: int,
    attempts: int,
    state: DeliveryState,
    error: str | None = None,
    next_attempt_at: datetime | None = None,
) -> None:
    values: dict[str, Any] = {
        "attempts": attempts,
        "state": state,
        "last_error": None,
        "claimed_by": None,
        "claimed_until": None,
    }
    if error is not None:
        values["last_error"] = clean_text(error, MAX_ERROR_CHARS)
    if next_attempt_at is not None:
        values["next_attempt_at"] = next_attempt_at
    if state != DeliveryState.PENDING:
        values["finished_at"] = utcnow()
    with engine.begin() as conn:
        conn.execute(
            update(AlertDeliveryRecord)
            .where(AlertDeliveryRecord.id == delivery_id, AlertDeliveryRecord.state == DeliveryState.PENDING)
            .values(**values)
        )


def release(engine: Engine, ids: Sequence[int], claimant: str) -> None:
    """Give back claimed deliveries that were not attempted (their destination failed earlier in the pass)."""
    if not ids:
        return
    table = AlertDeliveryRecord
    with engine.begin() as conn:
        conn.execute(
            update(table)
            .where(table.id.in_(list(ids)), table.claimed_by == claimant)
            .values(claimed_by=None, claimed_until=None)
        )


def purge_finished(engine: Engine, before: datetime, limit: int) -> int:
    """Delete up to `limit` deliveries that finished (delivered or failed) before `before`, oldest first; pending
    ones are never touched. Returns how many went."""
    table = AlertDeliveryRecord
    chosen = (
        select(table.id)
        .where(table.state != DeliveryState.PENDING, table.finished_at < before)
        .order_by(table.id)
        .limit(limit)
    )
    with engine.begin() as conn:
        return conn.execute(delete(table).where(table.id.in_(chosen))).rowcount or 0


@dataclass(frozen=True, slots=True)
class AlertFilter:
    rules: Sequence[str] = ()
    cameras: Sequence[str] = ()
    since: datetime | None = None
    until: datetime | None = None
    state: DeliveryState | None = None  # alerts with at least one delivery in this state
    before_id: int | None = None  # the page cursor: alerts with a smaller id


def list_alerts(engine: Engine, where: AlertFilter, limit: int) -> list[tuple[AlertRecord, list[AlertDeliveryRecord]]]:
    """Newest first (by id), each with its deliveries."""
    query = select(AlertRecord).order_by(AlertRecord.id.desc()).limit(limit)
    if where.rules:
        query = query.where(AlertRecord.rule.in_(list(where.rules)))
    if where.cameras:
        query = query.where(AlertRecord.camera.in_(list(where.cameras)))
    if where.since is not None:
        query = query.where(AlertRecord.captured_at >= where.since)
    if where.until is not None:
        query = query.where(AlertRecord.captured_at < where.until)
    if where.before_id is not None:
        query = query.where(AlertRecord.id < where.before_id)
    if where.state is not None:
        query = query.where(
            exists().where(AlertDeliveryRecord.alert_id == AlertRecord.id, AlertDeliveryRecord.state == where.state)
        )
    with Session(engine, expire_on_commit=False) as session:
        alerts = list(session.scalars(query))
        deliveries: dict[int, list[AlertDeliveryRecord]] = {alert.id: [] for alert in alerts}
        if alerts:
            found = session.scalars(
                select(AlertDeliveryRecord)
                .where(AlertDeliveryRecord.alert_id.in_(list(deliveries)))
                .order_by(AlertDeliveryRecord.id)
            )
            for delivery in found:
                deliveries[delivery.alert_id].append(delivery)  # type: ignore[index]
    return [(alert, deliveries[alert.id]) for alert in alerts]
