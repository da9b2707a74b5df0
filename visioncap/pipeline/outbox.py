"""The durable outbox between selection and the VLM.

A selected frame is written to disk and recorded as `pending` before any VLM call. Workers take due frames,
and each ends `captioned`, `failed` (refused for good) or back in the queue after a transient failure, with
exponential backoff. Rows still pending when a process stops are captioned first by the next one. The queue
is bounded: when full, frames of the same event are coalesced (the best kept) and others are recorded as
`skipped` with the reason, so memory and disk stay bounded however long the VLM is away.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from visioncap import metrics
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.store import CaptionStatus, CaptionStore, NewCaption

log = logging.getLogger(__name__)


class PutResult(StrEnum):
    QUEUED = "queued"
    REPLACED = "replaced"  # queue full: this frame took the place of a worse one of its event
    COALESCED = "coalesced"  # queue full: a better frame of the event is already waiting; recorded as skipped
    QUEUE_FULL = "queue-full"  # queue full and nothing of its event to coalesce with; recorded as skipped
    DUPLICATE = "duplicate"  # this camera already has a row for this instant (a re-run of a file)


@dataclass(order=True)
class OutboxItem:
    """A pending frame handed to a worker."""

    due: float
    seq: int
    id: int = field(compare=False)
    camera: str = field(compare=False)
    event_key: str = field(compare=False)
    score: float = field(compare=False)
    image_path: Path | None = field(compare=False)
    attempts: int = field(compare=False, default=0)


class Outbox:
    """Thread-safe; `put` from the selection thread, `take`/`complete`/`retry`/`fail` from caption workers."""

    def __init__(
        self,
        store: CaptionStore,
        data_dir: Path,
        config: OutboxConfig,
        clock: Callable[[], float] = time.monotonic,
        pipeline: str | None = None,
    ) -> None:
        self._store = store
        self._pipeline = pipeline
        self._data_dir = data_dir
        self._config = config
        self._clock = clock
        self._lock = threading.Condition()
        self._heap: list[OutboxItem] = []
        self._queued: dict[int, OutboxItem] = {}  # waiting, not in flight
        self._by_event: dict[str, int] = {}  # event key -> id of its waiting frame
        self._in_flight: dict[int, OutboxItem] = {}
        self._seq = itertools.count()
        self._closed = False
        self.counts: Counter[str] = Counter()  # outcomes of this process: captioned, failed, skipped, duplicate

    # -- producer side ---------------------------------------------------------------------------

    def recover(self) -> int:
        """Queue pending rows this process does not hold yet: those a previous run left (ahead of anything new)
        and those put back later, e.g. by the API's regenerate. Returns how many were added."""
        rows = self._store.pending(self._pipeline)
        with self._lock:
            rows = [r for r in rows if r.id not in self._queued and r.id not in self._in_flight]
            for row in rows:
                item = OutboxItem(
                    due=self._clock(),
                    seq=next(self._seq),
                    id=row.id,
                    camera=row.camera,
                    event_key=row.event_key,
                    score=row.score,
                    image_path=self._data_dir / row.image_path if row.image_path else None,
                    attempts=row.attempts,
                )
                self._enqueue(item)
            self._lock.notify_all()
        return len(rows)

    @property
    def depth(self) -> int:
        with self._lock:
            return len(self._queued) + len(self._in_flight)

    def put(self, new: NewCaption, jpeg: bytes) -> tuple[PutResult, int | None]:
        """Save and record a selected frame; returns what happened and the row id (None for a duplicate)."""
        with self._lock:
            full = len(self._queued) + len(self._in_flight) >= self._config.capacity
            rival_id = self._by_event.get(new.event_key) if full else None
            rival = self._queued.get(rival_id) if rival_id is not None else None
        if full and (rival is None or rival.score >= new.score):
            reason = (
                f"coalesced: a better frame of this event is waiting (#{rival.id})"
                if rival is not None
                else f"queue-full: {self._config.capacity} frames already waiting"
            )
            row_id = self._store.add(new, status=CaptionStatus.SKIPPED, error=reason)
            if row_id is None:
                self._count("duplicate")
                return PutResult.DUPLICATE, None
            self._count("skipped")
            metrics.FRAMES_SKIPPED.labels(new.camera, reason.split(":")[0]).inc()
            return (PutResult.COALESCED if rival is not None else PutResult.QUEUE_FULL), row_id

        relative = self._write_image(new, jpeg)
        row_id = self._store.add(replace(new, image_path=str(relative)))
        if row_id is None:
            (self._data_dir / relative).unlink(missing_ok=True)
            self._count("duplicate")
            return PutResult.DUPLICATE, None
        item = OutboxItem(
            due=self._clock(),
            seq=next(self._seq),
            id=row_id,
            camera=new.camera,
            event_key=new.event_key,
            score=new.score,
            image_path=self._data_dir / relative,
        )
        replaced = None
        with self._lock:
            if rival is not None and self._queued.get(rival.id) is rival:
                replaced = self._dequeue(rival.id)
            self._enqueue(item)
            self._lock.notify()
        if replaced is not None:
            self._store.mark_skipped(
                replaced.id, f"coalesced: replaced by a better frame of this event (#{row_id})", image_removed=True
            )
            self._count("skipped")
            metrics.FRAMES_SKIPPED.labels(replaced.camera, "coalesced").inc()
            if replaced.image_path is not None:
                replaced.image_path.unlink(missing_ok=True)
            return PutResult.REPLACED, row_id
        return PutResult.QUEUED, row_id

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def _write_image(self, new: NewCaption, jpeg: bytes) -> Path:
        stamp = new.captured_at.strftime("%Y%m%d/%H%M%S_%f")
        # Unique even for a duplicate of a stored instant, whose file is removed again without touching the original.
        relative = Path("frames") / new.camera / f"{stamp}_{new.frame_index}_{uuid.uuid4().hex[:8]}.jpg"
        target = self._data_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".part")
        # Written, flushed to disk and renamed before the row exists: a pending row always has its image.
        with partial.open("wb") as handle:
            handle.write(jpeg)
            handle.flush()
            os.fsync(handle.fileno())
        partial.replace(target)
        return relative

    def _enqueue(self, item: OutboxItem) -> None:
        self._queued[item.id] = item
        self._by_event[item.event_key] = item.id
        heapq.heappush(self._heap, item)
        metrics.OUTBOX_DEPTH.set(len(self._queued) + len(self._in_flight))

    def _dequeue(self, item_id: int) -> OutboxItem:
        # The heap entry stays and is skipped when it surfaces: removal from the middle of a heap is O(n).
        item = self._queued.pop(item_id)
        if self._by_event.get(item.event_key) == item_id:
            del self._by_event[item.event_key]
        return item

    # -- consumer side ---------------------------------------------------------------------------

    def take(self, timeout: float | None = None) -> OutboxItem | None:
        """The next due frame, or None when closed or after `timeout` seconds with nothing due."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._lock:
            while True:
                while self._heap and self._queued.get(self._heap[0].id) is not self._heap[0]:
                    heapq.heappop(self._heap)
                now = self._clock()
                if self._heap and self._heap[0].due <= now:
                    item = heapq.heappop(self._heap)
                    self._dequeue(item.id)
                    self._in_flight[item.id] = item
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

    def complete(self, item: OutboxItem, caption: Caption) -> None:
        self._store.mark_captioned(item.id, caption, attempts=item.attempts + 1)
        self._count("captioned")
        self._finish(item)

    def fail(self, item: OutboxItem, error: str) -> None:
        self._store.mark_failed(item.id, error, attempts=item.attempts + 1)
        self._count("failed")
        metrics.CAPTION_FAILURES.labels(item.camera, "permanent").inc()
        self._finish(item)

    def skip(self, item: OutboxItem, reason: str) -> None:
        """Never captioned, on purpose (e.g. too old by the time the VLM had room): recorded with the reason."""
        self._store.mark_skipped(item.id, reason)
        self._count("skipped")
        metrics.FRAMES_SKIPPED.labels(item.camera, reason.split(":")[0]).inc()
        self._finish(item)

    def retry(self, item: OutboxItem, error: str) -> float:
        """Back into the queue after a transient failure; returns the backoff in seconds."""
        attempts = item.attempts + 1
        self._store.mark_retrying(item.id, error, attempts=attempts)
        metrics.CAPTION_FAILURES.labels(item.camera, "transient").inc()
        delay = min(self._config.retry_max_s, self._config.retry_initial_s * 2 ** (attempts - 1))
        with self._lock:
            self._in_flight.pop(item.id, None)
            again = replace(item, due=self._clock() + delay, seq=next(self._seq), attempts=attempts)
            self._enqueue(again)
            self._lock.notify_all()
        return delay

    def _finish(self, item: OutboxItem) -> None:
        with self._lock:
            self._in_flight.pop(item.id, None)
            metrics.OUTBOX_DEPTH.set(len(self._queued) + len(self._in_flight))
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

    def close(self) -> None:
        """Wake every worker; `take` returns None once nothing is due."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
