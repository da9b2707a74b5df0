"""Database tables, and the closed sets of values their columns hold (also metric labels and API enums)."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TypeVar, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from visioncap.frames import SelectionReason


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite would hand back naive ones)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: store times with a timezone")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


E = TypeVar("E", bound=StrEnum)


class Base(DeclarativeBase):
    pass


def utcnow() -> datetime:
    return datetime.now(UTC)


def table_of(record: type[Base]) -> Table:
    """A mapped class's table, as the Table it is (SQLAlchemy types `__table__` as any FromClause)."""
    return cast(Table, record.__table__)


class CaptionStatus(StrEnum):
    """Where a selected frame is in the outbox."""

    PENDING = "pending"  # saved, waiting for (or between attempts at) a caption
    CAPTIONED = "captioned"
    FAILED = "failed"  # the VLM refused it for good (e.g. HTTP 400); the error says why
    SKIPPED = "skipped"  # never sent: coalesced, queue full, too old; the error says why (a SkipReason first)


class SkipReason(StrEnum):
    """Why a selected frame was never captioned: the `reason` label of the skip metric, and the start of the
    skipped row's error (`<reason>: <detail>`)."""

    COALESCED = "coalesced"  # the queue was full and a better frame of the same event took its place
    QUEUE_FULL = "queue-full"  # the queue was full and nothing of its event could make room
    DISK_FULL = "disk_full"  # its image could not be written for lack of space
    IMAGE_WRITE_FAILED = "image_write_failed"  # its image could not be written for another reason
    JOURNAL_FULL = "journal_full"  # the database was away and the journal full (counted, never stored)
    DEADLINE = "deadline"  # the gateway's deadline for background work passed before the VLM had room


class CameraState(StrEnum):
    """Where a camera stands; the values are what logs, metrics, stored records and the API show."""

    STARTING = "starting"
    """Opening the source for the first time."""
    ONLINE = "online"
    """Frames are arriving."""
    RECONNECTING = "reconnecting"
    """The stream failed to open or was lost; it is being reopened with growing waits."""
    OFFLINE = "offline"
    """Still failing after the wait between attempts has grown to its maximum; retries go on at that pace."""
    FINISHED = "finished"
    """Stopped on request, or its file or folder ended; no more frames will come."""
    FAILED = "failed"
    """A file or folder that could not be read (the pipeline reports it; a live source never gives up)."""
    PAUSED = "paused"
    """Paused by its configuration (the API or `visioncap cameras pause`); not read until resumed."""


class CameraOrigin(StrEnum):
    """Who created a camera's configuration row."""

    FILE = "file"  # seeded by `visioncap run` from its pipeline file
    API = "api"  # added through the API or `visioncap cameras add`


class EnumText(TypeDecorator[E]):
    """A StrEnum column stored as its value in a VARCHAR: the same bytes as a string column, a member when read.
    Writing a value outside the enum fails before the database sees it; reading one fails too, unless `lenient`,
    which reads it as None (a value some newer writer stored, shown as unknown)."""

    impl = String
    cache_ok = True

    def __init__(self, enum_class: type[E], length: int, lenient: bool = False) -> None:
        super().__init__(length)
        self.enum_class = enum_class
        self.lenient = lenient

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        return None if value is None else self.enum_class(value).value

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        if value is None:
            return None
        try:
            return self.enum_class(value)
        except ValueError:
            if self.lenient:
                return None
            raise


class CaptionRecord(Base):
    """One selected frame and what became of it. Rows are written before any VLM call (the outbox)."""

    __tablename__ = "captions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    camera: Mapped[str] = mapped_column(String(64))
    source: Mapped[str] = mapped_column(Text)
    frame_index: Mapped[int] = mapped_column(Integer)
    offset_s: Mapped[float] = mapped_column(Float)
    captured_at: Mapped[datetime] = mapped_column(UtcDateTime())
    reason: Mapped[SelectionReason] = mapped_column(EnumText(SelectionReason, 32))
    event_key: Mapped[str] = mapped_column(String(96))
    event_ids: Mapped[list[int]] = mapped_column(JSON, default=list)
    score: Mapped[float] = mapped_column(Float, default=0.0)
    people: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    people_count: Mapped[int] = mapped_column(Integer)
    image_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    image_width: Mapped[int] = mapped_column(Integer)
    image_height: Mapped[int] = mapped_column(Integer)
    image_tokens: Mapped[int] = mapped_column(Integer, default=0)
    status: Mapped[CaptionStatus] = mapped_column(EnumText(CaptionStatus, 16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    caption: Mapped[str | None] = mapped_column(Text, nullable=True)
    structured: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    model: Mapped[str] = mapped_column(String(256))
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)
    # Geometry for drawing `people` (frame pixels) on the stored image; null when the writer did not record it.
    frame_width: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    frame_height: Mapped[int | None] = mapped_column(Integer, nullable=True, default=None)
    image_region: Mapped[list[int] | None] = mapped_column(JSON, nullable=True, default=None)  # [x1, y1, x2, y2]
    # The zones the frame's people stood in: [{zone, track_id, dwell_s}] (schema step 17; null before it).
    zones: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True, default=None)
    # The camera's zone polygons then, {name: [[x, y], ...]} normalised (step 17): drawn on the image on request.
    zone_shapes: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True, default=None)
    # An event description's frames, oldest first: [{role, frame_index, offset_s, width, height, image_tokens,
    # path}] (step 19); null for a frame's caption.
    frames: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True, default=None)

    __table_args__ = (
        # A camera sees one frame at a time: re-running a file finds its frames already stored.
        UniqueConstraint("camera", "captured_at", name="uq_captions_camera_captured"),
        Index("ix_captions_status", "status"),
        # The API's newest-first pages (all cameras, one camera) and its live stream (rows changed since).
        Index("ix_captions_captured_id", "captured_at", "id"),
        Index("ix_captions_camera_captured_id", "camera", "captured_at", "id"),
        Index("ix_captions_updated_id", "updated_at", "id"),
    )


class AlertDecisionRecord(Base):
    """A watch rule's question about one caption and the VLM's answer (schema step 16), listed by
    /v1/alerts/decisions; deleted by retention once its caption's age is past its camera's retention."""

    __tablename__ = "alert_decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rule: Mapped[str] = mapped_column(String(64))
    caption_id: Mapped[int] = mapped_column(Integer)  # no foreign key: retention deletes it after its caption
    camera: Mapped[str] = mapped_column(String(64))
    captured_at: Mapped[datetime] = mapped_column(UtcDateTime())
    question: Mapped[str] = mapped_column(Text)
    frames: Mapped[int] = mapped_column(Integer)
    match: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # null: no answer (error)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    alert_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the alert a match fired, if any
    decided_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    __table_args__ = (
        Index("ix_alert_decisions_rule_caption", "rule", "caption_id"),
        Index("ix_alert_decisions_camera_id", "camera", "id"),
    )


class CaptionZoneRecord(Base):
    """A zone a caption's people stood in, with the longest stay in it so far (schema step 17): what `?zone=` and
    `min_dwell_s` filter by, through an index; deleted with its caption."""

    __tablename__ = "caption_zones"

    caption_id: Mapped[int] = mapped_column(Integer, ForeignKey("captions.id", ondelete="CASCADE"), primary_key=True)
    zone: Mapped[str] = mapped_column(String(64), primary_key=True)
    dwell_s: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_caption_zones_zone_dwell", "zone", "dwell_s", "caption_id"),)


class CameraRecord(Base):
    """What the pipeline last reported of one camera: its state and the newest frame it analysed."""

    __tablename__ = "cameras"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(Text)  # path or URL, credentials masked (visioncap.redact)
    # None: a state this version does not know (written by a newer one); the column itself is never null.
    state: Mapped[CameraState | None] = mapped_column(EnumText(CameraState, 16, lenient=True), nullable=False)
    state_since: Mapped[datetime] = mapped_column(UtcDateTime())
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Capture time (same clock as captions.captured_at) of the newest analysed frame; written every few seconds.
    last_frame_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    frames_analysed: Mapped[int] = mapped_column(Integer, default=0)  # in the reporting run
    reported_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class CameraConfigRecord(Base):
    """What a worker should run for one camera (schema step 12): its validated config (visioncap.config.cameras,
    as JSON, never holding a secret) and a version bumped on every change, so a worker sees changes cheaply.
    The `cameras` table keeps what the pipeline reports; this one what it is asked to do."""

    __tablename__ = "camera_configs"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    origin: Mapped[CameraOrigin] = mapped_column(EnumText(CameraOrigin, 16))
    # SHA-256 of the pipeline file's entry for this camera when it last seeded it: a seed writes the row only when
    # the file's entry changed since, so edits made through the API survive restarts of the worker.
    seed_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    config_version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    __table_args__ = (Index("ix_camera_configs_pipeline", "pipeline"),)


class PipelineSeedRecord(Base):
    """A version of a pipeline file's cameras that seeded the table (schema step 14), by the digest of its camera
    entries. Workers of one pipeline may start with different versions of its file (a rollout, a pod crash-looping
    on the old one): a version seen before that is not the newest is stale and seeds nothing, so an old file never
    reverts a newer one."""

    __tablename__ = "pipeline_seeds"

    pipeline: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Counts up per pipeline each time a version becomes the newest (its first seed, or `visioncap cameras
    # apply`): the highest is the version the table follows. A counter, not a time: workers' clocks differ.
    generation: Mapped[int] = mapped_column(Integer)
    seeded_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class WorkerRecord(Base):
    """A live `visioncap worker` (schema step 13, used on PostgreSQL): its capacity, read by the others to share
    the cameras out, and a heartbeat in the database's clock; a worker whose heartbeat is older than a lease counts
    as gone."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    pipeline: Mapped[str] = mapped_column(String(128))
    capacity: Mapped[int] = mapped_column(Integer)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime())


class CameraLeaseRecord(Base):
    """Which worker runs a camera (schema step 13): its owner until `expires_at` (the database's clock), and a
    fencing token raised on every new claim, which each of the owner's caption writes must still match."""

    __tablename__ = "camera_leases"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    token: Mapped[int] = mapped_column(BigInteger, default=0)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
    renewed_at: Mapped[datetime] = mapped_column(UtcDateTime())


class CaptionCountRecord(Base):
    """Rows of `captions` per camera and status, kept by triggers (schema step 8) so no request counts rows."""

    __tablename__ = "caption_counts"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[CaptionStatus] = mapped_column(EnumText(CaptionStatus, 16), primary_key=True)
    row_count: Mapped[int] = mapped_column(Integer)


class CaptionEventRecord(Base):
    """Rows of `captions` per camera and event key, kept by the same triggers: the distinct events of a camera."""

    __tablename__ = "caption_events"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_key: Mapped[str] = mapped_column(String(96), primary_key=True)
    row_count: Mapped[int] = mapped_column(Integer)


class CaptionEventCountRecord(Base):
    """Distinct non-empty event keys per camera (rows of `caption_events`), kept by triggers on that table."""

    __tablename__ = "caption_event_counts"

    camera: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_count: Mapped[int] = mapped_column(Integer)


# --- Alerts (schema step 10): rules made through the API, the engine's cursor, what fired, what was sent. ---


class DeliveryState(StrEnum):
    """Where one message to one destination is."""

    PENDING = "pending"  # not yet acknowledged; sent again after its backoff
    DELIVERED = "delivered"  # the receiver acknowledged it (HTTP 2xx, MQTT PUBACK)
    FAILED = "failed"  # given up: attempts or age ran out, or the receiver refused it for good


class AlertRuleRecord(Base):
    """A rule made through the API (rules of the alerts file live in that file); `definition` is an AlertRule."""

    __tablename__ = "alert_rules"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    definition: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)


class AlertCursorRecord(Base):
    """How far an alerts engine has read the change feed: every caption change at or before it is handled."""

    __tablename__ = "alert_cursor"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    change_xid: Mapped[int] = mapped_column(BigInteger)
    change_seq: Mapped[int] = mapped_column(BigInteger)


class AlertRecord(Base):
    """One rule firing on one caption."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rule: Mapped[str] = mapped_column(String(64))
    camera: Mapped[str] = mapped_column(String(64))
    caption_id: Mapped[int] = mapped_column(Integer)
    captured_at: Mapped[datetime] = mapped_column(UtcDateTime())
    caption: Mapped[str] = mapped_column(Text)
    people_count: Mapped[int] = mapped_column(Integer)
    fired_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    __table_args__ = (
        # A caption changed again (regenerated) comes through the feed again: it fires a rule at most once.
        UniqueConstraint("rule", "caption_id", name="uq_alerts_rule_caption"),
        # The cooldown's look-up (newest alert of a rule and camera) and the API's newest-first pages.
        Index("ix_alerts_rule_camera_captured", "rule", "camera", "captured_at"),
        Index("ix_alerts_fired_id", "fired_at", "id"),
    )


class AlertDeliveryRecord(Base):
    """One message to one destination (an alert, or a caption for MQTT), kept until delivered or failed."""

    __tablename__ = "alert_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    alert_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # null: a caption or state message
    destination: Mapped[str] = mapped_column(String(64))
    topic: Mapped[str] = mapped_column(String(256))  # MQTT topic; webhooks: the kind of message ("alert")
    retain: Mapped[bool] = mapped_column(Boolean, default=False)
    body: Mapped[str] = mapped_column(Text)  # the exact bytes sent every attempt, so a signature stays the same
    state: Mapped[DeliveryState] = mapped_column(EnumText(DeliveryState, 16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    next_attempt_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # The delivery process sending it now, until when (schema step 15): several `visioncap alerts` never send one
    # delivery at once, and a crashed one's claims lapse.
    claimed_by: Mapped[str | None] = mapped_column(String(64), nullable=True)
    claimed_until: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)

    __table_args__ = (
        Index("ix_alert_deliveries_state_id", "state", "id"),
        Index("ix_alert_deliveries_alert", "alert_id"),
    )
