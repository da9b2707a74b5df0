"""Caption rows round-trip through a real SQLite file, also while other threads write."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from visioncap.store import CaptionStore, NewCaption, create_db_engine


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
        "reason": "run-start",
        "people": [{"x1": 1.5, "y1": 2.0, "x2": 30.0, "y2": 60.0, "confidence": 0.91, "class_id": 0}],
        "image_width": 560,
        "image_height": 420,
        "model": "m",
        "caption": f"two people walking {index}",
        "prompt_tokens": 321,
        "completion_tokens": 8,
        "latency_ms": 123.4,
    }
    values.update(changes)
    return NewCaption(**values)  # type: ignore[arg-type]


def test_row_round_trips(store: CaptionStore) -> None:
    original = new_caption(3)
    stored = store.add(original)
    loaded = store.get(stored.id)
    assert loaded is not None
    for field in NewCaption.__dataclass_fields__:
        assert getattr(loaded, field) == getattr(original, field), field
    assert loaded.captured_at.tzinfo is not None
    assert loaded.people_count == 1
    assert loaded.status == "captioned"
    assert loaded.error is None


def test_failed_caption_keeps_the_frame_record(store: CaptionStore) -> None:
    stored = store.add(new_caption(1, caption=None, prompt_tokens=None, error="APIConnectionError: refused"))
    loaded = store.get(stored.id)
    assert loaded is not None
    assert (loaded.status, loaded.caption, loaded.error) == ("failed", None, "APIConnectionError: refused")
    assert store.count(status="failed") == 1
    assert store.count(status="captioned") == 0


def test_non_utc_times_are_stored_as_utc(store: CaptionStore) -> None:
    local = datetime(2026, 11, 29, 13, 0, tzinfo=UTC).astimezone(ZoneInfo("Europe/Berlin"))
    loaded = store.get(store.add(new_caption(1, captured_at=local)).id)
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
