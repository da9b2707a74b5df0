"""The durable outbox on a real SQLite file and real image files. Time is a counter the test advances, so
backoff and due times are checked exactly, without sleeping."""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox, PutResult
from visioncap.store import CaptionStore, NewCaption, create_db_engine

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
JPEG = b"\xff\xd8 not a real picture, the outbox does not look inside \xff\xd9"
CAPTION = Caption("a person", "tiny", 300, 8, 0.1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> CaptionStore:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'captions.db'}"))
    store.create_schema()
    return store


def frame(index: int, event: str = "e", score: float = 0.5) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera="cam",
        source="x.mp4",
        frame_index=index,
        offset_s=index / 10,
        captured_at=T0 + timedelta(seconds=index),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"cam:{event}",
        score=score,
    )


def outbox(store: CaptionStore, tmp_path: Path, clock: Clock | None = None, **config: float) -> Outbox:
    return Outbox(store, tmp_path, OutboxConfig(**config), PipelineMetrics(), clock=clock or Clock())


def test_frame_is_on_disk_and_pending_before_any_caption(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path)
    result, row_id = box.put(frame(1), JPEG)
    assert result is PutResult.QUEUED and row_id is not None
    row = store.get(row_id)
    assert row is not None and row.status == "pending" and row.image_path
    assert (tmp_path / row.image_path).read_bytes() == JPEG
    item = box.take(timeout=0)
    assert item is not None and item.id == row_id and box.depth == 1  # in flight still counts
    box.complete(item, CAPTION)
    assert store.get(row_id).status == "captioned"  # type: ignore[union-attr]
    assert box.depth == 0 and box.counts["captioned"] == 1


def test_transient_failures_back_off_exponentially_up_to_the_cap(store: CaptionStore, tmp_path: Path) -> None:
    clock = Clock()
    box = outbox(store, tmp_path, clock, retry_initial_s=1.0, retry_max_s=4.0)
    _, row_id = box.put(frame(1), JPEG)
    delays = []
    for _ in range(4):
        item = box.take(timeout=0)
        assert item is not None
        delays.append(box.retry(item, "APIConnectionError: refused"))
        assert box.take(timeout=0) is None, "not due before its backoff has passed"
        clock.now += delays[-1]
    assert delays == [1.0, 2.0, 4.0, 4.0]
    row = store.get(row_id)  # type: ignore[arg-type]
    assert row is not None and (row.status, row.attempts, row.error) == ("pending", 4, "APIConnectionError: refused")
    item = box.take(timeout=0)
    assert item is not None and item.attempts == 4
    box.complete(item, CAPTION)
    assert store.get(row_id).attempts == 5  # type: ignore[arg-type, union-attr]


def test_permanent_failure_is_recorded(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path)
    _, row_id = box.put(frame(1), JPEG)
    item = box.take(timeout=0)
    assert item is not None
    box.fail(item, "VLM refused the request (HTTP 400)")
    row = store.get(row_id)  # type: ignore[arg-type]
    assert row is not None and (row.status, row.error) == ("failed", "VLM refused the request (HTTP 400)")


def test_a_new_process_captions_what_the_last_one_left_pending_first(store: CaptionStore, tmp_path: Path) -> None:
    first = outbox(store, tmp_path)
    ids = [first.put(frame(i, event=str(i)), JPEG)[1] for i in range(3)]
    item = first.take(timeout=0)
    assert item is not None
    first.retry(item, "timeout")  # the process then dies with everything pending
    second = outbox(store, tmp_path)
    assert second.recover() == 3
    second.put(frame(10, event="new"), JPEG)
    order = []
    while (item := second.take(timeout=0)) is not None:
        order.append(item.id)
        assert item.image_path is not None and item.image_path.read_bytes() == JPEG
        second.complete(item, CAPTION)
    assert order[:3] == ids and len(order) == 4
    assert store.count(status="captioned") == 4


def test_rows_put_back_to_pending_join_a_running_outbox_once(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path)
    _, done = box.put(frame(1, event="a"), JPEG)
    _, waiting = box.put(frame(2, event="b"), JPEG)
    item = box.take(timeout=0)
    assert item is not None and item.id == done
    box.complete(item, CAPTION)
    assert box.recover() == 0, "rows it already holds are not queued twice"
    assert done is not None and store.requeue(done)  # what the API's regenerate does
    assert box.recover() == 1
    taken = {box.take(timeout=0).id, box.take(timeout=0).id}  # type: ignore[union-attr]
    assert taken == {done, waiting}
    other = Outbox(store, tmp_path, OutboxConfig(), PipelineMetrics(), clock=Clock(), pipeline="another")
    assert other.recover() == 0, "each pipeline takes only its own rows"


def test_full_queue_coalesces_frames_of_the_same_event(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path, capacity=2)
    _, a = box.put(frame(1, event="a", score=0.5), JPEG)
    _, b = box.put(frame(2, event="b", score=0.5), JPEG)
    worse = box.put(frame(3, event="a", score=0.4), JPEG)
    assert worse[0] is PutResult.COALESCED
    better = box.put(frame(4, event="a", score=0.9), JPEG)
    assert better[0] is PutResult.REPLACED
    other = box.put(frame(5, event="c", score=0.9), JPEG)
    assert other[0] is PutResult.QUEUE_FULL
    assert box.depth == 2
    rows = {r.frame_index: r for r in store.list(limit=10)}
    assert rows[1].status == "skipped" and rows[1].error.startswith("coalesced: replaced by")  # type: ignore[union-attr]
    assert rows[1].image_path is None and len(list(tmp_path.rglob("*.jpg"))) == 2
    assert rows[3].status == "skipped" and rows[3].error.startswith("coalesced: a better frame")  # type: ignore[union-attr]
    assert rows[5].status == "skipped" and rows[5].error.startswith("queue-full")  # type: ignore[union-attr]
    assert {rows[2].status, rows[4].status} == {"pending"}
    taken = {box.take(timeout=0).id, box.take(timeout=0).id}  # type: ignore[union-attr]
    assert taken == {b, better[1]} and a not in taken
    assert box.counts["skipped"] == 3


def test_memory_and_disk_stay_bounded_while_the_vlm_is_away(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path, capacity=5)
    for i in range(200):
        box.put(frame(i, event=str(i % 7), score=(i % 13) / 13), JPEG)
    assert box.depth == 5
    assert len(list((tmp_path / "frames").rglob("*.jpg"))) == 5
    assert store.count(status="pending") == 5 and store.count(status="skipped") == 195


def test_duplicate_instant_is_not_queued_twice(store: CaptionStore, tmp_path: Path) -> None:
    box = outbox(store, tmp_path)
    assert box.put(frame(1), JPEG)[0] is PutResult.QUEUED
    assert box.put(frame(1), JPEG) == (PutResult.DUPLICATE, None)
    assert box.depth == 1 and len(list(tmp_path.rglob("*.jpg"))) == 1


def test_take_wakes_up_when_a_frame_arrives(store: CaptionStore, tmp_path: Path) -> None:
    import time

    box = Outbox(store, tmp_path, OutboxConfig(), PipelineMetrics(), clock=time.monotonic)
    got: list[int] = []
    worker = threading.Thread(target=lambda: got.append(box.take(timeout=30).id))  # type: ignore[union-attr]
    worker.start()
    _, row_id = box.put(frame(1), JPEG)
    worker.join(timeout=30)
    assert got == [row_id]
    box.close()
    assert box.take() is None


def description(index: int) -> NewCaption:
    """An event description's row: three frames, the middle one its main image."""
    roles = ["first", "best", "last"]
    frames = [{"role": role, "frame_index": index - 2 + n, "offset_s": n / 10} for n, role in enumerate(roles)]
    return replace(frame(index), reason="event-end", frames=frames)


def test_an_event_description_writes_every_frame_before_its_row_and_a_duplicate_removes_them(
    store: CaptionStore, tmp_path: Path
) -> None:
    box = outbox(store, tmp_path, capacity=2)
    jpegs = [JPEG + b"first", None, JPEG + b"last"]
    result, row_id = box.put(description(5), JPEG, jpegs)
    assert result is PutResult.QUEUED and row_id is not None
    row = store.get(row_id)
    assert row is not None and row.frames is not None
    paths = [frame["path"] for frame in row.frames]
    # Oldest first, the main image one of them, the others named after it; each on disk with its own bytes.
    assert paths[1] == row.image_path and len(set(paths)) == 3
    assert [(tmp_path / path).read_bytes() for path in paths] == [JPEG + b"first", JPEG, JPEG + b"last"]
    assert all(path.endswith(f".f{n}.jpg") for n, path in enumerate(paths) if n != 1)
    # A full queue does not coalesce a frame with the description of its event: it is skipped, the description stays.
    assert box.put(frame(6, event="other"), JPEG)[0] is PutResult.QUEUED
    assert box.put(frame(7, score=0.9), JPEG)[0] is PutResult.QUEUE_FULL
    item = box.take(timeout=0)
    assert item is not None and item.id == row_id
    assert item.frame_paths == tuple(tmp_path / path for path in paths) and item.files == item.frame_paths
    # The same event described again (a re-run of the file): no row, and none of its files stay behind.
    before = {path for path in tmp_path.rglob("*.jpg")}
    assert box.put(description(5), JPEG, jpegs) == (PutResult.DUPLICATE, None)
    assert {path for path in tmp_path.rglob("*.jpg")} == before
    with pytest.raises(ValueError, match="3 frames listed, 1 given"):
        box.put(description(8), JPEG, [None])
    # The queue still full (one in flight, one waiting): a description recorded as skipped lists no frames, as it
    # wrote none.
    result, skipped = box.put(description(12), JPEG, jpegs)
    assert result is PutResult.QUEUE_FULL and skipped is not None
    row = store.get(skipped)
    assert row is not None and row.status == "skipped" and row.frames is None and row.image_path is None
