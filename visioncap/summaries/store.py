"""The `summaries` table, the window's captions it reads, and the deliveries it queues beside the alerts'.

The table has its own metadata and is made on first use (`ensure_table`, idempotent on SQLite and PostgreSQL), so
that it joins a database at any schema version without a step of the caption schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Connection,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    exists,
    insert,
    select,
)
from sqlalchemy.exc import IntegrityError

from visioncap.alerts import store as deliveries
from visioncap.alerts.engine import topic_level
from visioncap.config.alerts import AlertsConfig
from visioncap.store.records import CaptionRecord, CaptionStatus, UtcDateTime, utcnow

SUMMARY_TOPIC = "visioncap/summaries/{camera}"
WEBHOOK_TOPIC = "summary"

metadata = MetaData()
summaries = Table(
    "summaries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(16), nullable=False),  # request, hourly, daily
    # A digest's identity (kind, camera, window start): two schedulers never store one digest twice.
    Column("digest_key", String(160), nullable=True, unique=True),
    Column("cameras", JSON, nullable=False),
    # ",a,b,": what GET /v1/summaries?camera= matches with LIKE on either database (JSON is matched differently).
    Column("camera_list", Text, nullable=False),
    Column("window_start", UtcDateTime(), nullable=False),
    Column("window_end", UtcDateTime(), nullable=False),
    Column("text", Text, nullable=False),
    Column("citations", JSON, nullable=False),
    Column("caption_count", Integer, nullable=False),
    Column("depth", Integer, nullable=False),
    Column("requests", Integer, nullable=False),
    Column("max_prompt_tokens", Integer, nullable=False),
    Column("model", String(256), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False, default=utcnow),
    Index("ix_summaries_created_id", "created_at", "id"),
)


def ensure_table(engine: Engine) -> None:
    with engine.begin() as conn:
        summaries.create(conn, checkfirst=True)
        for index in summaries.indexes:
            index.create(conn, checkfirst=True)


@dataclass(frozen=True, slots=True)
class WindowCaption:
    id: int
    camera: str
    captured_at: datetime
    text: str


def window_captions(
    engine: Engine, cameras: Sequence[str], start: datetime, end: datetime, limit: int
) -> list[WindowCaption]:
    """The captioned rows of `cameras` captured in [start, end), oldest first; at most `limit` + 1 (one more says
    the window holds too many)."""
    table = CaptionRecord
    query = (
        select(table.id, table.camera, table.captured_at, table.caption)
        .where(
            table.camera.in_(list(cameras)),
            table.captured_at >= start,
            table.captured_at < end,
            table.status == CaptionStatus.CAPTIONED,
        )
        .order_by(table.captured_at, table.id)
        .limit(limit + 1)
    )
    with engine.connect() as conn:
        return [WindowCaption(row[0], row[1], row[2], row[3] or "") for row in conn.execute(query)]


@dataclass(frozen=True, slots=True)
class Summary:
    kind: str
    cameras: tuple[str, ...]
    window_start: datetime
    window_end: datetime
    text: str
    citations: tuple[int, ...]
    caption_count: int
    depth: int
    requests: int
    max_prompt_tokens: int
    model: str
    id: int | None = None
    created_at: datetime | None = None

    def message(self) -> dict[str, Any]:
        """What MQTT and webhooks receive."""
        return {
            "id": self.id,
            "kind": self.kind,
            "cameras": list(self.cameras),
            "window_start": self.window_start.isoformat(),
            "window_end": self.window_end.isoformat(),
            "text": self.text,
            "citations": list(self.citations),
            "caption_count": self.caption_count,
        }


def digest_key(kind: str, camera: str, start: datetime) -> str:
    return f"{kind}:{camera}:{start.isoformat()}"


def digest_exists(engine: Engine, key: str) -> bool:
    with engine.connect() as conn:
        return bool(conn.scalar(select(exists().where(summaries.c.digest_key == key))))


def add_summary(
    engine: Engine, summary: Summary, alerts: AlertsConfig | None, key: str | None = None
) -> Summary | None:
    """Stores `summary` and queues its deliveries in one transaction; None when a digest of `key` is already
    stored (another scheduler wrote it)."""
    created_at = utcnow()
    values = {
        "kind": summary.kind,
        "digest_key": key,
        "cameras": list(summary.cameras),
        "camera_list": "," + ",".join(summary.cameras) + ",",
        "window_start": summary.window_start,
        "window_end": summary.window_end,
        "text": summary.text,
        "citations": list(summary.citations),
        "caption_count": summary.caption_count,
        "depth": summary.depth,
        "requests": summary.requests,
        "max_prompt_tokens": summary.max_prompt_tokens,
        "model": summary.model,
        "created_at": created_at,
    }
    try:
        with engine.begin() as conn:
            new_id = int(conn.execute(insert(summaries).values(**values).returning(summaries.c.id)).scalar_one())
            stored = replace(summary, id=new_id, created_at=created_at)
            if alerts is not None:
                _queue(conn, alerts, stored)
    except IntegrityError:
        if key is not None:
            return None
        raise
    return stored


def _queue(conn: Connection, alerts: AlertsConfig, summary: Summary) -> None:
    body = json.dumps(summary.message(), separators=(",", ":"), sort_keys=True)
    camera = summary.cameras[0] if len(summary.cameras) == 1 else "all"
    if alerts.mqtt is not None:
        topic = SUMMARY_TOPIC.format(camera=topic_level(camera))
        deliveries.add_delivery(conn, alerts.mqtt.name, topic, body, None, False)
    for hook in alerts.webhooks:
        deliveries.add_delivery(conn, hook.name, WEBHOOK_TOPIC, body, None, False)


def list_summaries(engine: Engine, camera: str | None, limit: int, before_id: int | None = None) -> list[Summary]:
    """Newest first; with `camera`, those that cover it."""
    query = select(summaries).order_by(summaries.c.id.desc()).limit(limit)
    if before_id is not None:
        query = query.where(summaries.c.id < before_id)
    if camera is not None:
        query = query.where(summaries.c.camera_list.contains(f",{camera},", autoescape=True))
    with engine.connect() as conn:
        return [_summary(row) for row in conn.execute(query)]


def _summary(row: Any) -> Summary:
    return Summary(
        kind=row.kind,
        cameras=tuple(row.cameras),
        window_start=row.window_start,
        window_end=row.window_end,
        text=row.text,
        citations=tuple(row.citations),
        caption_count=row.caption_count,
        depth=row.depth,
        requests=row.requests,
        max_prompt_tokens=row.max_prompt_tokens,
        model=row.model,
        id=row.id,
        created_at=row.created_at,
    )
