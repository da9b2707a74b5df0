"""Caption rows round-trip through a real SQLite file, also while other threads write."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from visioncap.frames import Caption, SelectionReason
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine


@pytest.fixture
def store(tmp_path: Path) -> CaptionStore:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'db' / 'captions.db'}"))
    store.create_schema()
    return store


def new_caption(index: int, **changes: object) -> NewCaption:
    values: dict[str, object] = {
        "pipeline": "p",
        "camera": "cam-1",
        "source": "/videos/a.mp4",
        "frame_index": index,
        "offset_s": index / 10,
        "captured_at": datetime(2026, 11, 29, 12, 0, tzinfo=UTC) + timedelta(seconds=index),
        "reason": SelectionReason.NEW_EVENT,
        "people": [{"x1": 1.5, "y1": 2.0, "x2": 30.0, "y2": 60.0, "confidence": 0.91, "class_id": 0}],
        "image_width": 560,
        "image_height": 420,
        "model": "m",
        "event_key": f"cam-1:{index}",
        "event_ids": [index, index + 1],
        "score": 0.5,
        "image_path": f"frames/cam-1/{index}.jpg",
        "image_tokens": 252,
    }
    values.update(changes)
    return NewCaption(**values)  # type: ignore[arg-type]


def test_row_round_trips_through_its_states(store: CaptionStore) -> None:
    original = new_caption(3)
    row_id = store.add(original)
    assert row_id is not None
    loaded = store.get(row_id)
    assert loaded is not None
    for field in NewCaption.__dataclass_fields__:
        assert getattr(loaded, field) == getattr(original, field), field
    assert loaded.captured_at.tzinfo is not None
    assert (loaded.status, loaded.people_count, loaded.attempts) == ("pending", 1, 0)
    assert [p.id for p in store.pending()] == [row_id]

    store.mark_retrying(row_id, "APIConnectionError: refused", attempts=1)
    assert store.get(row_id).status == "pending"  # type: ignore[union-attr]
    caption = Caption("two people walking", "tiny", 300, 8, 0.25, structured={"people_count": 2})
    store.mark_captioned(row_id, caption, attempts=2)
    done = store.get(row_id)
    assert done is not None
    assert (done.status, done.caption, done.error, done.attempts) == ("captioned", "two people walking", None, 2)
    assert (done.prompt_tokens, done.completion_tokens, done.latency_ms) == (300, 8, 250.0)
    assert done.structured == {"people_count": 2}
    assert store.pending() == []


def test_failed_and_skipped_rows_keep_the_reason(store: CaptionStore) -> None:
    failed = store.add(new_caption(1))
    skipped = store.add(new_caption(2), status=CaptionStatus.SKIPPED, error="queue-full: 8 frames already waiting")
    assert failed is not None and skipped is not None
    store.mark_failed(failed, "VLM refused the request (HTTP 400): bad image", attempts=1)
    assert store.count(status="failed") == 1
    assert store.get(skipped).error == "queue-full: 8 frames already waiting"  # type: ignore[union-attr]
    assert store.pending() == []


def test_same_camera_and_instant_is_stored_once(store: CaptionStore) -> None:
    assert store.add(new_caption(1)) is not None
    assert store.add(new_caption(1)) is None
    assert store.add(new_caption(1, camera="cam-2")) is not None


def test_non_utc_times_are_stored_as_utc(store: CaptionStore) -> None:
    local = datetime(2026, 11, 29, 13, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    row_id = store.add(new_caption(1, captured_at=local))
    assert row_id is not None
    loaded = store.get(row_id)
    assert loaded is not None
    assert loaded.captured_at == local
    assert loaded.captured_at.utcoffset() == timedelta(0)


def test_newest_first_and_camera_filter(store: CaptionStore) -> None:
    for i in range(5):
        store.add(new_caption(i, camera="cam-1" if i % 2 else "cam-2"))
    assert [r.frame_index for r in store.list()] == [4, 3, 2, 1, 0]
    assert [r.frame_index for r in store.list(camera="cam-1")] == [3, 1]
    assert len(store.list(limit=2)) == 2


def test_concurrent_writers_and_a_reader(store: CaptionStore) -> None:
    def write(i: int) -> None:
        store.add(new_caption(i))

    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(write, i) for i in range(200)]
        counts = [store.count() for _ in range(20)]
        for future in futures:
            future.result()
    assert store.count() == 200
    assert counts == sorted(counts)
