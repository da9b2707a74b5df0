"""Per-camera counts (GET /v1/cameras, /metrics) come from tables that triggers keep (schema step 8), not from
counting rows per request. They must equal a count of the rows after every kind of write the system makes: the
outbox's insert, captioned/failed/skipped updates, regeneration back to pending, retention's deletes, writers in
parallel; and a database from before the step gets them filled from its rows."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from helpers import database_at_version
from sqlalchemy import Engine, func, select, text

from visioncap.frames import Caption
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.records import CaptionRecord
from visioncap.store.retention import RetentionPolicy, sweep
from visioncap.store.schema import SCHEMA_VERSION, ensure_schema, schema_version
from visioncap.store.search import camera_summaries, status_counts

NOW = datetime.now(UTC).replace(microsecond=0)


def new_caption(index: int, camera: str, event: int, age_days: float = 0.0) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=index,
        offset_s=float(index),
        captured_at=NOW - timedelta(days=age_days, seconds=index),
        reason="new-event",
        people=[{"x1": 1.0, "y1": 2.0, "x2": 3.0, "y2": 4.0, "confidence": 0.9}],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"{camera}:{event}" if event >= 0 else "",
        image_path=f"frames/{camera}/{index}.jpg",  # regeneration needs one (the file itself is not read here)
    )


def counted_from_rows(engine: Engine) -> dict[str, Any]:
    """What the summaries must say, counted the slow way."""
    with engine.connect() as conn:
        by_status = conn.execute(
            select(CaptionRecord.camera, CaptionRecord.status, func.count()).group_by(
                CaptionRecord.camera, CaptionRecord.status
            )
        ).all()
        events = conn.execute(
            select(CaptionRecord.camera, func.count(func.distinct(CaptionRecord.event_key)))
            .where(CaptionRecord.event_key != "")
            .group_by(CaptionRecord.camera)
        ).all()
        newest = conn.execute(
            select(CaptionRecord.camera, func.max(CaptionRecord.captured_at)).group_by(CaptionRecord.camera)
        ).all()
    cameras: dict[str, Any] = {}
    for camera, status, count in by_status:
        cameras.setdefault(camera, {"by_status": {}, "events": 0})["by_status"][status] = count
    for camera, count in events:
        cameras[camera]["events"] = count
    for camera, newest_at in newest:
        cameras[camera]["last_frame_at"] = newest_at.astimezone(UTC)
    return cameras


def summarised(engine: Engine) -> dict[str, Any]:
    return {
        summary.camera: {
            "by_status": {status: count for status, count in summary.by_status.items() if count},
            "events": summary.events,
            "last_frame_at": summary.last_frame_at,
        }
        for summary in camera_summaries(engine)
    }


def write_mixed_rows(store: CaptionStore, rng: random.Random, count: int, first: int = 0) -> list[int]:
    ids = []
    for index in range(first, first + count):
        camera = f"cam-{index % 3}"
        row_id = store.add(new_caption(index, camera, event=rng.randrange(-1, 8), age_days=rng.choice((0, 0, 40))))
        assert row_id is not None
        ids.append(row_id)
        draw = rng.random()
        if draw < 0.6:
            store.mark_captioned(row_id, Caption("a person", "tiny", 10, 5, 0.1), attempts=1)
        elif draw < 0.7:
            store.mark_failed(row_id, "HTTP 400", attempts=1)
        elif draw < 0.8:
            store.mark_skipped(row_id, "coalesced")
    return ids


def test_counts_follow_every_kind_of_write(database_url: str, tmp_path: Path) -> None:
    engine = create_db_engine(database_url)
    store = CaptionStore(engine)
    store.create_schema()
    rng = random.Random(5)
    ids = write_mixed_rows(store, rng, 90)
    expected = counted_from_rows(engine)
    assert summarised(engine) == expected
    assert sum(expected["cam-0"]["by_status"].values()) == 30 and expected["cam-0"]["events"] > 0

    # Regeneration puts captioned rows back to pending; one row changes its event key.
    assert sum(store.requeue(row_id) for row_id in ids[:10]) > 0
    with engine.begin() as conn:
        conn.execute(text("UPDATE captions SET event_key = 'cam-0:99' WHERE id = :id"), {"id": ids[0]})
    assert summarised(engine) == counted_from_rows(engine)

    # Retention deletes the old rows (never pending ones); events whose rows are all gone stop counting.
    result = sweep(engine, tmp_path / "data", RetentionPolicy(default_days=30), now=NOW)
    assert result.rows > 0
    assert summarised(engine) == counted_from_rows(engine)
    assert status_counts(engine) == {
        status: sum(camera["by_status"].get(status, 0) for camera in counted_from_rows(engine).values())
        for status in {s for camera in counted_from_rows(engine).values() for s in camera["by_status"]}
    }

    # Parallel writers (the pipeline's caption workers) on the same cameras and events.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda n: write_mixed_rows(store, random.Random(n), 15, first=1000 + 100 * n), range(4)))
    assert summarised(engine) == counted_from_rows(engine)

    # Everything deleted: no camera is left with zero rows listed.
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM captions"))
    assert summarised(engine) == {} and status_counts(engine) == {}


def test_a_database_from_before_the_counts_gets_them_from_its_rows(database_url: str) -> None:
    engine = create_db_engine(database_url)
    database_at_version(engine, 7)
    with engine.begin() as conn:
        # Version 7 had no count tables; the models now declare them, so drop what step 1 made of them.
        for table in ("caption_counts", "caption_events", "caption_event_counts"):
            conn.execute(text(f"DROP TABLE {table}"))
    store = CaptionStore(engine)
    write_mixed_rows(store, random.Random(9), 30)
    assert schema_version(engine) == 7

    assert ensure_schema(engine) == SCHEMA_VERSION
    expected = counted_from_rows(engine)
    assert summarised(engine) == expected and len(expected) == 3
    # And the triggers keep them from then on.
    write_mixed_rows(store, random.Random(10), 6, first=500)
    assert summarised(engine) == counted_from_rows(engine)
