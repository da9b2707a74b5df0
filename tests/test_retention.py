"""Retention on a real SQLite file and a real PostgreSQL server: old rows and their JPEGs go, counted; newer
rows, pending rows, other cameras' (per-camera override) and files outside the data directory stay. Free space
on a real 2 MiB tmpfs as the data dir: the oldest finished rows go until it is back above the minimum."""

from __future__ import annotations

import io
import json
import logging
import os
import queue
import random
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import invoke_cli, wait_for
from pg import fresh_database
from PIL import Image
from prometheus_client import CollectorRegistry
from sqlalchemy import select, text, update
from tmpfs_support import mounted_tmpfs

from visioncap.alerts.decisions import DECISIONS, add_decision
from visioncap.alerts.store import add_alert, add_delivery
from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox, PutResult
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.records import AlertDeliveryRecord, AlertRecord, CaptionRecord, DeliveryState
from visioncap.store.retention import MIB, RetentionJob, RetentionMetrics, RetentionPolicy, RetentionResult, sweep

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
        # No journal reserve: these tests count the data dir's free space to the byte, and never journal.
        self.outbox = Outbox(store, data_dir, OutboxConfig(capacity=1000), PipelineMetrics(), journal_reserve_bytes=0)
        self.count = 0

    def add(
        self,
        camera: str,
        age: timedelta,
        status: str = "captioned",
        image: bool = True,
        now: datetime = NOW,
        data: bytes | None = None,
    ) -> int:
        self.count += 1
        new = new_caption(camera, now - age, self.count)
        if image:
            _, row_id = self.outbox.put(new, data or jpeg(self.count % 200))
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


def test_alerts_go_with_their_captions_age_once_no_delivery_is_still_being_sent(
    store: CaptionStore, data_dir: Path
) -> None:
    """Alerts would grow without bound (every fired rule is a row): they follow their camera's retention, with
    their finished deliveries; one whose delivery is still being retried waits for it, and nothing else goes."""
    day = timedelta(days=1)

    def alert(camera: str, age: timedelta, *deliveries: DeliveryState) -> int:
        with store.engine.begin() as conn:
            alert_id = add_alert(
                conn,
                {"rule": "r", "camera": camera, "caption_id": len(made), "captured_at": NOW - age,
                 "caption": "a person", "people_count": 1},
            )  # fmt: skip
            for state in deliveries:
                add_delivery(conn, "hook", "alert", "{}", alert_id, retain=False)
                conn.execute(
                    update(AlertDeliveryRecord)
                    .where(AlertDeliveryRecord.alert_id == alert_id, AlertDeliveryRecord.state == DeliveryState.PENDING)
                    .values(state=state)
                )
        made.append(alert_id)
        return alert_id

    made: list[int] = []
    delivered, failed, pending = DeliveryState.DELIVERED, DeliveryState.FAILED, DeliveryState.PENDING
    gone = {alert("cam-1", 10 * day, delivered, failed), alert("cam-1", 8 * day), alert("dock", 3 * day, delivered)}
    kept = {
        alert("cam-1", 9 * day, delivered, pending),  # its receiver is still being retried
        alert("cam-1", 6 * day, delivered),
        alert("vault", 100 * day, delivered),  # the vault is kept forever
    }
    with store.engine.begin() as conn:  # a caption's own MQTT message: no alert, not retention's
        add_delivery(conn, "mqtt", "visioncap/cam-1/caption", "{}", None, retain=False)
    policy = RetentionPolicy(default_days=7, camera_days={"dock": 2, "vault": None})

    def alerts() -> set[int]:
        with store.engine.connect() as conn:
            return set(conn.scalars(select(AlertRecord.id)))

    def deliveries() -> Counter[int | None]:
        with store.engine.connect() as conn:
            return Counter(conn.scalars(select(AlertDeliveryRecord.alert_id)))

    assert sweep(store.engine, data_dir, policy, now=NOW, dry_run=True).alerts == 3
    assert alerts() == gone | kept
    registry = CollectorRegistry()
    metrics = RetentionMetrics(registry)
    result = sweep(store.engine, data_dir, policy, now=NOW)
    metrics.observe(result)
    assert result.alerts == 3 and "3 alerts" in result.line()
    assert registry.get_sample_value("visioncap_retention_alerts_deleted_total") == 3
    assert alerts() == kept
    assert set(deliveries()) == kept | {None}, "the deleted alerts' deliveries went with them, no other"
    assert sum(deliveries().values()) == 5
    assert sweep(store.engine, data_dir, policy, now=NOW).alerts == 0


def test_watch_rule_decisions_go_with_their_captions_age(store: CaptionStore, data_dir: Path) -> None:
    """Every question a watch rule asks is a row: decisions follow their caption's camera and age, as alerts do."""
    day = timedelta(days=1)

    def decide(camera: str, age: timedelta) -> int:
        with store.engine.begin() as conn:
            values = {"rule": "r", "caption_id": 1, "camera": camera, "captured_at": NOW - age, "question": "q?"}
            return add_decision(conn, {**values, "frames": 1, "match": False, "reason": "no"})

    gone = {decide("cam-1", 10 * day), decide("dock", 3 * day)}
    kept = {decide("cam-1", 6 * day), decide("dock", 1 * day), decide("vault", 100 * day)}
    policy = RetentionPolicy(default_days=7, camera_days={"dock": 2, "vault": None})

    def decisions() -> set[int]:
        with store.engine.connect() as conn:
            return set(conn.scalars(select(DECISIONS.c.id)))

    assert sweep(store.engine, data_dir, policy, now=NOW, dry_run=True).decisions == 2
    assert decisions() == gone | kept
    registry = CollectorRegistry()
    metrics = RetentionMetrics(registry)
    result = sweep(store.engine, data_dir, policy, now=NOW, batch_size=1)
    metrics.observe(result)
    assert result.decisions == 2 and "2 watch-rule decisions" in result.line()
    assert registry.get_sample_value("visioncap_retention_decisions_deleted_total") == 2
    assert decisions() == kept


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
    preview = invoke_cli("retention", "--dry-run", env=env)
    assert preview.returncode == 0, preview.stderr[-2000:]
    assert "retention policy: all cameras 30 days, dock 2 days" in preview.stdout
    assert "would delete 2 rows (cam-1 1, dock 1), 2 files" in preview.stdout
    assert rows.ids() == {old, dock, young}

    done = invoke_cli("retention", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deleted 2 rows (cam-1 1, dock 1), 2 files" in done.stdout
    assert rows.ids() == {young}

    unset = invoke_cli("retention", env={k: v for k, v in env.items() if "RETENTION" not in k})
    assert unset.returncode == 0 and "not configured" in unset.stdout
    bad = invoke_cli("retention", env={**env, "VISIONCAP_RETENTION_CAMERA_DAYS": '{"dock": -1}'})
    assert bad.returncode == 2 and "RETENTION_CAMERA_DAYS" in bad.stderr.upper() and "Traceback" not in bad.stderr


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


# -- free space ----------------------------------------------------------------------------------------------

DISK = 2 * MIB  # the tmpfs
IMAGE_SIZE = 64 * 1024  # every image fills whole pages, so the tmpfs's free space moves by exactly this much


def big_jpeg(seed: int) -> bytes:
    """A real JPEG of noise, padded after its end marker (decoders ignore that) to exactly IMAGE_SIZE."""
    noise = random.Random(seed).randbytes(96 * 96 * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", (96, 96), noise).save(out, format="JPEG", quality=90)
    assert out.tell() < IMAGE_SIZE
    return out.getvalue().ljust(IMAGE_SIZE, b"\0")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB tmpfs mounted as the data dir; unmounted after."""
    with mounted_tmpfs(tmp_path / "small-disk", DISK) as mount_point:
        yield mount_point


def free(path: Path) -> int:
    return shutil.disk_usage(path).free


def test_below_the_minimum_the_oldest_finished_rows_go_until_space_is_back(
    store: CaptionStore, small_disk: Path, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    rows = Rows(store, small_disk)
    day = timedelta(days=1)

    def add(age_days: float, status: str = "captioned") -> int:
        return rows.add("cam-1", age_days * day, status, data=big_jpeg(rows.count))

    # Oldest first by capture time, not by id: rows are added out of order, the oldest pending ones among them.
    pending = [add(100, "pending"), add(70, "pending")]
    finished = {age: add(age, status) for age, status in [(60, "captioned"), (90, "failed"), (30, "captioned")]}
    # Costs no disk space and frees none: the record of a frame a full disk cost, say. It never goes for space.
    imageless = rows.add("cam-1", 80 * day, "skipped", image=False)
    for age in [85, 20, 75, 40, 10, 50, 65, 5, 25, 45, 15, 35, 55, 1, 2]:
        finished[age] = add(age, "failed" if age % 2 else "captioned")
    before = free(small_disk)
    assert before == DISK - 20 * IMAGE_SIZE, "the tmpfs counts whole pages of files only"
    min_free = 1_000_000  # 12 images free now; 15 are enough, 14 not
    assert before < min_free
    by_age = [finished[age] for age in sorted(finished, reverse=True)]
    # Age 90, 85, 75, 65: the four oldest images; the image-less row of age 80 among them stays.
    gone, kept = by_age[:4], by_age[4:]
    images = {row_id: rows.image(row_id) for row_id in pending + by_age}
    policy = RetentionPolicy(min_free_bytes=min_free)  # no age limit at all
    assert policy.enabled and not policy.ages_enabled

    preview = sweep(store.engine, small_disk, policy, now=NOW, dry_run=True, batch_size=3)
    assert (preview.rows, preview.space_rows, preview.space_files, preview.space_bytes) == (4, 4, 4, 4 * IMAGE_SIZE)
    assert preview.free_bytes == before + 4 * IMAGE_SIZE and not preview.space_short
    assert free(small_disk) == before and rows.ids() == {imageless, *pending, *by_age}, "a dry run deletes nothing"
    megabytes = f"{min_free / MIB!r}"
    env = {"VISIONCAP_DATABASE_URL": database_url, "VISIONCAP_DATA_DIR": str(small_disk)}
    cli = invoke_cli("retention", "--dry-run", env={**env, "VISIONCAP_RETENTION_MIN_FREE_MB": megabytes})
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert f"retention policy: all cameras kept forever, at least {min_free / MIB:g} MB free" in cli.stdout
    assert "would delete 4 rows (cam-1 4), 4 files" in cli.stdout
    assert (
        f"for free space: 4 rows, 4 files, {4 * IMAGE_SIZE} bytes, {before + 4 * IMAGE_SIZE} bytes free" in cli.stdout
    )
    assert rows.ids() == {imageless, *pending, *by_age}

    registry = CollectorRegistry()
    result = sweep(store.engine, small_disk, policy, now=NOW, batch_size=3)  # two batches
    metrics = RetentionMetrics(registry)
    metrics.observe(result)
    assert rows.ids() == {imageless, *pending, *kept}
    for row_id, path in images.items():
        assert path.exists() == (row_id not in gone), row_id
    after = free(small_disk)
    assert after == before + 4 * IMAGE_SIZE and after >= min_free > after - IMAGE_SIZE, "no more than needed went"
    counts = (result.rows, result.files, result.bytes, result.space_rows, result.space_files, result.space_bytes)
    assert counts == (4, 4, 4 * IMAGE_SIZE, 4, 4, 4 * IMAGE_SIZE)
    assert (result.free_bytes, result.min_free_bytes, result.space_short) == (after, min_free, False)
    assert "for free space: 4 rows, 4 files" in result.line()
    assert registry.get_sample_value("visioncap_retention_space_rows_deleted_total") == 4
    assert registry.get_sample_value("visioncap_retention_space_bytes_deleted_total") == 4 * IMAGE_SIZE
    assert registry.get_sample_value("visioncap_retention_rows_deleted_total", {"camera": "cam-1"}) == 4
    assert registry.get_sample_value("visioncap_retention_free_bytes") == after
    assert registry.get_sample_value("visioncap_retention_space_short") == 0
    assert sweep(store.engine, small_disk, policy, now=NOW).rows == 0, "above the minimum nothing goes"

    # A minimum the disk cannot reach: every finished row with an image goes; pending rows with their images and
    # the image-less row stay; one warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="visioncap.store.retention"):
        short = sweep(store.engine, small_disk, RetentionPolicy(min_free_bytes=DISK), now=NOW, batch_size=4)
    assert (short.space_rows, short.space_files, short.space_short) == (len(kept), len(kept), True)
    assert short.free_bytes == free(small_disk) == DISK - 2 * IMAGE_SIZE
    assert rows.ids() == {imageless, *pending} and all(images[row_id].exists() for row_id in pending)
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no finished row with an image is left" in warnings[0].getMessage()
    metrics.observe(short)
    assert registry.get_sample_value("visioncap_retention_space_short") == 1


def test_age_retention_comes_first_and_counts_apart_from_space(store: CaptionStore, small_disk: Path) -> None:
    rows = Rows(store, small_disk)
    day = timedelta(days=1)
    expired = [rows.add("cam-1", (20 + n) * day, data=big_jpeg(n)) for n in range(3)]
    young = [rows.add("cam-1", (9 - n) * day, data=big_jpeg(10 + n)) for n in range(9)]  # oldest first
    min_free = free(small_disk) + 4 * IMAGE_SIZE  # the 3 expired images and 1 young one
    policy = RetentionPolicy(default_days=10, min_free_bytes=min_free)

    preview = sweep(store.engine, small_disk, policy, now=NOW, dry_run=True)
    result = sweep(store.engine, small_disk, policy, now=NOW)
    for outcome in (preview, result):
        assert (outcome.rows, outcome.files, outcome.space_rows, outcome.space_bytes) == (4, 4, 1, IMAGE_SIZE)
        assert outcome.free_bytes == min_free
    assert rows.ids() == set(young[1:]) and not any(row_id in rows.ids() for row_id in expired)


class SignallingCondition(threading.Condition):
    """A condition that tells when a thread is about to wait on it (it releases the lock only inside wait())."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


class GatedJob(RetentionJob):
    """Reports each sweep's result, then holds the loop inside that sweep until the test lets it go on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results: queue.Queue[RetentionResult | None] = queue.Queue()
        self.go_on = threading.Semaphore(0)
        # The job's own condition, observable: a wake() made once it waits must reach it, not only one made
        # before it looks (the job has no other sign of being idle between sweeps).
        self.idle = SignallingCondition()
        self._changed = self.idle

    def run_once(self) -> RetentionResult | None:
        result = super().run_once()
        self.results.put(result)
        assert self.go_on.acquire(timeout=TIMEOUT), "the test never let the sweep end"
        return result

    def next_result(self) -> RetentionResult:
        result = self.results.get(timeout=TIMEOUT)
        assert result is not None
        return result


def test_wake_sweeps_at_once_and_a_burst_makes_one_sweep(store: CaptionStore, small_disk: Path) -> None:
    rows = Rows(store, small_disk)
    min_free = DISK // 2
    # Only a free-space minimum, no age retention: the job must run all the same. The interval is never reached.
    job = GatedJob(store.engine, small_disk, RetentionPolicy(min_free_bytes=min_free), 3600, wake_gap_s=0)
    assert job.enabled
    job.start()
    try:
        first = job.next_result()  # the sweep at start, with free space plenty
        assert (first.rows, first.free_bytes) == (0, DISK)
        # While that sweep is still (as far as the job knows) running, the disk fills and writes ask for sweeps.
        oldest = rows.add("cam-1", timedelta(days=30), data=big_jpeg(0))
        pending = rows.add("cam-1", timedelta(days=40), "pending", data=big_jpeg(1))
        others = [rows.add("cam-1", timedelta(days=20 - n), data=big_jpeg(2 + n)) for n in range(15)]
        assert free(small_disk) == min_free - IMAGE_SIZE
        for _ in range(5):
            job.wake()
        assert job.wake_pending
        job.go_on.release()
        woken = job.next_result()  # long before the interval
        assert (woken.space_rows, woken.space_bytes, woken.free_bytes) == (1, IMAGE_SIZE, min_free)
        assert rows.ids() == {pending, *others} and oldest not in rows.ids()
        assert not job.wake_pending, "five calls before the sweep started make that one sweep, no more"
        assert job.sweeps == 2 and not job.idle.waiting.is_set(), "no wait between the two sweeps"

        # Idle now, waiting for the hour's interval: the disk fills again and one write asks for a sweep.
        job.go_on.release()
        assert job.idle.waiting.wait(TIMEOUT)
        more = [rows.add("cam-1", timedelta(days=3 - n), data=big_jpeg(20 + n)) for n in range(2)]
        assert free(small_disk) == min_free - 2 * IMAGE_SIZE
        job.wake()
        again = job.next_result()
        assert (again.space_rows, again.space_bytes, again.free_bytes) == (2, 2 * IMAGE_SIZE, min_free)
        assert rows.ids() == {pending, *others[2:], *more}, "the two oldest finished rows went"
        assert job.sweeps == 3 and not job.wake_pending
    finally:
        job.go_on.release()  # the last sweep ends; the job then waits for the interval until stopped
        job.stop()
    assert job.results.empty() and job.sweeps == 3


def test_the_records_of_frames_a_full_disk_cost_never_go_for_space(tmp_path: Path, small_disk: Path) -> None:
    # SQLite beside the tmpfs, not on it: the disk that fills is the frames' only, and nothing is journaled.
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'captions.db'}"))
    store.create_schema()
    wakes = []
    config = OutboxConfig(capacity=1000)
    outbox = Outbox(
        store, small_disk, config, PipelineMetrics(), on_disk_full=lambda: wakes.append(1), journal_reserve_bytes=0
    )
    day = timedelta(days=1)
    saved: list[int] = []
    # Two cameras whose clocks (or files) interleave in capture time; the disk fills while cam-1 writes.
    while True:
        new = new_caption("cam-1", NOW - (100 - len(saved)) * day, len(saved), score=0.5)
        result, row_id = outbox.put(new, big_jpeg(len(saved)))
        if result is PutResult.DISK_FULL:
            assert row_id is not None
            records = [row_id]  # the frame that found the disk full: recorded as skipped, without its image
            break
        assert result is PutResult.QUEUED and row_id is not None
        saved.append(row_id)
    assert len(saved) > 10
    for n in range(6):  # cam-2's frames, captured between cam-1's oldest ones, cost by the full disk
        new = new_caption("cam-2", NOW - (99.5 - n) * day, 1000 + n)
        result, row_id = outbox.put(new, big_jpeg(1000 + n))
        assert result is PutResult.DISK_FULL and row_id is not None
        records.append(row_id)
    assert len(wakes) == 7
    for row_id in saved:
        store.mark_captioned(row_id, Caption(f"caption {row_id}", "tiny", 300, 8, 0.2), attempts=1)
    for row_id in records:
        row = store.get(row_id)
        assert row is not None and row.status == "skipped" and row.image_path is None
        assert row.error is not None and row.error.startswith("disk_full:")

    min_free = free(small_disk) + 5 * IMAGE_SIZE  # the five oldest images
    result = sweep(store.engine, small_disk, RetentionPolicy(min_free_bytes=min_free), now=NOW, batch_size=4)
    assert (result.space_rows, result.space_files, result.space_bytes) == (5, 5, 5 * IMAGE_SIZE), result.line()
    remaining = {row.id for row in store.list(limit=10_000)}
    assert set(records) <= remaining, "a record of a frame the full disk cost was deleted, freeing nothing"
    assert remaining == set(records) | set(saved[5:])

    # Even a minimum the disk cannot reach leaves them: deleting them would free nothing.
    short = sweep(store.engine, small_disk, RetentionPolicy(min_free_bytes=DISK + 1), now=NOW)
    assert short.space_short and short.space_rows == len(saved) - 5
    assert {row.id for row in store.list(limit=10_000)} == set(records)


def test_a_row_put_back_to_pending_while_the_age_sweep_deletes_it_stays(postgres: str, data_dir: Path) -> None:
    """PostgreSQL only: SQLite runs one writing statement at a time, so the sweep's DELETE cannot overlap a write."""
    url = fresh_database(postgres)
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    rows = Rows(store, data_dir)
    regenerated = rows.add("cam-1", timedelta(days=10))
    expired = rows.add("cam-1", timedelta(days=11))
    image = rows.image(regenerated)
    # The API's regenerate puts the row back to pending; its transaction has written and not committed yet.
    api = create_db_engine(url)
    sweeper = create_db_engine(url)
    watcher = create_db_engine(url)
    results: list[RetentionResult] = []
    try:
        with api.connect() as conn:
            regenerate = conn.begin()
            back = update(CaptionRecord).where(CaptionRecord.id == regenerated).values(status=CaptionStatus.PENDING)
            assert conn.execute(back).rowcount == 1
            thread = threading.Thread(
                target=lambda: results.append(
                    sweep(sweeper, data_dir, RetentionPolicy(default_days=1), now=NOW, orphans=False)
                )
            )
            thread.start()

            def sweep_waits_for_the_row() -> bool:
                # The DELETE chose the row (it was captioned in the statement's snapshot) and waits for its lock.
                query = text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock' AND query ILIKE 'DELETE%'"
                )
                with watcher.connect() as watch:
                    return watch.execute(query).scalar_one() == 1

            wait_for(
                sweep_waits_for_the_row, TIMEOUT, "the sweep's DELETE to wait for the regenerated row's lock", 0.02
            )
            regenerate.commit()
        thread.join(TIMEOUT)
        assert not thread.is_alive() and len(results) == 1
    finally:
        for engine in (api, sweeper, watcher):
            engine.dispose()
    assert results[0].rows == 1 and store.get(expired) is None
    row = store.get(regenerated)
    assert row is not None, "the age sweep deleted a row put back to pending after its statement began"
    assert row.status == "pending" and image.exists()


def test_an_event_descriptions_frames_go_with_it_and_are_no_orphans_while_it_stays(
    store: CaptionStore, data_dir: Path
) -> None:
    rows = Rows(store, data_dir)
    outbox = rows.outbox

    def describe(age: timedelta, index: int) -> list[Path]:
        frames = [{"role": role, "frame_index": index + n, "offset_s": float(n)} for n, role in enumerate("fbl")]
        new = new_caption("cam-1", NOW - age, index, reason="event-end", frames=frames)
        _, row_id = outbox.put(new, jpeg(1), [jpeg(2), None, jpeg(3)])
        assert row_id is not None
        store.mark_captioned(row_id, Caption("a person walked in", "tiny", 900, 8, 0.2), attempts=1)
        row = store.get(row_id)
        assert row is not None and row.frames is not None
        return [data_dir / frame["path"] for frame in row.frames]

    old, young = describe(timedelta(days=10), 10), describe(timedelta(days=1), 20)
    # The young description's files are as old as an orphan would be: its row keeps them all, not its image only.
    stamp = (NOW - timedelta(days=20)).timestamp()
    for path in young:
        os.utime(path, (stamp, stamp))
    size = sum(path.stat().st_size for path in old)
    result = sweep(store.engine, data_dir, RetentionPolicy(default_days=7), now=NOW)
    assert (result.rows, result.files, result.bytes, result.orphan_files) == (1, 3, size, 0)
    assert not any(path.exists() for path in old) and all(path.exists() for path in young)
