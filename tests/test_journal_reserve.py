"""A full disk shared by the frames, SQLite and the journal, on a real tmpfs: the records of the frames the full
disk cost go to the journal's reserve (space it allocated at start) and reach the database in the next run, once
there is room; what even the reserve cannot take is named at exit, one line per frame."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from tmpfs_support import mounted_tmpfs

from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.journal import RESERVE_NAME, Journal, JournalEntry
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox, PutResult
from visioncap.pipeline.runner import RunSummary
from visioncap.store import CaptionStore, NewCaption, create_db_engine

T0 = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
JPEG = b"\xff\xd8" + bytes(20_000) + b"\xff\xd9"
CAPTION = Caption("a person at the door", "tiny", 300, 8, 0.1)
DISK = 2 * 1024 * 1024  # bytes: the drill's 2m
FRAMES_COST = 11  # frames selected once the disk is full, as in the drill
TIMEOUT = 30  # seconds; a bound on a broken test, never a measurement


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs as the data dir, SQLite's file on it too."""
    with mounted_tmpfs(tmp_path / "small-disk", DISK) as mount_point:
        yield mount_point


def frame(index: int) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera="door",
        source="rtsp://door/stream",
        frame_index=index,
        offset_s=float(index),
        captured_at=T0 + timedelta(seconds=index),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"door:{index}",
    )


def store_on(disk: Path) -> CaptionStore:
    store = CaptionStore(create_db_engine(f"sqlite:///{disk / 'visioncap.db'}"))
    store.create_schema()
    return store


def fill(disk: Path) -> Path:
    """Take every free byte of the file system, as a camera's recordings or a log would."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (64 * 1024, 4096, 1):
            try:
                while True:
                    os.write(fd, bytes(size))
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def first_run_fills_the_disk(disk: Path, reserve_bytes: int | None = None) -> tuple[Outbox, CaptionStore, Path]:
    """One caption stored, then the disk fills and FRAMES_COST more frames are selected."""
    store = store_on(disk)
    extra = {} if reserve_bytes is None else {"journal_reserve_bytes": reserve_bytes}
    box = Outbox(store, disk, OutboxConfig(), PipelineMetrics(), pipeline="p", **extra)
    assert box.put(frame(0), JPEG)[0] is PutResult.QUEUED
    item = box.take(timeout=0)
    assert item is not None and box.complete(item, CAPTION)
    filler = fill(disk)
    for index in range(1, FRAMES_COST + 1):
        result, _ = box.put(frame(index), JPEG)
        assert result is PutResult.DISK_FULL
    return box, store, filler


def end(box: Outbox, store: CaptionStore) -> None:
    """The process ends: its journal and database connections close, what it held in memory only is gone."""
    # With it ends the journal thread's last pass (the one `close()` woke it for): left running, that pass could
    # write to the database after the test has made room, which the ended process never would.
    flusher = box._flusher
    if flusher is not None:
        flusher.join(TIMEOUT)
        assert not flusher.is_alive(), "the journal thread did not end after close()"
    box.release()
    store.engine.dispose()


def next_run(disk: Path) -> CaptionStore:
    """A new process on the same data dir, with room again: it writes what the last one journaled."""
    store = store_on(disk)
    box = Outbox(store, disk, OutboxConfig(), PipelineMetrics(), pipeline="p")
    box.recover()
    assert box.wait_journal_empty(TIMEOUT), "the journal was not written to the database"
    box.close()
    box.release()
    store.engine.dispose()
    return store


def test_the_records_of_frames_a_full_disk_cost_survive_the_run_in_the_reserve(small_disk: Path) -> None:
    box, store, filler = first_run_fills_the_disk(small_disk)
    # SQLite could not write them either: they wait in the journal, on disk, though the disk is full.
    assert box.journaled == FRAMES_COST
    box.close(flush_timeout_s=0)
    end(box, store)

    filler.unlink()
    store = next_run(small_disk)
    rows = store.list(limit=100)
    assert len(rows) == 1 + FRAMES_COST, "the records of the frames the full disk cost were lost"
    skipped = [row for row in rows if row.status == "skipped"]
    assert len(skipped) == FRAMES_COST and all(row.error.startswith("disk_full:") for row in skipped)  # type: ignore[union-attr]
    assert {row.captured_at.replace(tzinfo=UTC) for row in skipped} == {frame(i).captured_at for i in range(1, 12)}
    assert not list((small_disk / "journal").rglob("*.json"))


def test_what_even_the_reserve_cannot_take_is_named_at_exit(small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    box, store, filler = first_run_fills_the_disk(small_disk, reserve_bytes=4096)  # room for a few entries only
    lost = box.journal_lost
    assert 0 < lost < FRAMES_COST and box.journaled == FRAMES_COST
    with caplog.at_level(logging.ERROR, logger="visioncap.pipeline.outbox"):
        box.close(flush_timeout_s=0)
    named = [record.getMessage() for record in caplog.records if record.getMessage().startswith("journal: lost: ")]
    assert len(named) == lost
    summary = RunSummary("p", {}, journaled=box.journaled - lost, journal_lost=lost)
    assert f"({FRAMES_COST - lost} journaled until the database is back) ({lost} lost:" in summary.line()
    assert not summary.ok
    assert (
        RunSummary("p", {}, journaled=FRAMES_COST)
        .line()
        .endswith(f"({FRAMES_COST} journaled until the database is back)")
    ), "nothing lost: the line says so as before"
    end(box, store)

    filler.unlink()
    store = next_run(small_disk)
    stored = {row.captured_at.replace(tzinfo=UTC) for row in store.list(limit=100)}
    assert len(stored) == 1 + FRAMES_COST - lost
    # Exactly the frames named at exit are the ones missing.
    missing = [frame(i) for i in range(1, FRAMES_COST + 1) if frame(i).captured_at not in stored]
    assert [f"journal: lost: frame of camera door at {new.captured_at.isoformat()}" for new in missing] == [
        line.split(" (frame ")[0] for line in named
    ]


def test_a_record_cut_short_by_a_crash_is_ignored_and_a_settled_reserve_is_used_again(small_disk: Path) -> None:
    journal = Journal(small_disk, "p")
    filler = fill(small_disk)
    entries = [JournalEntry(key=f"frames/door/{i}.jpg", seq=i, new=frame(i)) for i in range(3)]
    assert all(journal.save(entry) for entry in entries)  # in the reserve: the disk took no file
    assert not list((small_disk / "journal").rglob("*.json"))
    used = journal.reserve_size - journal.reserve_free
    journal.close()
    # A crash in the middle of the next record: half of it is in the file.
    reserve = small_disk / "journal" / "p" / RESERVE_NAME
    with reserve.open("r+b") as handle:
        handle.seek(used)
        handle.write(b'{"save":{"key":"frames/door/9.jpg","seq":9,"new":{"pipel')
    again = Journal(small_disk, "p")
    assert [entry.key for entry in again.load()] == [entry.key for entry in entries]
    assert again.reserve_size - again.reserve_free == used, "the cut record's space is used again"
    for entry in entries:
        again.remove(entry.key)
    assert again.reserve_free == again.reserve_size and not reserve.read_bytes().strip(b"\0")
    filler.unlink()
    again.close()
    assert Journal(small_disk, "p").load() == []
