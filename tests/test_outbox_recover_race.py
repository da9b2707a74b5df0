"""`Outbox.recover` reads pending rows without its lock while the journal flusher writes outcomes. A row the
flusher settles inside that window was pending when read, and must not be queued (and captioned) again.

The window is opened deterministically: a real SQLite store whose `pending()` returns only once the flusher
has written the journaled outcome and dropped its entry, and whose `mark_captioned` waits until the rows are
read. No sleeps: each side waits on an event the other sets."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.journal import Journal, JournalEntry, Outcome
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.captions import PendingRow

JPEG = b"\xff\xd8 not a real picture, the outbox does not look inside \xff\xd9"
CAPTION = Caption("a person at the door", "tiny", 300, 8, 0.1)
WAIT_S = 30.0  # a bound on a wait for the other thread, never reached when the code works


def frame() -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera="cam",
        source="x.mp4",
        frame_index=1,
        offset_s=0.1,
        captured_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key="cam:e",
        score=0.5,
    )


class WindowStore(CaptionStore):
    """A real store that holds the flusher's write until `pending()` has read its rows, then holds `pending()`'s
    answer until the outbox's journal is empty: the interleaving the race needs, every time."""

    outbox: Outbox | None = None

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.rows_read = threading.Event()
        self.reads = 0

    def pending(self, pipeline: str | None = None) -> list[PendingRow]:
        rows = super().pending(pipeline)
        self.reads += 1
        if self.reads == 1:
            self.rows_read.set()
            assert self.outbox is not None
            assert self.outbox.wait_journal_empty(WAIT_S), "the flusher never wrote the journaled caption"
        return rows

    def mark_captioned(self, *args: object, **kwargs: object) -> None:
        assert self.rows_read.wait(WAIT_S), "recover never read the pending rows"
        super().mark_captioned(*args, **kwargs)  # type: ignore[arg-type]


def test_a_row_settled_by_the_flusher_while_recover_reads_is_not_captioned_again(tmp_path: Path) -> None:
    store = WindowStore(create_db_engine(f"sqlite:///{tmp_path / 'captions.db'}"))
    store.create_schema()
    # An earlier run stored the frame (pending), captioned it while the database was away, and stopped with the
    # caption in its journal.
    first = Outbox(store, tmp_path, OutboxConfig(), PipelineMetrics())
    _, row_id = first.put(frame(), JPEG)
    assert row_id is not None
    row = store.get(row_id)
    assert row is not None and row.image_path
    outcome = Outcome(CaptionStatus.CAPTIONED, 1, caption=CAPTION)
    assert Journal(tmp_path, None).save(
        JournalEntry(key=row.image_path, seq=time.time_ns(), row_id=row_id, outcome=outcome)
    )

    second = Outbox(store, tmp_path, OutboxConfig(), PipelineMetrics())
    store.outbox = second
    queued = second.recover()

    assert store.reads == 1 and not second.journaled
    assert store.get(row_id).status == "captioned"  # type: ignore[union-attr]
    assert queued == 0 and second.depth == 0, "a frame already captioned was queued to be captioned again"
    assert second.take(timeout=0) is None
    # The next recover (every few seconds while a backlog replays) reads the row as captioned: still nothing.
    assert second.recover() == 0
    second.close()
