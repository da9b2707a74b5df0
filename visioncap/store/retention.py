"""Retention: delete rows captured before a cutoff, with their stored JPEGs, and count what went.

Policy (process settings): `VISIONCAP_RETENTION_DAYS` for every camera, `VISIONCAP_RETENTION_CAMERA_DAYS`
(JSON, camera -> days, `null` to keep a camera forever) to override it. Unset: nothing is deleted.

- Rows are chosen by `captured_at`, whatever their status except `pending`: a pending row belongs to a
  pipeline's outbox (perhaps in a caption worker's hands right now), and the outbox bounds how many there are;
  once captioned, failed or skipped it goes at the next sweep.
- Rows go first, in batches of one `DELETE ... RETURNING` statement each (short write transactions, so the
  pipeline's writes and the API's reads are never held up for long), then the files of exactly the rows that
  statement removed. Two processes sweeping the same database at once therefore never count a row twice.
- Alerts (the `alerts` table) of a camera go by the same age as its captions (their `captured_at`), with their
  deliveries, once none of those is still being sent: an alert waiting for its receiver stays until delivered or
  given up. Finished deliveries are also purged by the alerts service itself (`delivery.keep_finished_days`).
- Files are only ever deleted inside the data directory, and only JPEGs: a row cannot point the sweep anywhere.
- Orphans: JPEGs (and `.part` files of interrupted writes) under `DATA_DIR/frames/CAMERA/` that no row refers
  to and that are older than that camera's retention go too. They come from a crash between writing a frame and
  recording it, or from rows deleted by a process with another data directory (a shared PostgreSQL).

- Free space: with `VISIONCAP_RETENTION_MIN_FREE_MB`, when the file system holding `DATA_DIR/frames` has less
  free space than that (after the age-based part of the sweep), the oldest finished rows with an image (captured
  first, whatever their age or camera) go with their images, in batches sized to what is missing, until free
  space is back at the minimum or nothing more can go (one warning then). It works without any age retention too.
  Pending rows never go for space, nor rows without an image (or whose image is gone): deleting them frees
  nothing, and among them are the records of the frames a full disk cost (`skipped`, `disk_full`).

`RetentionJob` runs sweeps on a thread every `VISIONCAP_RETENTION_INTERVAL_S` seconds (the first at start), and
soon after `wake()` (the outbox calls it when a write fails for lack of space); `visioncap api` and `visioncap
run` both start one when retention is configured, so a deployment with either process alone is covered, and the
two together are safe (above). `visioncap retention [--dry-run]` runs one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter
from sqlalchemy import ColumnElement, Connection, Engine, Row, and_, delete, func, not_, or_, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import InstrumentedAttribute

from visioncap.config.settings import Settings
from visioncap.store.records import (
    AlertDecisionRecord,
    AlertDeliveryRecord,
    AlertRecord,
    CaptionRecord,
    CaptionStatus,
    DeliveryState,
)

log = logging.getLogger(__name__)

BATCH_SIZE = 500
MIB = 1024 * 1024  # VISIONCAP_RETENTION_MIN_FREE_MB counts these, as `df -m` does
WAKE_GAP_S = 1.0  # least time between the end of one sweep and a sweep asked for by wake()
IMAGE_SUFFIXES = (".jpg", ".jpeg")
ORPHAN_SUFFIXES = (*IMAGE_SUFFIXES, ".part")
DESCRIPTION_FRAME = re.compile(r"(.+)\.f\d+\.jpg")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How long rows of each camera are kept (None: forever), and how much free space the data dir keeps."""

    default_days: float | None = None
    camera_days: Mapping[str, float | None] = field(default_factory=dict)
    min_free_bytes: int | None = None  # None: free space is not watched

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        min_free_mb = settings.retention_min_free_mb
        min_free = None if min_free_mb is None else round(min_free_mb * MIB)
        return cls(settings.retention_days, dict(settings.retention_camera_days), min_free)

    @property
    def ages_enabled(self) -> bool:
        return self.default_days is not None or any(days is not None for days in self.camera_days.values())

    @property
    def enabled(self) -> bool:
        """Whether a sweep can delete anything: an age limit somewhere, or a free-space minimum."""
        return self.ages_enabled or self.min_free_bytes is not None

    def days_for(self, camera: str) -> float | None:
        return self.camera_days.get(camera, self.default_days)

    def describe(self) -> str:
        def days(value: float | None) -> str:
            return "kept forever" if value is None else f"{value:g} days"

        parts = [f"all cameras {days(self.default_days)}"]
        parts += [f"{camera} {days(value)}" for camera, value in sorted(self.camera_days.items())]
        if self.min_free_bytes is not None:
            parts.append(f"at least {self.min_free_bytes / MIB:g} MB free")
        return ", ".join(parts)

    def _older(
        self, camera: InstrumentedAttribute[str], captured_at: InstrumentedAttribute[datetime], now: datetime
    ) -> ColumnElement[bool] | None:
        """Rows (of captions, or of alerts) captured before their camera's retention at `now`."""
        parts: list[ColumnElement[bool]] = [
            and_(camera == name, captured_at < now - timedelta(days=days))
            for name, days in self.camera_days.items()
            if days is not None
        ]
        if self.default_days is not None:
            older = captured_at < now - timedelta(days=self.default_days)
            if self.camera_days:
                older = and_(camera.not_in(list(self.camera_days)), older)
            parts.append(older)
        return or_(*parts) if parts else None

    def expired(self, now: datetime) -> ColumnElement[bool] | None:
        """The caption rows this policy deletes at `now`; None when it deletes nothing."""
        older = self._older(CaptionRecord.camera, CaptionRecord.captured_at, now)
        return None if older is None else and_(CaptionRecord.status != CaptionStatus.PENDING, older)

    def expired_alerts(self, now: datetime) -> ColumnElement[bool] | None:
        """The alerts this policy deletes at `now`: those of captions as old as the ones it deletes, once no
        delivery of theirs is still being sent (an alert waiting for its receiver is not lost to retention)."""
        older = self._older(AlertRecord.camera, AlertRecord.captured_at, now)
        if older is None:
            return None
        sending = select(AlertDeliveryRecord.id).where(
            AlertDeliveryRecord.alert_id == AlertRecord.id, AlertDeliveryRecord.state == DeliveryState.PENDING
        )
        return and_(older, ~sending.exists())

    def expired_decisions(self, now: datetime) -> ColumnElement[bool] | None:
        """The watch rules' decisions this policy deletes at `now`: those about captions as old as the ones it
        deletes (by the caption's camera and capture time, which each decision records)."""
        return self._older(AlertDecisionRecord.camera, AlertDecisionRecord.captured_at, now)


@dataclass(slots=True)
class RetentionResult:
    """What one sweep removed (or, in a dry run, would remove)."""

    dry_run: bool = False
    rows: int = 0
    files: int = 0  # images of deleted rows plus orphans
    bytes: int = 0
    orphan_files: int = 0
    missing_files: int = 0  # deleted rows whose image was already gone (or could not be deleted)
    by_camera: Counter[str] = field(default_factory=Counter)
    alerts: int = 0  # alerts of expired captions, with their finished deliveries
    decisions: int = 0  # watch rules' decisions about expired captions
    # The part of rows, files and bytes (included in those) deleted because free space was below the minimum.
    space_rows: int = 0
    space_files: int = 0
    space_bytes: int = 0
    # Free space of the data dir's file system after the sweep (a dry run: as it would be); None: not watched.
    free_bytes: int | None = None
    min_free_bytes: int | None = None
    space_short: bool = False  # free space still below the minimum: every finished row is gone already
    seconds: float = 0.0

    def line(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        cameras = ", ".join(f"{camera} {count}" for camera, count in sorted(self.by_camera.items()))
        text = (
            f"retention: {verb} {self.rows} rows{f' ({cameras})' if cameras else ''}, {self.files} files, "
            f"{self.bytes} bytes ({self.orphan_files} files without a row), {self.alerts} alerts, "
            f"{self.decisions} watch-rule decisions in {self.seconds:.2f} s"
        )
        if self.free_bytes is not None and self.min_free_bytes is not None:
            text += (
                f"; for free space: {self.space_rows} rows, {self.space_files} files, {self.space_bytes} bytes, "
                f"{self.free_bytes} bytes free (minimum {self.min_free_bytes})"
                f"{', still short: nothing more to delete' if self.space_short else ''}"
            )
        return text


def _inside(root: Path, relative: str) -> Path | None:
    """The image a row names, if it is a JPEG inside the data directory; rows never steer the sweep elsewhere."""
    path = (root / relative).resolve()
    if not path.is_relative_to(root) or path.suffix.lower() not in IMAGE_SUFFIXES:
        log.warning("retention: not deleting %r: not a JPEG inside %s", relative, root)
        return None
    return path


def _remove(path: Path, dry_run: bool) -> int | None:
    """Bytes freed (or that would be); None when the file is not there or cannot be deleted (logged)."""
    try:
        size = path.stat().st_size
        if not dry_run:
            path.unlink()
    except FileNotFoundError:
        return None
    except OSError as exc:  # e.g. permissions: the rows are gone already, the rest of the sweep goes on
        log.warning("retention: cannot delete %s: %s", path, exc)
        return None
    return size


def _row_files(image_path: str | None, frames: list[dict[str, Any]] | None) -> list[str]:
    """The image files a row holds: its image and, for an event description, its other frames."""
    names = [image_path] if image_path else []
    return names + [str(frame["path"]) for frame in frames or () if frame.get("path") and frame["path"] != image_path]


def _remove_images(
    rows: Sequence[Row[int, str, str | None, list[dict[str, Any]] | None]],
    root: Path,
    result: RetentionResult,
    for_space: bool,
) -> int:
    """Delete (or, in a dry run, measure) the images of deleted rows, count rows, files and bytes; returns the bytes."""
    counted = 0
    for _, camera, image_path, frames in rows:
        result.rows += 1
        result.space_rows += for_space
        result.by_camera[camera] += 1
        for name in _row_files(image_path, frames):
            path = _inside(root, name)
            if path is None:
                continue
            size = _remove(path, result.dry_run)
            if size is None:
                result.missing_files += 1
                continue
            result.files += 1
            result.bytes += size
            counted += size
            if for_space:
                result.space_files += 1
                result.space_bytes += size
    return counted


def _sweep_rows(
    engine: Engine,
    root: Path,
    condition: ColumnElement[bool],
    result: RetentionResult,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> None:
    columns = (CaptionRecord.id, CaptionRecord.camera, CaptionRecord.image_path, CaptionRecord.frames)
    last_id = 0
    while not should_stop():
        chosen = select(CaptionRecord.id).where(condition, CaptionRecord.id > last_id)
        chosen = chosen.order_by(CaptionRecord.id).limit(batch_size)
        with engine.begin() as conn:
            if result.dry_run:
                rows = conn.execute(select(*columns).where(CaptionRecord.id.in_(chosen))).all()
            else:
                # One statement that writes from its start: no read-then-write transaction that SQLite could
                # refuse with "database is locked" when the pipeline wrote in between.
                # The condition again on the row itself, not only in the subquery: on PostgreSQL the subquery
                # reads a snapshot taken when the statement starts, so a row the API put back to pending
                # (regenerate) in the meantime would match it still; a condition on the target row is checked again
                # on the row's newest version once its lock is granted.
                statement = delete(CaptionRecord).where(CaptionRecord.id.in_(chosen), condition)
                rows = conn.execute(statement.returning(*columns)).all()
        if not rows:
            return
        last_id = max(row[0] for row in rows) if result.dry_run else 0
        _remove_images(rows, root, result, for_space=False)


def _sweep_alerts(
    engine: Engine,
    condition: ColumnElement[bool],
    result: RetentionResult,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> None:
    def with_deliveries(conn: Connection, gone: Sequence[int]) -> None:
        # The alerts' deliveries, all finished (the condition), go in the same transaction, so no delivery row is
        # left pointing at nothing.
        conn.execute(delete(AlertDeliveryRecord).where(AlertDeliveryRecord.alert_id.in_(gone)))

    result.alerts = _delete_batches(
        engine, AlertRecord, condition, result.dry_run, batch_size, should_stop, with_deliveries
    )


def _sweep_decisions(
    engine: Engine,
    condition: ColumnElement[bool],
    result: RetentionResult,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> None:
    result.decisions = _delete_batches(engine, AlertDecisionRecord, condition, result.dry_run, batch_size, should_stop)


def _delete_batches(
    engine: Engine,
    record: type[AlertRecord] | type[AlertDecisionRecord],
    condition: ColumnElement[bool],
    dry_run: bool,
    batch_size: int,
    should_stop: Callable[[], bool],
    also: Callable[[Connection, Sequence[int]], None] | None = None,
) -> int:
    """Delete `record`'s rows that meet `condition`, a batch a transaction (`also` runs in each with the ids it
    deleted); how many went. A dry run counts them instead."""
    if dry_run:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(record).where(condition)).scalar_one())
    deleted = 0
    while not should_stop():
        chosen = select(record.id).where(condition).order_by(record.id).limit(batch_size)
        with engine.begin() as conn:
            # One statement that writes from its start (see _sweep_rows).
            gone = conn.execute(delete(record).where(record.id.in_(chosen)).returning(record.id)).scalars().all()
            if gone and also is not None:
                also(conn, gone)
        if not gone:
            break
        deleted += len(gone)
    return deleted


def _space_target(root: Path) -> Path | None:
    """Where free space is measured: the frames folder (perhaps a mount of its own), else the data dir; None when
    neither exists (nothing is stored there)."""
    for path in (root / "frames", root):
        if path.is_dir():
            return path
    return None


def _sweep_for_space(
    engine: Engine,
    root: Path,
    min_free: int,
    aged: ColumnElement[bool] | None,
    result: RetentionResult,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> None:
    target = _space_target(root)
    if target is None:
        return
    result.min_free_bytes = min_free
    # A dry run frees nothing: it counts what the age-based part would have freed and walks on past each batch.
    freed = result.bytes if result.dry_run else 0
    after: tuple[datetime, int] | None = None
    columns = (CaptionRecord.id, CaptionRecord.camera, CaptionRecord.image_path, CaptionRecord.frames)
    # Pending rows' images are the outbox's work; rows without an image free nothing (the records of frames that
    # could not be saved, a full disk's among them): neither is ever deleted for space.
    finished = and_(CaptionRecord.status != CaptionStatus.PENDING, CaptionRecord.image_path.is_not(None))
    while True:
        free = shutil.disk_usage(target).free + freed
        result.free_bytes = free
        if free >= min_free or should_stop():
            return
        query = select(CaptionRecord.id, CaptionRecord.image_path, CaptionRecord.captured_at).where(finished)
        if result.dry_run and aged is not None:
            query = query.where(not_(aged))  # counted by the age-based part already
        if after is not None:  # go on past the rows looked at (a dry run deletes nothing; others free nothing)
            captured, last_id = after
            later = or_(CaptionRecord.captured_at > captured, CaptionRecord.id > last_id)
            query = query.where(CaptionRecord.captured_at >= captured, later)
        query = query.order_by(CaptionRecord.captured_at, CaptionRecord.id).limit(batch_size)
        with engine.connect() as conn:
            candidates = conn.execute(query).all()
        if not candidates:
            result.space_short = True
            log.warning(
                "retention: %s has %d bytes free, below the minimum of %d, and no finished row with an image is "
                "left to delete",
                target,
                free,
                min_free,
            )
            return
        # Take the oldest rows whose images cover what is missing, not a whole batch: rows go for space only
        # while space is short, and only for the space they free (a row whose image is gone already stays).
        chosen: list[int] = []
        covered = 0
        for row_id, image_path, captured_at in candidates:
            after = captured_at, row_id
            path = _inside(root, image_path) if image_path is not None else None
            if path is None:
                continue
            try:
                covered += path.stat().st_size
            except OSError:
                continue
            chosen.append(row_id)
            if free + covered >= min_free:
                break
        if not chosen:
            continue
        with engine.begin() as conn:
            if result.dry_run:
                rows = conn.execute(select(*columns).where(CaptionRecord.id.in_(chosen))).all()
            else:
                # Status checked again: the API may have put a row back to pending (regenerate) since the select.
                statement = delete(CaptionRecord).where(CaptionRecord.id.in_(chosen), finished)
                rows = conn.execute(statement.returning(*columns)).all()
        counted = _remove_images(rows, root, result, for_space=True)
        if result.dry_run:  # nothing was deleted: the next batch must know what this one would have freed
            freed += counted


def _orphan_candidates(root: Path, policy: RetentionPolicy, now: datetime) -> Iterator[Path]:
    frames = root / "frames"
    if not frames.is_dir():
        return
    for camera_dir in sorted(frames.iterdir()):
        days = policy.days_for(camera_dir.name)
        if days is None or not camera_dir.is_dir():
            continue
        cutoff = (now - timedelta(days=days)).timestamp()
        for folder, _dirs, files in os.walk(camera_dir):
            for name in files:
                path = Path(folder) / name
                if path.suffix.lower() not in ORPHAN_SUFFIXES:
                    continue
                try:
                    if path.stat().st_mtime < cutoff:
                        yield path
                except FileNotFoundError:
                    continue


def _description_owner(path: Path) -> Path:
    """The image an event description's other frame is named after (the outbox's `<image>.f<n>.jpg`); a file that
    is not one stands for itself."""
    match = DESCRIPTION_FRAME.fullmatch(path.name)
    return path.with_name(f"{match.group(1)}.jpg") if match else path


def _sweep_orphans(
    engine: Engine,
    root: Path,
    policy: RetentionPolicy,
    now: datetime,
    result: RetentionResult,
    batch_size: int,
    should_stop: Callable[[], bool],
) -> None:
    batch: list[Path] = []

    def settle() -> None:
        # Rows name their image relative to the data directory (the outbox); an absolute name is honoured too. An
        # event description's other frames are named after its image (`<image>.f<n>.jpg`) and kept with it.
        owners = {path: _description_owner(path) for path in batch}
        names = {str(owner.relative_to(root)): owner for owner in owners.values()}
        names |= {str(owner): owner for owner in owners.values()}
        with engine.connect() as conn:
            query = select(CaptionRecord.image_path).where(CaptionRecord.image_path.in_(list(names)))
            referenced = {names[name] for name in conn.scalars(query) if name is not None}
        for path in batch:
            if owners[path] in referenced:
                continue
            size = _remove(path, result.dry_run)
            if size is not None:
                result.files += 1
                result.orphan_files += 1
                result.bytes += size
        batch.clear()

    for path in _orphan_candidates(root, policy, now):
        if should_stop():
            return
        batch.append(path)
        if len(batch) >= batch_size:
            settle()
    if batch:
        settle()


def sweep(
    engine: Engine,
    data_dir: Path,
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    orphans: bool = True,
    batch_size: int = BATCH_SIZE,
    should_stop: Callable[[], bool] = lambda: False,
) -> RetentionResult:
    """Delete (or, with `dry_run`, count) what `policy` says has expired at `now`, then, while the data dir's file
    system has less free space than `policy.min_free_bytes`, the oldest finished rows."""
    started = time.perf_counter()
    now = now or datetime.now(UTC)
    root = data_dir.resolve()
    result = RetentionResult(dry_run=dry_run)
    condition = policy.expired(now)
    if condition is not None:
        _sweep_rows(engine, root, condition, result, batch_size, should_stop)
        if orphans:
            _sweep_orphans(engine, root, policy, now, result, batch_size, should_stop)
    alerts = policy.expired_alerts(now)
    if alerts is not None:
        _sweep_alerts(engine, alerts, result, batch_size, should_stop)
    decisions = policy.expired_decisions(now)
    if decisions is not None:
        _sweep_decisions(engine, decisions, result, batch_size, should_stop)
    if policy.min_free_bytes is not None:
        _sweep_for_space(engine, root, policy.min_free_bytes, condition, result, batch_size, should_stop)
    result.seconds = time.perf_counter() - started
    return result


class RetentionMetrics:
    """Prometheus counters of the sweeps, in the registry of the process that sweeps (the API's or the pipeline's)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.rows = PromCounter(
            "visioncap_retention_rows_deleted_total", "Rows deleted by retention.", ["camera"], registry=registry
        )
        self.files = PromCounter(
            "visioncap_retention_files_deleted_total",
            "Stored JPEGs deleted by retention: of deleted rows (row) or referred to by no row (orphan).",
            ["kind"],
            registry=registry,
        )
        self.bytes = PromCounter(
            "visioncap_retention_bytes_deleted_total", "Bytes of the files deleted by retention.", registry=registry
        )
        self.alerts = PromCounter(
            "visioncap_retention_alerts_deleted_total",
            "Alerts deleted by retention (those of captions as old as the rows it deletes), with their deliveries.",
            registry=registry,
        )
        self.decisions = PromCounter(
            "visioncap_retention_decisions_deleted_total",
            "Watch rules' decisions deleted by retention (those about captions as old as the rows it deletes).",
            registry=registry,
        )
        self.space_rows = PromCounter(
            "visioncap_retention_space_rows_deleted_total",
            "Rows deleted by retention because free space was below VISIONCAP_RETENTION_MIN_FREE_MB (part of "
            "visioncap_retention_rows_deleted_total).",
            registry=registry,
        )
        self.space_bytes = PromCounter(
            "visioncap_retention_space_bytes_deleted_total",
            "Bytes of the images deleted by retention because free space was below the minimum (part of "
            "visioncap_retention_bytes_deleted_total).",
            registry=registry,
        )
        self.free_bytes = Gauge(
            "visioncap_retention_free_bytes",
            "Free bytes of the data dir's file system after the last sweep (only with a free-space minimum).",
            registry=registry,
        )
        self.space_short = Gauge(
            "visioncap_retention_space_short",
            "1 when the last sweep left free space below the minimum with no finished row left to delete, else 0.",
            registry=registry,
        )
        self.sweeps = PromCounter(
            "visioncap_retention_sweeps_total",
            "Retention sweeps by outcome (ok, error).",
            ["outcome"],
            registry=registry,
        )
        self.last_sweep = Gauge(
            "visioncap_retention_last_sweep_timestamp_seconds",
            "Unix time the last successful retention sweep ended.",
            registry=registry,
        )

    def observe(self, result: RetentionResult) -> None:
        for camera, count in result.by_camera.items():
            self.rows.labels(camera).inc(count)
        self.files.labels("row").inc(result.files - result.orphan_files)
        self.files.labels("orphan").inc(result.orphan_files)
        self.bytes.inc(result.bytes)
        self.alerts.inc(result.alerts)
        self.decisions.inc(result.decisions)
        self.space_rows.inc(result.space_rows)
        self.space_bytes.inc(result.space_bytes)
        if result.free_bytes is not None:
            self.free_bytes.set(result.free_bytes)
            self.space_short.set(1 if result.space_short else 0)
        self.sweeps.labels("ok").inc()
        self.last_sweep.set_to_current_time()


class RetentionJob:
    """Sweeps on a thread of its own, at start, every `interval_s` and soon after `wake()`; a failed sweep is
    logged and retried."""

    def __init__(
        self,
        engine: Engine,
        data_dir: Path,
        policy: RetentionPolicy,
        interval_s: float,
        metrics: RetentionMetrics | None = None,
        wake_gap_s: float = WAKE_GAP_S,
    ) -> None:
        self._engine = engine
        self._data_dir = data_dir
        self._policy = policy
        self._interval_s = interval_s
        self._metrics = metrics
        self._wake_gap_s = wake_gap_s
        self._stop = threading.Event()
        self._changed = threading.Condition()  # wake() and stop() notify the loop through it
        self._woken = False
        self._thread = threading.Thread(target=self._loop, name="retention", daemon=True)
        self.sweeps = 0
        self.last_result: RetentionResult | None = None

    @classmethod
    def from_settings(cls, engine: Engine, settings: Settings, metrics: RetentionMetrics | None) -> RetentionJob:
        policy = RetentionPolicy.from_settings(settings)
        return cls(engine, settings.data_dir, policy, settings.retention_interval_s, metrics)

    @property
    def enabled(self) -> bool:
        return self._policy.enabled

    def start(self) -> None:
        """Start sweeping; does nothing when the policy deletes nothing."""
        if not self._policy.enabled:
            return
        log.info("retention: %s; sweeping every %g s", self._policy.describe(), self._interval_s)
        self._thread.start()

    def wake(self) -> None:
        """Ask for a sweep now rather than at the next interval (e.g. a write failed for lack of space). Safe from
        any thread and cheap; calls before that sweep starts make one sweep together. A call while a sweep runs
        makes one more after it (that sweep may have measured free space before the failure), though no sooner
        than `wake_gap_s` after it ends, so a full disk that nothing can relieve does not make sweeps run back to
        back. When the job is not running, no sweep follows."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    @property
    def wake_pending(self) -> bool:
        """Whether a wake() is still to be answered by a sweep that starts after it."""
        with self._changed:
            return self._woken

    def stop(self, timeout: float = 10.0) -> None:
        with self._changed:
            self._stop.set()
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def __enter__(self) -> RetentionJob:
        self.start()
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    def run_once(self) -> RetentionResult | None:
        try:
            result = sweep(self._engine, self._data_dir, self._policy, should_stop=self._stop.is_set)
        except (SQLAlchemyError, OSError) as exc:  # the database restarting, a full disk: try again later
            log.warning("retention: sweep failed, next try in %g s: %s: %s", self._interval_s, type(exc).__name__, exc)
            if self._metrics is not None:
                self._metrics.sweeps.labels("error").inc()
            return None
        except Exception:  # anything else must not end the schedule either
            log.exception("retention: sweep failed, next try in %g s", self._interval_s)
            if self._metrics is not None:
                self._metrics.sweeps.labels("error").inc()
            return None
        if self._metrics is not None:
            self._metrics.observe(result)
        log.log(logging.INFO if result.rows or result.files else logging.DEBUG, "%s", result.line())
        self.last_result = result
        self.sweeps += 1
        return result

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._changed:
                self._woken = False  # the sweep about to start answers every wake() so far
            self.run_once()
            ended = time.monotonic()
            with self._changed:
                self._changed.wait_for(lambda: self._woken or self._stop.is_set(), self._interval_s)
                gap = ended + self._wake_gap_s - time.monotonic()
                if self._woken and gap > 0:
                    self._changed.wait_for(self._stop.is_set, gap)
