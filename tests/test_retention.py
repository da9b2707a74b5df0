"""Retention on a real SQLite file and a real PostgreSQL server: old rows and their JPEGs go, counted; newer
rows, pending rows, other cameras' (per-camera override) and files outside the data directory stay."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import run_cli, wait_for
from PIL import Image
from prometheus_client import CollectorRegistry

from visioncap.api import create_app
from visioncap.api.settings import ApiKey, ApiSettings, hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.outbox import Outbox
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.retention import RetentionJob, RetentionMetrics, RetentionPolicy, sweep

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
READ_KEY = "retention-read-key"
TIMEOUT = 30  # seconds; a bound on a broken test, never a measurement


def jpeg(shade: int = 40) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (160, 120), (shade, shade, shade)).save(out, format="JPEG")
    return out.getvalue()


def new_caption(camera: str, captured_at: datetime, index: int = 0, **changes: Any) -> NewCaption:
    values: dict[str, Any] = {
        "pipeline": "p",
        "camera": camera,
        "source": f"/videos/{camera}.mp4",
        "frame_index": index,
        "offset_s": float(index),
        "captured_at": captured_at,
        "reason": "new-event",
        "people": [{"x1": 1.0, "y1": 2.0, "x2": 30.0, "y2": 60.0, "confidence": 0.9, "class_id": 0}],
        "image_width": 160,
        "image_height": 120,
        "model": "tiny",
        "event_key": f"{camera}:{index}",
    }
    values.update(changes)
    return NewCaption(**values)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


class Rows:
    """Rows written the way the pipeline writes them (image on disk first, through the outbox)."""

    def __init__(self, store: CaptionStore, data_dir: Path) -> None:
        self.store = store
        self.data_dir = data_dir
        self.outbox = Outbox(store, data_dir, OutboxConfig(capacity=1000))
        self.count = 0

    def add(
        self, camera: str, age: timedelta, status: str = "captioned", image: bool = True, now: datetime = NOW
    ) -> int:
        self.count += 1
        new = new_caption(camera, now - age, self.count)
        if image:
            _, row_id = self.outbox.put(new, jpeg(self.count % 200))
        else:
            row_id = self.store.add(new, status=CaptionStatus.SKIPPED, error="queue-full: 8 frames already waiting")
        assert row_id is not None
        if status == "captioned":
            self.store.mark_captioned(row_id, Caption(f"caption {self.count}", "tiny", 300, 8, 0.2), attempts=1)
        elif status == "failed":
            self.store.mark_failed(row_id, "refused", attempts=1)
        return row_id

    def image(self, row_id: int) -> Path:
        row = self.store.get(row_id)
        assert row is not None and row.image_path
        return self.data_dir / row.image_path

    def ids(self) -> set[int]:
        return {row.id for row in self.store.list(limit=10_000)}


def test_old_rows_and_their_images_go_newer_pending_and_overridden_cameras_stay(
    store: CaptionStore, data_dir: Path
) -> None:
    rows = Rows(store, data_dir)
    day = timedelta(days=1)
    gone = {
        "old": rows.add("cam-1", 10 * day),
        "old-failed": rows.add("cam-1", 8 * day, "failed"),
        "old-skipped": rows.add("cam-1", 9 * day, "skipped", image=False),
        "old-file-missing": rows.add("cam-1", 12 * day),
        "dock-3d": rows.add("dock", 3 * day),  # the dock keeps 2 days
    }
    kept = {
        "new": rows.add("cam-1", 6 * day),
        "old-pending": rows.add("cam-1", 30 * day, "pending"),  # still the outbox's
        "dock-1d": rows.add("dock", 1 * day),
        "vault-100d": rows.add("vault", 100 * day),  # the vault is kept forever
    }
    missing = rows.image(gone["old-file-missing"])
    missing.unlink()
    files = {name: rows.image(row_id) for name, row_id in {**gone, **kept}.items() if name != "old-skipped"}
    freed = sum(path.stat().st_size for name, path in files.items() if name in gone and path.exists())
    policy = RetentionPolicy(default_days=7, camera_days={"dock": 2, "vault": None})

    preview = sweep(store.engine, data_dir, policy, now=NOW, dry_run=True)
    assert (preview.rows, preview.files, preview.bytes, preview.missing_files) == (5, 3, freed, 1)
    assert rows.ids() == set(gone.values()) | set(kept.values()), "a dry run deletes nothing"
    assert all(path.exists() for name, path in files.items() if name != "old-file-missing")

    result = sweep(store.engine, data_dir, policy, now=NOW)
    assert (result.rows, result.files, result.bytes, result.missing_files, result.orphan_files) == (5, 3, freed, 1, 0)
    assert result.by_camera == {"cam-1": 4, "dock": 1}
    assert rows.ids() == set(kept.values())
    for name, path in files.items():
        assert path.exists() == (name in kept), name
    assert "deleted 5 rows (cam-1 4, dock 1), 3 files" in result.line()

    again = sweep(store.engine, data_dir, policy, now=NOW)
    assert (again.rows, again.files) == (0, 0)
    # Once captioned, the old pending row goes at the next sweep.
    store.mark_captioned(kept["old-pending"], Caption("late", "tiny", 300, 8, 0.2), attempts=1)
    assert sweep(store.engine, data_dir, policy, now=NOW).rows == 1
    assert not files["old-pending"].exists()


def test_camera_override_without_a_default(store: CaptionStore, data_dir: Path) -> None:
    rows = Rows(store, data_dir)
    lobby_old = rows.add("lobby", timedelta(days=5))
    others = {rows.add("lobby", timedelta(days=1)), rows.add("cam-1", timedelta(days=365))}
    policy = RetentionPolicy(camera_days={"lobby": 3})
    assert policy.enabled and RetentionPolicy(camera_days={"lobby": None}).enabled is False
    result = sweep(store.engine, data_dir, policy, now=NOW)
    assert (result.rows, result.by_camera) == (1, {"lobby": 1})
    assert rows.ids() == others and lobby_old not in rows.ids()


def test_orphan_files_go_and_nothing_outside_the_data_dir_is_touched(
    store: CaptionStore, data_dir: Path, tmp_path: Path
) -> None:
    rows = Rows(store, data_dir)
    pending = rows.add("cam-1", timedelta(days=30), "pending")
    old_time = (NOW - timedelta(days=20)).timestamp()
    os.utime(rows.image(pending), (old_time, old_time))  # an old file its (kept) row still needs

    def file(relative: str, age_days: float, data: bytes = b"") -> Path:
        path = data_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data or jpeg())
        stamp = (NOW - timedelta(days=age_days)).timestamp()
        os.utime(path, (stamp, stamp))
        return path

    orphans = [file("frames/cam-1/20261101/a.jpg", 20), file("frames/cam-1/20261101/b.part", 20)]
    kept = [
        file("frames/cam-1/20261128/new.jpg", 1),  # younger than the retention
        file("frames/vault/20260101/a.jpg", 300),  # a camera kept forever
        file("frames/cam-1/20261101/notes.txt", 20, b"not an image"),
    ]
    outside = tmp_path / "secret.jpg"
    outside.write_bytes(jpeg())
    escaping = store.add(new_caption("cam-1", NOW - timedelta(days=40), 999, image_path="../secret.jpg"))
    assert escaping is not None
    store.mark_failed(escaping, "refused", attempts=1)

    policy = RetentionPolicy(default_days=7, camera_days={"vault": None})
    preview = sweep(store.engine, data_dir, policy, now=NOW, dry_run=True)
    assert (preview.rows, preview.orphan_files) == (1, 2) and all(path.exists() for path in orphans)
    result = sweep(store.engine, data_dir, policy, now=NOW)
    assert (result.rows, result.files, result.orphan_files) == (1, 2, 2)
    assert result.bytes == preview.bytes > 0
    assert not any(path.exists() for path in orphans)
    assert all(path.exists() for path in kept)
    assert rows.image(pending).exists() and outside.exists()
    assert sweep(store.engine, data_dir, policy, now=NOW, orphans=False).files == 0


def test_two_sweepers_at_once_delete_and_count_every_row_once(store: CaptionStore, database_url: str) -> None:
    for index in range(400):
        row_id = store.add(new_caption(f"cam-{index % 4}", NOW - timedelta(days=10, seconds=index), index))
        assert row_id is not None
        store.mark_failed(row_id, "refused", attempts=1)
    policy = RetentionPolicy(default_days=1)
    results = []
    start = threading.Barrier(2)

    def sweeper() -> None:
        engine = create_db_engine(database_url)  # another process would have its own engine
        start.wait(TIMEOUT)
        results.append(sweep(engine, Path("/nonexistent"), policy, now=NOW, batch_size=25, orphans=False))
        engine.dispose()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    assert len(results) == 2
    assert sum(result.rows for result in results) == 400
    assert store.count() == 0


def api_settings(data_dir: Path, **changes: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "data_dir": data_dir,
        "vlm_base_url": "http://127.0.0.1:9/v1",
        "api_keys": [ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"})],
    }
    values.update(changes)
    return ApiSettings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
def client_factory(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("VISIONCAP_DATABASE_URL", database_url)

    def make(settings: ApiSettings) -> TestClient:
        return TestClient(create_app(settings), headers={"X-Api-Key": READ_KEY})

    yield make


def test_the_api_sweeps_on_its_schedule_and_exports_counters(
    store: CaptionStore, data_dir: Path, client_factory: Any
) -> None:
    now = datetime.now(UTC)
    rows = Rows(store, data_dir)
    old = [rows.add("cam-1", timedelta(days=3), now=now), rows.add("dock", timedelta(hours=30), now=now)]
    files = [rows.image(row_id) for row_id in old]
    size = sum(path.stat().st_size for path in files)
    fresh = rows.add("cam-1", timedelta(hours=1), now=now)
    settings = api_settings(data_dir, retention_days=2, retention_camera_days={"dock": 1}, retention_interval_s=3600)
    with client_factory(settings) as client:
        wait_for(lambda: rows.ids() == {fresh}, TIMEOUT, "the API's first retention sweep")
        job = client.app.state.api.retention  # type: ignore[attr-defined]
        wait_for(lambda: job.sweeps >= 1, TIMEOUT, "the sweep to be counted")
        metrics = client.get("/metrics").text
    assert not any(path.exists() for path in files) and rows.image(fresh).exists()
    assert 'visioncap_retention_rows_deleted_total{camera="cam-1"} 1.0' in metrics
    assert 'visioncap_retention_rows_deleted_total{camera="dock"} 1.0' in metrics
    assert 'visioncap_retention_files_deleted_total{kind="row"} 2.0' in metrics
    assert f"visioncap_retention_bytes_deleted_total {float(size)}" in metrics
    assert 'visioncap_retention_sweeps_total{outcome="ok"} 1.0' in metrics


def test_no_retention_configured_starts_no_job(store: CaptionStore, data_dir: Path, client_factory: Any) -> None:
    rows = Rows(store, data_dir)
    ancient = rows.add("cam-1", timedelta(days=3650), now=datetime.now(UTC))
    with client_factory(api_settings(data_dir)) as client:
        job: RetentionJob = client.app.state.api.retention  # type: ignore[attr-defined]
        assert job.enabled is False and client.get("/v1/captions").status_code == 200
    assert rows.ids() == {ancient} and job.sweeps == 0


def test_cli_dry_run_then_delete(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    database = f"sqlite:///{tmp_path / 'c.db'}"
    store = CaptionStore(create_db_engine(database))
    store.create_schema()
    rows = Rows(store, data_dir)
    now = datetime.now(UTC)
    old = rows.add("cam-1", timedelta(days=40), now=now)
    dock = rows.add("dock", timedelta(days=3), now=now)
    young = rows.add("cam-1", timedelta(days=1), now=now)
    env = {
        "VISIONCAP_DATABASE_URL": database,
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_RETENTION_DAYS": "30",
        "VISIONCAP_RETENTION_CAMERA_DAYS": json.dumps({"dock": 2}),
    }
    preview = run_cli("retention", "--dry-run", env=env)
    assert preview.returncode == 0, preview.stderr[-2000:]
    assert "retention policy: all cameras 30 days, dock 2 days" in preview.stdout
    assert "would delete 2 rows (cam-1 1, dock 1), 2 files" in preview.stdout
    assert rows.ids() == {old, dock, young}

    done = run_cli("retention", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deleted 2 rows (cam-1 1, dock 1), 2 files" in done.stdout
    assert rows.ids() == {young}

    unset = run_cli("retention", env={k: v for k, v in env.items() if "RETENTION" not in k})
    assert unset.returncode == 0 and "not configured" in unset.stdout
    bad = run_cli("retention", env={**env, "VISIONCAP_RETENTION_CAMERA_DAYS": '{"dock": -1}'})
    assert bad.returncode == 2 and "retention_camera_days" in bad.stderr and "Traceback" not in bad.stderr


def test_a_failed_sweep_is_counted_and_the_next_one_runs(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    metrics = RetentionMetrics(registry)
    engine = create_db_engine(f"sqlite:///{tmp_path / 'not-migrated.db'}")  # no captions table yet
    job = RetentionJob(engine, tmp_path / "data", RetentionPolicy(default_days=1), 3600, metrics)
    assert job.run_once() is None
    assert registry.get_sample_value("visioncap_retention_sweeps_total", {"outcome": "error"}) == 1
    CaptionStore(engine).create_schema()
    result = job.run_once()
    assert result is not None and result.rows == 0 and job.sweeps == 1
    assert registry.get_sample_value("visioncap_retention_sweeps_total", {"outcome": "ok"}) == 1
