"""The caption store: where the pipeline inserts caption rows and moves them through their statuses, and reads
them back. Two other modules touch the table, each for one job: `retention` deletes rows past their cutoff, and
`search` runs the API's queries."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, Table, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from visioncap.frames import Caption, SelectionReason
from visioncap.store.leases import Fence, camera_of, check_lease
from visioncap.store.records import CaptionRecord, CaptionStatus, CaptionZoneRecord
from visioncap.store.safety import MAX_ERROR_CHARS, clean_json, clean_text

_CAPTIONS: Table = CaptionRecord.__table__  # type: ignore[assignment]
_ZONES: Table = CaptionZoneRecord.__table__  # type: ignore[assignment]


def _zone_rows(caption_id: int, zones: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per zone: the longest stay of the caption's people in it."""
    longest: dict[str, float] = {}
    for stay in zones:
        longest[stay["zone"]] = max(longest.get(stay["zone"], 0.0), float(stay["dwell_s"]))
    return [{"caption_id": caption_id, "zone": zone, "dwell_s": dwell} for zone, dwell in sorted(longest.items())]


@dataclass(frozen=True, slots=True)
class NewCaption:
    """What is known about a selected frame before the VLM sees it."""

    pipeline: str
    camera: str
    source: str
    frame_index: int
    offset_s: float
    captured_at: datetime
    reason: SelectionReason
    people: list[dict[str, Any]]
    image_width: int
    image_height: int
    model: str
    event_key: str = ""
    event_ids: list[int] = field(default_factory=list)
    score: float = 0.0
    image_path: str | None = None
    image_tokens: int = 0
    # Optional geometry, so that readers can draw `people` (frame pixels) on the stored image.
    frame_width: int | None = None
    frame_height: int | None = None
    image_region: list[int] | None = None  # [x1, y1, x2, y2] of the frame the image shows; None: the whole frame
    # The zones the frame's people stood in: [{"zone", "track_id", "dwell_s"}] (frames.ZoneStay.as_dict).
    zones: list[dict[str, Any]] = field(default_factory=list)
    # The camera's zones when the frame was taken, {name: [[x, y], ...]} normalised: what `?boxes=true` draws.
    zone_shapes: dict[str, list[list[float]]] | None = None
    # An event description's frames, oldest first (frames.EventFrame.as_dict, and "path" of each file, one of them
    # `image_path`); None for a frame's caption.
    frames: list[dict[str, Any]] | None = None


@dataclass(frozen=True, slots=True)
class PendingRow:
    """A pending row as the outbox needs it after a restart."""

    id: int
    camera: str
    event_key: str
    score: float
    attempts: int
    image_path: str | None
    frames: list[dict[str, Any]] | None = None  # an event description's frames (NewCaption.frames)


class CaptionStore:
    """Writes rows through their outbox states and reads them back; each write is its own transaction.

    Text that came from a model or an exception is made storable here, on the way in, whatever wrote it: a NUL
    byte in a caption is refused by PostgreSQL, and a write that can never succeed must not be retried forever.

    With a `fence` (a worker holding camera leases), every insert and status write checks, in its transaction,
    that the worker still holds the camera's lease with its token, and raises FencedOut otherwise.
    """

    def __init__(self, engine: Engine, fence: Fence | None = None) -> None:
        self._engine = engine
        self._fence = fence
        self._sessions = sessionmaker(engine, expire_on_commit=False)

    @property
    def engine(self) -> Engine:
        return self._engine

    def create_schema(self) -> None:
        """Create or migrate the tables, indexes and full-text search, whoever starts first (pipeline or API)."""
        from visioncap.store.schema import ensure_schema

        ensure_schema(self._engine)

    def add(
        self,
        new: NewCaption,
        status: CaptionStatus = CaptionStatus.PENDING,
        error: str | None = None,
        *,
        fenced: bool = True,
    ) -> int | None:
        """Insert a row; None when this camera already has a row for this instant (a re-run of a file).

        `fenced=False`: without the lease check, for a frame this worker selected while it held the camera, which
        it could not store then (the database was away) and the camera's new owner cannot know of."""
        values = {
            **asdict(new),
            "people_count": len(new.people),
            "status": status,
            "error": None if error is None else clean_text(error, MAX_ERROR_CHARS),
        }
        try:
            # Core on a connection, like _update: the ORM's unit of work would cost more CPU than the insert.
            with self._engine.begin() as conn:
                if self._fence is not None and fenced:
                    check_lease(conn, self._fence, new.camera)
                inserted = conn.execute(insert(_CAPTIONS).values(**values)).inserted_primary_key
                if inserted is not None and new.zones:
                    conn.execute(insert(_ZONES), _zone_rows(int(inserted[0]), new.zones))
        except IntegrityError:
            return None
        assert inserted is not None
        return int(inserted[0])

    def ping(self) -> None:
        """Raises when the database does not answer."""
        with self._engine.connect() as conn:
            conn.execute(select(1))

    def find_instant(self, camera: str, captured_at: datetime) -> tuple[int, str | None] | None:
        """The id and image path of the camera's row for this instant, if there is one.

        A write whose commit reached the database but whose answer was lost looks like a failure; written again it
        meets this row, and the image path (unique per selected frame) tells whether it is the same frame.
        """
        query = select(CaptionRecord.id, CaptionRecord.image_path).where(
            CaptionRecord.camera == camera, CaptionRecord.captured_at == captured_at
        )
        with self._sessions() as session:
            row = session.execute(query).first()
        return None if row is None else (row[0], row[1])

    def _update(self, caption_id: int, **values: Any) -> None:
        if isinstance(values.get("caption"), str):
            values["caption"] = clean_text(values["caption"])
        if isinstance(values.get("error"), str):
            values["error"] = clean_text(values["error"], MAX_ERROR_CHARS)
        if values.get("structured") is not None:
            values["structured"] = clean_json(values["structured"])
        # A Core statement on a connection: the ORM's unit of work and bulk-update bookkeeping cost about a third
        # of the CPU of each caption stored (SQLite).
        with self._engine.begin() as conn:
            statement = update(_CAPTIONS).where(_CAPTIONS.c.id == caption_id)
            if self._fence is not None and (camera := camera_of(conn, caption_id)) is not None:
                check_lease(conn, self._fence, camera)
                # Only a pending row takes an outcome: a stale answer must not overwrite another owner's caption.
                statement = statement.where(_CAPTIONS.c.status == CaptionStatus.PENDING)
            conn.execute(statement.values(**values))

    def mark_captioned(self, caption_id: int, caption: Caption, attempts: int) -> None:
        self._update(
            caption_id,
            status=CaptionStatus.CAPTIONED,
            caption=caption.text,
            structured=caption.structured,
            model=caption.model,
            prompt_tokens=caption.prompt_tokens,
            completion_tokens=caption.completion_tokens,
            latency_ms=caption.latency_s * 1000,
            attempts=attempts,
            error=None,
        )

    def mark_retrying(self, caption_id: int, error: str, attempts: int) -> None:
        """A transient failure: the row stays pending, with the last error and the attempt count."""
        self._update(caption_id, attempts=attempts, error=error)

    def mark_failed(self, caption_id: int, error: str, attempts: int) -> None:
        self._update(caption_id, status=CaptionStatus.FAILED, error=error, attempts=attempts)

    def mark_skipped(self, caption_id: int, reason: str, image_removed: bool = False) -> None:
        values: dict[str, Any] = {"status": CaptionStatus.SKIPPED, "error": reason}
        if image_removed:
            values["image_path"] = None
        self._update(caption_id, **values)

    def pending(self, pipeline: str | None = None) -> list[PendingRow]:
        """Pending rows (of one pipeline), oldest first: a restarted pipeline captions them before anything new."""
        query = (
            select(
                CaptionRecord.id,
                CaptionRecord.camera,
                CaptionRecord.event_key,
                CaptionRecord.score,
                CaptionRecord.attempts,
                CaptionRecord.image_path,
                CaptionRecord.frames,
            )
            .where(CaptionRecord.status == CaptionStatus.PENDING)
            .order_by(CaptionRecord.id)
        )
        if pipeline is not None:
            query = query.where(CaptionRecord.pipeline == pipeline)
        with self._sessions() as session:
            return [PendingRow(*row) for row in session.execute(query)]

    def get(self, caption_id: int) -> CaptionRecord | None:
        with self._sessions() as session:
            return session.get(CaptionRecord, caption_id)

    def list(
        self, camera: str | None = None, status: CaptionStatus | None = None, limit: int = 50
    ) -> list[CaptionRecord]:
        """Newest first (by capture time, then id)."""
        query = select(CaptionRecord).order_by(CaptionRecord.captured_at.desc(), CaptionRecord.id.desc())
        if camera is not None:
            query = query.where(CaptionRecord.camera == camera)
        if status is not None:
            query = query.where(CaptionRecord.status == status)
        with self._sessions() as session:
            return list(session.scalars(query.limit(limit)))

    def requeue(self, caption_id: int) -> bool:
        """Put a finished row (captioned, failed, skipped) with a stored image back to pending, as new.

        The old caption, error and usage are cleared; the row's pipeline captions it again within seconds while
        it runs (its outbox polls for pending rows), or first thing in its next run. False when the row does not
        exist, is already pending, or has no image.
        """
        query = (
            update(CaptionRecord)
            .where(
                CaptionRecord.id == caption_id,
                CaptionRecord.status != CaptionStatus.PENDING,
                CaptionRecord.image_path.is_not(None),
            )
            .values(
                status=CaptionStatus.PENDING,
                attempts=0,
                caption=None,
                structured=None,
                error=None,
                prompt_tokens=None,
                completion_tokens=None,
                latency_ms=None,
            )
        )
        with self._sessions.begin() as session:
            # An UPDATE answers with a cursor result (its row count); Session.execute is typed for any statement.
            return cast(CursorResult[Any], session.execute(query)).rowcount == 1

    def count(self, status: CaptionStatus | None = None) -> int:
        query = select(func.count()).select_from(CaptionRecord)
        if status is not None:
            query = query.where(CaptionRecord.status == status)
        with self._sessions() as session:
            return int(session.scalar(query) or 0)
