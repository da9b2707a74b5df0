"""The durable outbox between selection and the VLM.

A selected frame is written to disk and recorded as `pending` before any VLM call. Workers take due frames,
and each ends `captioned`, `failed` (refused for good) or back in the queue after a transient failure, with
exponential backoff. Rows still pending when a process stops are captioned first by the next one. The queue
is bounded: when full, frames of the same event are coalesced (the best kept) and others are recorded as
`skipped` with the reason, so memory and disk stay bounded however long the VLM is away.

The database may be away too. Then rows and outcomes go to the journal (`journal.py`, local disk, bounded by
`outbox.journal_capacity`) and a flusher thread writes them when it answers again; selection and captioning go
on meanwhile, and an answer the VLM gave is never asked for twice. A frame whose image cannot be written (a
full disk) is recorded as skipped with reason `disk_full`; the others go on.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.journal import RESERVE_BYTES, Journal, JournalEntry, Outcome
from visioncap.pipeline.metrics import FailureKind, PipelineMetrics
from visioncap.store import CaptionStatus, CaptionStore, NewCaption
from visioncap.store.leases import FencedOut
from visioncap.store.records import SkipReason
from visioncap.store.safety import describe, is_unavailable

log = logging.getLogger(__name__)

# One line per camera per this many seconds while its frames cannot be written: a full disk lasts a while.
DISK_WARN_EVERY_S = 60.0
STORE_RETRY_INITIAL_S = 0.5


class PutResult(StrEnum):
    QUEUED = "queued"
    JOURNALED = "journaled"  # queued; the database is away, so its row waits in the journal
    REPLACED = "replaced"  # queue full: this frame took the place of a worse one of its event
    COALESCED = "coalesced"  # queue full: a better frame of the event is already waiting; recorded as skipped
    QUEUE_FULL = "queue-full"  # queue full and nothing of its event to coalesce with; recorded as skipped
    DISK_FULL = "disk_full"  # its image could not be written; recorded as skipped
    JOURNAL_FULL = "journal_full"  # neither the database nor the journal could take it; counted and logged
    UNSTORABLE = "unstorable"  # the database refuses its row for good; counted as failed and logged
    DUPLICATE = "duplicate"  # this camera already has a row for this instant (a re-run of a file)
    FENCED = "fenced"  # this worker lost the camera's lease: the write was refused and the work discarded


CAPTIONING = (PutResult.QUEUED, PutResult.JOURNALED, PutResult.REPLACED)

# What `Outbox.counts` counts: final statuses of frames, and puts that stored nothing (or only a skipped row).
Counted = CaptionStatus | PutResult


def _skip_error(reason: SkipReason, detail: str) -> str:
    """A skipped row's error: its reason code first, so that it reads the same however it was skipped."""
    return f"{reason}: {detail}"


def _needs_caption(entry: JournalEntry) -> bool:
    return entry.outcome is None or entry.outcome.status is CaptionStatus.PENDING


def _describe_entry(entry: JournalEntry) -> str:
    """What a journal entry holds, for a person to find the frame: its camera and instant, or its row."""
    if entry.new is not None:
        what = f"frame of camera {entry.new.camera} at {entry.new.captured_at.isoformat()}"
        what += f" (frame {entry.new.frame_index} of {entry.new.source})"
    else:
        what = f"row #{entry.row_id}"
    outcome = entry.outcome
    state = "pending" if outcome is None else outcome.status.value
    if outcome is not None and outcome.error:
        state += f": {outcome.error}"
    return f"{what}, {state}"


def _inserted_final(new: NewCaption, outcome: Outcome | None) -> bool:
    """A frame skipped before its image was written is inserted in its final state, in one statement."""
    return outcome is not None and outcome.status is CaptionStatus.SKIPPED and not new.image_path


@dataclass(order=True)
class OutboxItem:
    """A pending frame handed to a worker."""

    due: float
    seq: int
    key: str = field(compare=False)  # its image path: known before the database has its row
    id: int | None = field(compare=False)  # the row id; None while the row waits in the journal
    camera: str = field(compare=False)
    event_key: str = field(compare=False)
    score: float = field(compare=False)
    image_path: Path | None = field(compare=False)
    attempts: int = field(compare=False, default=0)
    # An event description's images, oldest first (one of them `image_path`): sent together, never coalesced.
    frame_paths: tuple[Path, ...] = field(compare=False, default=())

    @property
    def files(self) -> tuple[Path, ...]:
        """Every image file the item holds."""
        return self.frame_paths or ((self.image_path,) if self.image_path is not None else ())


@dataclass(frozen=True, slots=True)
class StorageHealth:
    """What `/readyz` and the metrics say of the pipeline's storage."""

    database_ok: bool
    database_down_since: float | None  # time.time() of the first failure of the current outage
    database_error: str | None
    journal_entries: int
    disk_ok: bool
    disk_full_since: float | None
    disk_full_frames: int  # frames skipped for a full disk in this process


class Outbox:
    """Thread-safe; `put` from the selection thread, `take`/`complete`/`retry`/`fail` from caption workers."""

    def __init__(
        self,
        store: CaptionStore,
        data_dir: Path,
        config: OutboxConfig,
        metrics: PipelineMetrics,
        clock: Callable[[], float] = time.monotonic,
        pipeline: str | None = None,
        on_disk_full: Callable[[], None] | None = None,
        owns: Callable[[str], bool] | None = None,
        journal_reserve_bytes: int = RESERVE_BYTES,
    ) -> None:
        self._store = store
        # A worker sharing cameras by leases takes pending rows of the cameras it holds only.
        self._owns = owns
        self._pipeline = pipeline
        self._data_dir = data_dir
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._on_disk_full = on_disk_full
        self._lock = threading.Condition()
        self._heap: list[OutboxItem] = []
        self._queued: dict[str, OutboxItem] = {}  # by key: waiting, not in flight
        self._by_event: dict[str, str] = {}  # event key -> key of its waiting frame
        self._in_flight: dict[str, OutboxItem] = {}
        self._seq = itertools.count()
        self._closed = False
        self.counts: Counter[Counted] = Counter()  # outcomes in this process
        # A worker (leases) may share its data folder with others: its journal is a slot of its own.
        self._journal = Journal(data_dir, pipeline, shared=owns is not None, reserve_bytes=journal_reserve_bytes)
        self._journaled: dict[str, JournalEntry] = {}
        self._journal_loaded = False
        self._flusher: threading.Thread | None = None
        self._down_since: float | None = None
        self._down_error: str | None = None
        self._disk_full_since: float | None = None
        self._disk_warned: dict[tuple[str, SkipReason], float] = {}  # (camera, reason) -> when it was last logged
        self._finished_during_read: set[str] | None = None  # while `recover` reads pending rows
        self._metrics.store_available.set(1)

    # -- producer side ---------------------------------------------------------------------------

    def recover(self) -> int:
        """Queue frames this process does not hold yet: what a previous run left (its journal, then its pending
        rows, ahead of anything new) and rows put back later, e.g. by the API's regenerate. Returns how many were
        added. While the database is away only the journal is read."""
        added = 0
        if not self._journal_loaded:
            self._journal_loaded = True
            added += self._load_journal()
        with self._lock:
            if self._down_since is not None:
                return added
            # Frames finished while the rows are read were pending when read: they must not come back.
            self._finished_during_read = set()
        try:
            rows = self._store.pending(self._pipeline)
        except Exception as exc:
            with self._lock:
                self._finished_during_read = None
            if not is_unavailable(exc):
                raise
            self._store_failed(exc)
            return added
        with self._lock:
            # A journaled outcome that is final must not be captioned again, though its row is still pending.
            settled = {key for key, entry in self._journaled.items() if not _needs_caption(entry)}
            held = self._queued.keys() | self._in_flight.keys() | settled | (self._finished_during_read or set())
            self._finished_during_read = None
            rows = [r for r in rows if (r.image_path or f"#{r.id}") not in held]
            if self._owns is not None:
                rows = [r for r in rows if self._owns(r.camera)]
            for row in rows:
                self._enqueue(
                    OutboxItem(
                        due=self._clock(),
                        seq=next(self._seq),
                        key=row.image_path or f"#{row.id}",
                        id=row.id,
                        camera=row.camera,
                        event_key=row.event_key,
                        score=row.score,
                        image_path=self._data_dir / row.image_path if row.image_path else None,
                        attempts=row.attempts,
                        frame_paths=self._frame_paths(row.frames),
                    )
                )
            self._lock.notify_all()
        return added + len(rows)

    def _load_journal(self) -> int:
        entries = self._journal.load()
        if not entries:
            return 0
        queued = 0
        with self._lock:
            for entry in entries:
                self._journaled[entry.key] = entry
                # A frame the database has (a row id, no new row) comes back with its pending row in `recover`.
                if _needs_caption(entry) and entry.new is not None and entry.new.image_path:
                    attempts = entry.outcome.attempts if entry.outcome else 0
                    self._enqueue(self._item(entry.key, entry.row_id, entry.new, attempts))
                    queued += 1
            self._publish()
        log.info("outbox: %d journal entries from an earlier run (%d frames to caption)", len(entries), queued)
        self._start_flusher()
        return queued

    @property
    def depth(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._in_flight)

    def put(self, new: NewCaption, jpeg: bytes, others: Sequence[bytes | None] = ()) -> tuple[PutResult, int | None]:
        """Save and record a selected frame; returns what happened and the row id (None when it has none yet).

        An event description (`new.frames`) brings its frames' JPEGs in `others`, one per frame, None for the one
        `jpeg` is; each file is written before the row exists, and all go when the row does not come to be."""
        if len(others) != len(new.frames or ()):
            raise ValueError(f"{len(new.frames or ())} frames listed, {len(others)} given")
        with self._lock:
            full = len(self._queued) + len(self._in_flight) >= self._config.capacity
            # A description stands for nothing else: it neither replaces nor is replaced by a frame of its event.
            rival_key = self._by_event.get(new.event_key) if full and not new.frames else None
            rival = self._queued.get(rival_key) if rival_key is not None else None
        if full and (rival is None or rival.score >= new.score):
            reason, detail = (
                (SkipReason.COALESCED, f"a better frame of this event is waiting (#{rival.id or rival.key})")
                if rival is not None
                else (SkipReason.QUEUE_FULL, f"{self._config.capacity} frames already waiting")
            )
            # No file is written: a skipped description lists no frames (none has a path to be read from).
            skipped = replace(new, frames=None)
            result, row_id = self._record_new(
                skipped, Outcome(CaptionStatus.SKIPPED, error=_skip_error(reason, detail))
            )
            if result in (PutResult.DUPLICATE, PutResult.UNSTORABLE, PutResult.FENCED):
                return result, None
            self._skipped(new.camera, reason)
            return (PutResult.COALESCED if rival is not None else PutResult.QUEUE_FULL), row_id

        written: list[Path] = []
        try:
            relative = self._write_image(new, jpeg)
            written.append(relative)
            if new.frames:
                frames = []
                for number, (frame, other) in enumerate(zip(new.frames, others, strict=True)):
                    path = relative if other is None else self._write_image(new, other, relative, number)
                    written.append(path)
                    frames.append({**frame, "path": str(path)})
                new = replace(new, frames=frames)
        except OSError as exc:
            self._unlink(written)
            return self._unwritable(replace(new, frames=None), exc)
        new = replace(new, image_path=str(relative))
        result, row_id = self._record_new(new, None)
        if result is PutResult.DUPLICATE:
            self._unlink(written)
            return result, None
        if result in (PutResult.JOURNAL_FULL, PutResult.UNSTORABLE, PutResult.FENCED):
            self._unlink(written)
            if result is PutResult.JOURNAL_FULL:
                self._skipped(new.camera, SkipReason.JOURNAL_FULL)
                message = f"camera {new.camera}: the database is away and the journal is full"
                self._warn_disk(new.camera, SkipReason.JOURNAL_FULL, message)
            return result, None
        item = self._item(str(relative), row_id, new, 0)
        replaced = None
        with self._lock:
            if rival is not None and self._queued.get(rival.key) is rival:
                replaced = self._dequeue(rival.key)
            self._enqueue(item)
            self._lock.notify_all()
        if replaced is not None:
            error = _skip_error(
                SkipReason.COALESCED, f"replaced by a better frame of this event (#{row_id or item.key})"
            )
            self._settle(replaced, Outcome(CaptionStatus.SKIPPED, replaced.attempts, error=error, image_removed=True))
            self._skipped(replaced.camera, SkipReason.COALESCED)
            for path in replaced.files:
                path.unlink(missing_ok=True)
            return PutResult.REPLACED, row_id
        return result, row_id

    def _frame_paths(self, frames: list[dict[str, Any]] | None) -> tuple[Path, ...]:
        return tuple(self._data_dir / str(frame["path"]) for frame in frames or ())

    def _item(self, key: str, row_id: int | None, new: NewCaption, attempts: int) -> OutboxItem:
        return OutboxItem(
            due=self._clock(),
            seq=next(self._seq),
            key=key,
            id=row_id,
            camera=new.camera,
            event_key=new.event_key,
            score=new.score,
            image_path=self._data_dir / new.image_path if new.image_path else None,
            attempts=attempts,
            frame_paths=self._frame_paths(new.frames),
        )

    def _record_new(self, new: NewCaption, outcome: Outcome | None) -> tuple[PutResult, int | None]:
        """Insert the frame's row now, or journal it while the database is away."""
        with self._lock:
            down = self._down_since is not None
        if not down:
            status = outcome.status if outcome is not None else CaptionStatus.PENDING
            try:
                row_id = self._store.add(new, status=status, error=outcome.error if outcome else None)
            except FencedOut:
                self._count(PutResult.FENCED)
                return PutResult.FENCED, None
            except Exception as exc:
                if not is_unavailable(exc):
                    # Refused for good (a value this database cannot hold): it costs this frame, not the pipeline.
                    log.error("camera %s: frame %d cannot be stored: %s", new.camera, new.frame_index, describe(exc))
                    self._count(CaptionStatus.FAILED)
                    return PutResult.UNSTORABLE, None
                self._store_failed(exc)
            else:
                if row_id is None:
                    self._count(PutResult.DUPLICATE)
                    return PutResult.DUPLICATE, None
                self._store_ok()
                return PutResult.QUEUED, row_id
        with self._lock:
            if len(self._journaled) >= self._config.journal_capacity:
                self.counts[PutResult.JOURNAL_FULL] += 1
                return PutResult.JOURNAL_FULL, None
            key = new.image_path or f"skipped:{uuid.uuid4().hex}"
            entry = JournalEntry(key=key, seq=time.time_ns(), new=new, outcome=outcome)
            self._journaled[key] = entry
            self._journal.save(entry)
            self._publish()
        self._start_flusher()
        return PutResult.JOURNALED, None

    def _unwritable(self, new: NewCaption, exc: OSError) -> tuple[PutResult, int | None]:
        """The frame's image could not be written: it costs this frame only, recorded as skipped with the reason."""
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        reason = SkipReason.DISK_FULL if full else SkipReason.IMAGE_WRITE_FAILED
        result, row_id = self._record_new(new, Outcome(CaptionStatus.SKIPPED, error=_skip_error(reason, str(exc))))
        if result not in (PutResult.DUPLICATE, PutResult.UNSTORABLE, PutResult.FENCED):
            self._skipped(new.camera, reason)
        if full:
            with self._lock:
                if self._disk_full_since is None:
                    self._disk_full_since = time.time()
                self.counts[PutResult.DISK_FULL] += 1
            self._metrics.disk_full.set(1)
            if self._on_disk_full is not None:
                self._on_disk_full()  # retention frees space early when it is configured to keep some free
        self._warn_disk(new.camera, reason, f"camera {new.camera}: frame {new.frame_index} not saved ({reason}: {exc})")
        return (PutResult.DISK_FULL if result is not PutResult.DUPLICATE else result), row_id

    def _warn_disk(self, camera: str, reason: SkipReason, message: str) -> None:
        # Keyed by reason too: a full journal must not hide a full disk (or the other way round) for a minute.
        now = self._clock()
        with self._lock:
            last = self._disk_warned.get((camera, reason))
            if last is not None and now - last < DISK_WARN_EVERY_S:
                return
            self._disk_warned[(camera, reason)] = now
        log.warning("%s; further frames of this camera skipped for this reason are counted, not logged, for %.0f s",
                    message, DISK_WARN_EVERY_S)  # fmt: skip

    def _skipped(self, camera: str, reason: SkipReason) -> None:
        self._count(CaptionStatus.SKIPPED)
        self._metrics.frames_skipped.labels(camera, reason).inc()

    def _count(self, outcome: Counted) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def _unlink(self, written: Sequence[Path | str]) -> None:
        for relative in written:
            (self._data_dir / relative).unlink(missing_ok=True)

    def _write_image(self, new: NewCaption, jpeg: bytes, main: Path | None = None, number: int = 0) -> Path:
        """Write a JPEG; `main`: the description's main image, which its other frames are named after
        (`<main>.f<number>.jpg`: retention finds them by its name)."""
        if main is not None:
            relative = main.with_name(f"{main.stem}.f{number}.jpg")
        else:
            stamp = new.captured_at.strftime("%Y%m%d/%H%M%S_%f")
            # Unique even for a duplicate of a stored instant, whose file is removed again without touching the
            # original.
            relative = Path("frames") / new.camera / f"{stamp}_{new.frame_index}_{uuid.uuid4().hex[:8]}.jpg"
        target = self._data_dir / relative
        partial = target.with_suffix(".part")
        # Written, flushed to disk and renamed before the row exists: a pending row always has its image.
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with partial.open("wb") as handle:
                handle.write(jpeg)
                handle.flush()
                os.fsync(handle.fileno())
            partial.replace(target)
        except OSError:
            partial.unlink(missing_ok=True)  # half a picture on a full disk only takes the space others need
            raise
        if self._disk_full_since is not None:
            with self._lock:
                self._disk_full_since = None
            self._metrics.disk_full.set(0)
            log.info("disk: frames are saved again")
        return relative

    def _enqueue(self, item: OutboxItem) -> None:
        self._queued[item.key] = item
        if not item.frame_paths:
            self._by_event[item.event_key] = item.key
        heapq.heappush(self._heap, item)
        self._metrics.outbox_depth.set(len(self._queued) + len(self._in_flight))

    def _dequeue(self, key: str) -> OutboxItem:
        # The heap entry stays and is skipped when it surfaces: removal from the middle of a heap is O(n).
        item = self._queued.pop(key)
        if self._by_event.get(item.event_key) == key:
            del self._by_event[item.event_key]
        return item

    # -- consumer side ---------------------------------------------------------------------------

    def take(self, timeout: float | None = None) -> OutboxItem | None:
        """The next due frame, or None when closed or after `timeout` seconds with nothing due."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            while True:
                while self._heap and self._queued.get(self._heap[0].key) is not self._heap[0]:
                    heapq.heappop(self._heap)
                now = self._clock()
                if self._heap and self._heap[0].due <= now:
                    item = heapq.heappop(self._heap)
                    self._dequeue(item.key)
                    self._in_flight[item.key] = item
                    return item
                if self._closed:
                    return None
                wait = self._heap[0].due - now if self._heap else None
                if deadline is not None:
                    remaining = deadline - now
                    if remaining <= 0:
                        return None
                    wait = remaining if wait is None else min(wait, remaining)
                self._lock.wait(wait)

    def complete(self, item: OutboxItem, caption: Caption) -> bool:
        """Record the caption; False when it was discarded instead (the camera's lease is another worker's now,
        whose outbox captions the frame)."""
        recorded = self._settle(item, Outcome(CaptionStatus.CAPTIONED, item.attempts + 1, caption=caption))
        if recorded:
            self._count(CaptionStatus.CAPTIONED)
        self._finish(item)
        return recorded

    def fail(self, item: OutboxItem, error: str) -> None:
        if self._settle(item, Outcome(CaptionStatus.FAILED, item.attempts + 1, error=error)):
            self._count(CaptionStatus.FAILED)
            self._metrics.caption_failures.labels(item.camera, FailureKind.PERMANENT).inc()
        self._finish(item)

    def skip(self, item: OutboxItem, reason: SkipReason, detail: str) -> None:
        """Never captioned, on purpose (e.g. too old by the time the VLM had room): recorded with the reason."""
        if self._settle(item, Outcome(CaptionStatus.SKIPPED, item.attempts, error=_skip_error(reason, detail))):
            self._skipped(item.camera, reason)
        self._finish(item)

    def retry(self, item: OutboxItem, error: str) -> float:
        """Back into the queue after a transient failure; returns the backoff in seconds."""
        attempts = item.attempts + 1
        delay: float = min(self._config.retry_max_s, self._config.retry_initial_s * 2 ** (attempts - 1))
        if not self._settle(item, Outcome(CaptionStatus.PENDING, attempts, error=error)):
            self._finish(item)  # the camera's new owner takes the frame
            return delay
        self._metrics.caption_failures.labels(item.camera, FailureKind.TRANSIENT).inc()
        with self._lock:
            self._in_flight.pop(item.key, None)
            again = replace(item, due=self._clock() + delay, seq=next(self._seq), attempts=attempts)
            self._enqueue(again)
            self._lock.notify_all()
        return delay

    def defer(self, item: OutboxItem, delay: float) -> None:
        """Back into the queue untried, due in `delay` seconds (its camera's captioning is paused): no attempt is
        counted and nothing is written; the row stays pending."""
        with self._lock:
            if self._in_flight.pop(item.key, None) is not None and (self._owns is None or self._owns(item.camera)):
                self._enqueue(replace(item, due=self._clock() + delay, seq=next(self._seq)))
            self._metrics.outbox_depth.set(len(self._queued) + len(self._in_flight))
            self._lock.notify_all()

    def forget(self, cameras: set[str]) -> int:
        """Drop the waiting frames of cameras this worker no longer holds: their rows stay pending in the
        database for the new owner. Frames in flight finish, and their writes are fenced out."""
        with self._lock:
            keys = [key for key, item in self._queued.items() if item.camera in cameras]
            for key in keys:
                self._dequeue(key)
            self._metrics.outbox_depth.set(len(self._queued) + len(self._in_flight))
            self._lock.notify_all()
        return len(keys)

    def _finish(self, item: OutboxItem) -> None:
        with self._lock:
            self._in_flight.pop(item.key, None)
            if self._finished_during_read is not None:
                self._finished_during_read.add(item.key)
            self._metrics.outbox_depth.set(len(self._queued) + len(self._in_flight))
            self._lock.notify_all()

    def wait_drained(self, timeout: float) -> bool:
        """True once nothing is waiting or in flight; False when the timeout passes first."""
        deadline = self._clock() + timeout
        with self._lock:
            while self._queued or self._in_flight:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def close(self, flush_timeout_s: float = 10.0) -> None:
        """Wake every worker (`take` returns None once nothing is due) and give the flusher up to `flush_timeout_s`
        to write the journal; what it could not write stays on disk for the next run."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            flusher = self._flusher
        if flusher is not None:
            flusher.join(flush_timeout_s)
        self._report_lost()

    def _report_lost(self) -> None:
        """Write what is in memory only once more (the reserve may have room again), then name, one line each,
        the frames and outcomes the run loses when it ends: neither the database, the disk nor the reserve took
        them."""
        with self._lock:
            lost = [entry for entry in self._journaled.values() if not entry.durable]
            lost = [entry for entry in sorted(lost, key=lambda entry: entry.seq) if not self._journal.save(entry)]
        if not lost:
            return
        log.error("journal: %d entries are in memory only and are lost when this process ends (the disk is full "
                  "and the journal's reserve used up):", len(lost))  # fmt: skip
        for entry in lost:
            log.error("journal: lost: %s", _describe_entry(entry))

    def release(self) -> None:
        """Let go of the journal's slot (a worker's): once `close()` returned and no caption worker will record
        an outcome any more. A flusher still writing keeps it until the process ends."""
        with self._lock:
            flusher = self._flusher
        if flusher is None or not flusher.is_alive():
            self._journal.close()

    # -- storage: the database, or the journal while it is away ------------------------------------

    @property
    def journaled(self) -> int:
        """Entries the database has not taken yet (on disk, or in memory only: `journal_lost`)."""
        with self._lock:
            return len(self._journaled)

    @property
    def journal_lost(self) -> int:
        """Entries the database has not taken that the disk and the journal's reserve refused too: in memory
        only, lost when the process ends."""
        with self._lock:
            return sum(not entry.durable for entry in self._journaled.values())

    def health(self) -> StorageHealth:
        with self._lock:
            return StorageHealth(
                database_ok=self._down_since is None,
                database_down_since=self._down_since,
                database_error=self._down_error,
                journal_entries=len(self._journaled),
                disk_ok=self._disk_full_since is None,
                disk_full_since=self._disk_full_since,
                disk_full_frames=self.counts[PutResult.DISK_FULL],
            )

    def wait_journal_empty(self, timeout: float) -> bool:
        """True once the database has taken every journal entry; False when the timeout passes first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._journaled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def _settle(self, item: OutboxItem, outcome: Outcome) -> bool:
        """Record what became of a frame: in its row now, or in the journal until the database is back. Never
        raises for the database's sake: the worker that calls it holds an answer that must not be asked for again.
        False when the write was fenced out (another worker owns the camera now): the outcome is discarded.
        """
        with self._lock:
            entry = self._journaled.get(item.key)
            if entry is not None or self._down_since is not None:
                self._journal_outcome(item, outcome, entry)
                return True
            row_id = item.id
        if row_id is None:
            return True  # its journaled row turned out to be a duplicate of a stored instant: nothing to record
        try:
            self._apply(row_id, outcome)
        except FencedOut:
            self._fenced(item.key, row_id, outcome)
            return False
        except Exception as exc:
            if is_unavailable(exc):
                self._store_failed(exc)
                with self._lock:
                    self._journal_outcome(item, outcome, self._journaled.get(item.key))
                return True
            self._unstorable(row_id, outcome, exc)
        else:
            self._store_ok()
        return True

    def _fenced(self, key: str, row_id: int | None, outcome: Outcome | None) -> None:
        self._count(PutResult.FENCED)
        status = outcome.status.value if outcome is not None else "new"
        log.warning("frame %s: %s outcome discarded, the camera's lease is held by another worker now",
                    f"#{row_id}" if row_id is not None else key, status)  # fmt: skip

    def _journal_outcome(self, item: OutboxItem, outcome: Outcome, entry: JournalEntry | None) -> None:
        """(Under the lock.) The newest outcome replaces any older one: the row needs only its last state."""
        if entry is None:
            entry = JournalEntry(key=item.key, seq=time.time_ns(), row_id=item.id)
            self._journaled[item.key] = entry
        entry.outcome = outcome
        entry.version += 1
        self._journal.save(entry)
        self._publish()
        self._lock.notify_all()
        if self._flusher is None:
            self._start_flusher_locked()

    def _apply(self, row_id: int, outcome: Outcome) -> None:
        match outcome.status:
            case CaptionStatus.CAPTIONED:
                assert outcome.caption is not None
                self._store.mark_captioned(row_id, outcome.caption, attempts=outcome.attempts)
            case CaptionStatus.FAILED:
                self._store.mark_failed(row_id, outcome.error or "", attempts=outcome.attempts)
            case CaptionStatus.SKIPPED:
                self._store.mark_skipped(row_id, outcome.error or "", image_removed=outcome.image_removed)
            case CaptionStatus.PENDING:
                self._store.mark_retrying(row_id, outcome.error or "", attempts=outcome.attempts)

    def _unstorable(self, row_id: int, outcome: Outcome, exc: BaseException) -> None:
        """The database refuses this write for good: the row is marked failed with the reason (never retried, so a
        restart does not ask the VLM again), or, if even that is refused, the error is logged."""
        reason = f"unstorable {outcome.status.value} result: {describe(exc)}"
        log.error("frame #%d: %s", row_id, reason)
        if outcome.status is CaptionStatus.FAILED:
            return
        try:
            self._store.mark_failed(row_id, reason, attempts=outcome.attempts)
        except Exception as again:
            log.error("frame #%d: cannot record the failure either (%s)", row_id, describe(again))

    def _store_failed(self, exc: BaseException) -> None:
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = time.time()
            self._down_error = describe(exc)
            self._lock.notify_all()
        self._metrics.store_available.set(0)
        self._metrics.store_errors.inc()
        self._start_flusher()  # it probes the database while nothing is journaled
        if first:
            log.warning("database unavailable (%s): frames and captions are kept in %s until it is back",
                        self._down_error, self._journal.root)  # fmt: skip

    def _store_ok(self) -> None:
        with self._lock:
            if self._down_since is None:
                return
            since, self._down_since, self._down_error = self._down_since, None, None
        self._metrics.store_available.set(1)
        log.info("database available again after %.0f s", time.time() - since)

    def _publish(self) -> None:
        self._metrics.journal_entries.set(len(self._journaled))

    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is None:
                self._start_flusher_locked()

    def _start_flusher_locked(self) -> None:
        self._flusher = threading.Thread(target=self._flush_loop, name="outbox-journal", daemon=True)
        self._flusher.start()

    def _flush_loop(self) -> None:
        """Writes the journal to the database, oldest first, retrying with backoff while it is away."""
        delay = STORE_RETRY_INITIAL_S
        while True:
            with self._lock:
                while not self._journaled and self._down_since is None and not self._closed:
                    self._lock.wait()
                if not self._journaled and (self._closed or self._down_since is None):
                    self._flusher = None
                    return
                batch = sorted(self._journaled.values(), key=lambda entry: entry.seq)
            # Nothing to write but the database was seen away: ask it, so that `recover` and `put` use it again.
            if all(self._replay(entry) for entry in batch) and (batch or self._probe()):
                delay = STORE_RETRY_INITIAL_S
                continue
            with self._lock:
                if self._closed:  # the run is over: what is left is on disk for the next one
                    self._flusher = None
                    return
                self._lock.wait(delay)
            delay = min(self._config.store_retry_max_s, delay * 2)

    def _replay(self, entry: JournalEntry) -> bool:
        """Write one entry; False while the database is away (the entry stays)."""
        with self._lock:
            if self._journaled.get(entry.key) is not entry:
                return True
            version, row_id, new, outcome = entry.version, entry.row_id, entry.new, entry.outcome
        try:
            if row_id is None:
                assert new is not None
                final = _inserted_final(new, outcome)
                # Unfenced: the frame was selected while this worker held the camera (a journal is written only
                # then), and nobody else knows of it; should the camera have moved meanwhile, its row is the new
                # owner's to caption (its outcome below is refused). Exactly once per frame still holds: the row
                # is unique by instant and image.
                row_id = self._insert(new, outcome if final else None, fenced=False)
                if row_id is None:
                    self._drop_duplicate(entry)
                    return True
                if final:
                    outcome = None
            if outcome is not None:
                self._apply(row_id, outcome)
        except FencedOut:
            # Not this worker's to write any more: the new owner captions the row.
            self._fenced(entry.key, row_id, outcome)
            with self._lock:
                del self._journaled[entry.key]
                self._journal.remove(entry.key)
                if entry.key in self._queued:
                    self._dequeue(entry.key)
                self._publish()
                self._lock.notify_all()
            return True
        except Exception as exc:
            if is_unavailable(exc):
                self._store_failed(exc)
                return False
            if row_id is not None and outcome is not None:
                self._unstorable(row_id, outcome, exc)
            else:
                log.error("journal: frame %s cannot be stored (%s); dropped", entry.key, describe(exc))
        self._store_ok()
        with self._lock:
            for held in (self._queued.get(entry.key), self._in_flight.get(entry.key)):
                if held is not None:
                    held.id = row_id
            if entry.version == version:
                del self._journaled[entry.key]
                self._journal.remove(entry.key)
                # A `recover` reading pending rows now may have read this row before its outcome was written:
                # settled until then by its entry, it must stay settled once the entry is gone.
                if not _needs_caption(entry) and self._finished_during_read is not None:
                    self._finished_during_read.add(entry.key)
            else:  # a worker recorded a newer outcome meanwhile: keep it, against the row that now exists
                entry.row_id, entry.new = row_id, None
                self._journal.save(entry)
            self._publish()
            self._lock.notify_all()
        return True

    def _probe(self) -> bool:
        try:
            self._store.ping()
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            self._store_failed(exc)
            return False
        self._store_ok()
        return True

    def _insert(self, new: NewCaption, final: Outcome | None, *, fenced: bool = True) -> int | None:
        """Insert the row (as pending, or in its `final` state); returns its id, the existing row's id when an
        earlier attempt committed but its answer was lost, or None for a duplicate of a stored instant."""
        status = final.status if final is not None else CaptionStatus.PENDING
        error = final.error if final is not None else None
        row_id = self._store.add(new, status=status, error=error, fenced=fenced)
        if row_id is not None:
            return row_id
        found = self._store.find_instant(new.camera, new.captured_at)
        # The image path is unique per selected frame; a frame without one (skipped) matches a row without one.
        if found is not None and found[1] == new.image_path:
            return found[0]
        return None

    def _drop_duplicate(self, entry: JournalEntry) -> None:
        self._count(PutResult.DUPLICATE)
        with self._lock:
            del self._journaled[entry.key]
            self._journal.remove(entry.key)
            if entry.key in self._queued:
                self._dequeue(entry.key)
            self._publish()
            self._lock.notify_all()
        if entry.new is not None and entry.new.image_path:
            self._unlink([entry.new.image_path, *(str(frame["path"]) for frame in entry.new.frames or ())])
