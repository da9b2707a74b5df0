"""Storage faults produced for real: a PostgreSQL server stopped and started under the outbox, a running pipeline
and the API; a full disk (a small tmpfs) under the outbox and a pipeline; model output PostgreSQL cannot store."""

from __future__ import annotations

import itertools
import logging
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from helpers import missing, pipeline_dict, run_cli, scrape_metric, start_cli, wait_for, write_pipeline
from pg import fresh_database, own_cluster
from streams import RtspServer, skip_unless_gstreamer
from videos import make_event_video

from visioncap.bench.common.pgcluster import PostgresCluster
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import DISK_WARN_EVERY_S, Outbox, PutResult
from visioncap.serve import VllmServer, check_own, free_port
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.cameras import camera_states

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
JPEG = b"\xff\xd8" + bytes(range(256)) * 8 + b"\xff\xd9"  # 2 KB: the outbox does not look inside
CAPTION = Caption("a person at the door", "tiny", 300, 8, 0.1)


def frame(index: int, camera: str = "cam", event: str | None = None) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source="rtsp://cam/stream",
        frame_index=index,
        offset_s=index / 10,
        captured_at=T0 + timedelta(seconds=index),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"{camera}:{event or index}",
        score=0.5,
    )


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of this test's own, so that stopping it disturbs no other test."""
    with own_cluster() as cluster:
        yield cluster


def rows_by_index(store: CaptionStore) -> dict[int, list]:
    found: dict[int, list] = {}
    for row in store.list(limit=1000):
        found.setdefault(row.frame_index, []).append(row)
    return found


def test_outbox_keeps_frames_and_answers_through_an_outage_and_a_restart(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    store = CaptionStore(create_db_engine(fresh_database(cluster.base_url)))
    store.create_schema()
    config = OutboxConfig(store_retry_max_s=0.5)
    box = Outbox(store, tmp_path, config, PipelineMetrics(), pipeline="p")
    before = box.put(frame(1), JPEG)
    in_flight = box.take(timeout=0)  # a worker is asking the VLM about frame 1 when the database goes
    assert before[0] is PutResult.QUEUED and in_flight is not None and in_flight.id == before[1]

    cluster.stop()
    during = [box.put(frame(i), JPEG) for i in (2, 3, 4)]
    assert [result for result, _ in during] == [PutResult.JOURNALED] * 3, "selection goes on without a database"
    box.complete(in_flight, CAPTION)  # the answer arrives while the database is away
    second = box.take(timeout=0)
    assert second is not None and second.id is None  # frame 2: captioned from its image, its row still unwritten
    box.complete(second, CAPTION)
    health = box.health()
    assert not health.database_ok and health.database_error and health.journal_entries == 4
    assert len(list((tmp_path / "journal").rglob("*.json"))) == 4, "every entry is on disk, not only in memory"

    # The process dies here (nothing is closed); a new one starts while the database is still away.
    again = Outbox(store, tmp_path, config, PipelineMetrics(), pipeline="p")
    assert again.recover() == 2, "frames 3 and 4 still need captions; 1 and 2 have theirs in the journal"
    taken = [again.take(timeout=0) for _ in range(3)]
    assert taken[2] is None
    # Image names are TIME_MICROS_FRAMEINDEX_UNIQUE.jpg.
    assert sorted(Path(item.key).name.split("_")[2] for item in taken[:2] if item) == ["3", "4"]
    for item in taken[:2]:
        assert item is not None
        again.complete(item, CAPTION)

    cluster.start()
    assert again.wait_journal_empty(60), "the journal is written once the database is back"
    assert again.health().database_ok
    rows = rows_by_index(store)
    assert sorted(rows) == [1, 2, 3, 4] and all(len(found) == 1 for found in rows.values()), "each frame once"
    assert {found[0].status for found in rows.values()} == {"captioned"}
    assert rows[1][0].id == before[1] and rows[1][0].caption == CAPTION.text
    assert again.recover() == 0, "no frame is asked for again"
    assert not list((tmp_path / "journal").rglob("*.json"))
    again.close()
    box.close(flush_timeout_s=0)


def test_a_write_that_committed_but_lost_its_answer_is_not_stored_twice(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    """A lost commit acknowledgement cannot be produced on demand, so the journal entry such a loss leaves behind
    (the frame's row is in the database, the outbox did not hear so) is made by recording it before the outage."""
    store = CaptionStore(create_db_engine(fresh_database(cluster.base_url)))
    store.create_schema()
    box = Outbox(store, tmp_path, OutboxConfig(store_retry_max_s=0.5), PipelineMetrics(), pipeline="p")
    _, row_id = box.put(frame(7), JPEG)
    item = box.take(timeout=0)
    assert item is not None and row_id is not None
    stored = store.get(row_id)
    assert stored is not None
    entry_new = replace(frame(7), image_path=stored.image_path)
    cluster.stop()
    box.put(frame(8), JPEG)  # the database is seen away
    with box._lock:  # the entry a lost answer leaves: the row to insert, and the caption that followed
        from visioncap.pipeline.journal import JournalEntry, Outcome
        from visioncap.store import CaptionStatus

        box._journaled[item.key] = JournalEntry(
            key=item.key, seq=0, new=entry_new, outcome=Outcome(CaptionStatus.CAPTIONED, 1, caption=CAPTION)
        )
    cluster.start()
    assert box.wait_journal_empty(60)
    rows = rows_by_index(store)
    assert len(rows[7]) == 1 and rows[7][0].id == row_id and rows[7][0].status == "captioned"
    assert len(rows[8]) == 1
    box.close()


def test_model_output_postgres_cannot_store_is_cleaned_or_marked_failed_never_retried(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    store = CaptionStore(create_db_engine(fresh_database(cluster.base_url)))
    store.create_schema()
    box = Outbox(store, tmp_path, OutboxConfig(), PipelineMetrics(), pipeline="p")
    box.put(frame(1), JPEG)
    box.put(frame(2), JPEG)
    noisy = Caption("a\x00 person\x07 waves\ud800\n", "tiny", 300, 8, 0.1, structured={"summary\x00": ["x\x00y"]})
    first = box.take(timeout=0)
    assert first is not None
    box.complete(first, noisy)  # PostgreSQL refuses NUL in text: stored without it, not retried
    row = store.get(first.id)  # type: ignore[arg-type]
    assert row is not None and row.status == "captioned"
    assert row.caption == "a person waves\n" and row.structured == {"summary": ["xy"]}

    # A value no retry can store (PostgreSQL's INTEGER): the row is failed with the reason, once.
    second = box.take(timeout=0)
    assert second is not None
    box.complete(second, replace(CAPTION, prompt_tokens=2**40))
    row = store.get(second.id)  # type: ignore[arg-type]
    assert row is not None and row.status == "failed" and row.error.startswith("unstorable captioned result")
    assert box.health().database_ok, "a refused value is not an outage"
    assert box.recover() == 0 and box.take(timeout=0) is None, "the VLM is not asked again"
    assert not list((tmp_path / "journal").rglob("*.json"))

    # A row the database refuses for good (camera is VARCHAR(64) there) costs that frame, not the pipeline.
    assert box.put(frame(3, camera="c" * 65), JPEG) == (PutResult.UNSTORABLE, None)
    assert box.counts["failed"] == 1 and box.depth == 0 and box.health().database_ok
    assert len(list((tmp_path / "frames").rglob("*.jpg"))) == 2, "its picture is not left behind"
    box.close()


# -- a full disk ----------------------------------------------------------------------------------


@contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real file system of `size` that runs out of space."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        missing(f"a tmpfs mount ({done.stderr.decode().strip()})", "run the tests as root, as CI does")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """120 KB, the size the full-disk fault was first seen with."""
    with tmpfs(tmp_path / "small", "120k") as mount:
        yield mount


def test_a_full_disk_costs_only_the_frames_that_cannot_be_written(
    small_disk: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'c.db'}"))  # the database lives elsewhere
    store.create_schema()
    wakes: list[int] = []
    now = [100.0]  # the outbox's clock, moved by hand: the warnings' rate limit must not depend on how fast this runs
    box = Outbox(
        store,
        small_disk,
        OutboxConfig(capacity=100),
        PipelineMetrics(),
        clock=lambda: now[0],
        on_disk_full=lambda: wakes.append(1),
    )
    big = b"\xff\xd8" + b"\x00" * 30_000 + b"\xff\xd9"
    caplog.set_level(logging.WARNING, "visioncap.pipeline.outbox")
    results = [box.put(frame(i, camera="a" if i % 2 else "b"), big)[0] for i in range(12)]
    assert PutResult.QUEUED in results and PutResult.DISK_FULL in results
    full = results.count(PutResult.DISK_FULL)
    assert box.counts["disk_full"] == full and box.counts["skipped"] == full
    assert not box.health().disk_ok and wakes, "retention is asked to free space"
    skipped = [r for r in store.list(limit=100) if r.status == "skipped"]
    assert len(skipped) == full and all(r.error.startswith("disk_full") and r.image_path is None for r in skipped)
    warnings = [r for r in caplog.records if "not saved (disk_full" in r.getMessage()]
    assert len(warnings) == 2, "one line per camera per minute, however many frames"
    assert not list(small_disk.rglob("*.part")), "no half-written pictures left taking space"
    now[0] += DISK_WARN_EVERY_S - 0.1
    assert box.put(frame(20, camera="a"), big)[0] is PutResult.DISK_FULL
    now[0] += 0.1
    assert box.put(frame(21, camera="a"), big)[0] is PutResult.DISK_FULL
    warned = [r.getMessage() for r in caplog.records if "not saved (disk_full" in r.getMessage()]
    assert len(warned) == 3 and "frame 21 " in warned[-1], "a minute later, the next frame not saved is logged"

    # Space comes back (retention or a person removes files): the next frame is saved and the state clears.
    item = box.take(timeout=0)
    assert item is not None and item.image_path is not None
    box.complete(item, CAPTION)
    for picture in list(small_disk.rglob("*.jpg")):
        picture.unlink()
    assert box.put(frame(100), big)[0] is PutResult.QUEUED
    assert box.health().disk_ok
    box.close()


def test_a_full_journal_does_not_silence_a_full_disk_on_the_same_camera(
    cluster: PostgresCluster, small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each (camera, reason) has its own minute: one warning must not hide a different fault of that camera."""
    store = CaptionStore(create_db_engine(fresh_database(cluster.base_url)))
    store.create_schema()
    now = [100.0]  # moved by hand, and not at all here: both warnings fall inside one rate-limit window
    box = Outbox(
        store,
        small_disk,
        OutboxConfig(capacity=100, journal_capacity=1, store_retry_max_s=0.5),
        PipelineMetrics(),
        clock=lambda: now[0],
    )
    caplog.set_level(logging.WARNING, "visioncap.pipeline.outbox")
    cluster.stop()
    try:
        assert box.put(frame(1, camera="a"), JPEG)[0] is PutResult.JOURNALED
        assert box.put(frame(2, camera="a"), JPEG)[0] is PutResult.JOURNAL_FULL
        # Fill what is left of the disk, so the next picture cannot be written.
        try:
            with (small_disk / "filler").open("wb") as out:
                while True:
                    out.write(b"\0" * 4096)
                    out.flush()
        except OSError:
            pass
        big = b"\xff\xd8" + b"\x00" * 30_000 + b"\xff\xd9"
        assert box.put(frame(3, camera="a"), big)[0] is PutResult.DISK_FULL
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("camera a:")]
        assert any("journal is full" in line for line in lines), lines
        assert any("not saved (disk_full" in line for line in lines), "logged though the full journal was"
        assert box.put(frame(4, camera="a"), big)[0] is PutResult.DISK_FULL
        again = [r.getMessage() for r in caplog.records if r.getMessage().startswith("camera a:")]
        assert len(again) == len(lines) == 2, "and each reason still at most once a minute"
    finally:
        cluster.start()
    box.close(flush_timeout_s=0)


# -- the API while its database is away ---------------------------------------------------------------


def test_api_answers_503_with_retry_after_while_its_database_is_away(cluster: PostgresCluster, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from visioncap.api.app import create_app
    from visioncap.config.api import ApiKey, ApiSettings
    from visioncap.config.keys import hash_key

    key = "test-read-key-0123456789"
    settings = ApiSettings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=fresh_database(cluster.base_url),
        data_dir=tmp_path,
        api_keys=[ApiKey(name="reader", sha256=hash_key(key), scopes={"read"})],
        api_ready_check_vlm=False,
    )
    headers = {"Authorization": f"Bearer {key}"}
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/captions", headers=headers).status_code == 200
        cluster.stop()
        for path in ("/v1/captions", "/v1/cameras", "/v1/captions/1", "/readyz"):
            answer = client.get(path, headers=headers)
            assert answer.status_code == 503, (path, answer.text)
            assert int(answer.headers["Retry-After"]) > 0, path
        assert client.get("/healthz").status_code == 200, "the process itself is alive"
        cluster.start()
        assert client.get("/v1/captions", headers=headers).status_code == 200
        assert client.get("/v1/cameras", headers=headers).status_code == 200


# -- a running pipeline: two live cameras, PostgreSQL stopped for 30 s -------------------------------------

FAST_DRAIN = {"retry_initial_s": 0.5, "retry_max_s": 2.0}
OUTAGE_S = 30.0  # the length of the outage the test produces, not a wait for something to happen


def readiness(root_url: str) -> dict:
    try:
        answer = httpx.get(f"{root_url}/readyz", timeout=5)
    except httpx.HTTPError:
        return {}
    return {"code": answer.status_code, **answer.json()}


def test_pipeline_keeps_going_through_a_postgres_outage_and_loses_nothing(
    cluster: PostgresCluster, tmp_path: Path, vllm_server: VllmServer
) -> None:
    skip_unless_gstreamer()
    videos = []
    for name, person in (("door", "zidane-right"), ("yard", "bus-right")):
        video = tmp_path / f"{name}.mp4"
        # Looped by the server: someone comes into view every 6 s and leaves again.
        make_event_video(video, [(None, 1), (person, 3), (None, 2)])
        videos.append((name, video))
    url = fresh_database(cluster.base_url)
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    with RtspServer(videos[0][1]) as door, RtspServer(videos[1][1]) as yard:
        data = pipeline_dict(videos[0][1])
        data["sources"] = [
            {"camera": name, "kind": "rtsp", "url": server.url, "analyze_fps": 4, "read_timeout_s": 5}
            for (name, _), server in zip(videos, (door, yard), strict=True)
        ]
        data["selection"] = {**data["selection"], "event_end_s": 1.0, "recaption_interval_s": None}
        data["outbox"] = {"store_retry_max_s": 1.0}
        pipeline = write_pipeline(tmp_path, data)
        env = {
            "VISIONCAP_DATABASE_URL": url,
            "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
            "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        }
        port = free_port()
        root = f"http://127.0.0.1:{port}"
        run = start_cli("run", str(pipeline), "--progress", "log", "--metrics-port", str(port), env=env)
        try:
            wait_for(lambda: store.count(status="captioned") >= 2, 180, "captions from the live cameras")
            assert readiness(root).get("code") == 200
            check_own(run.pid, port)  # the answer was this run's, not another process's on a port both picked

            cluster.stop()
            stopped_at = datetime.now(UTC)
            outage_started = time.monotonic()
            wait_for(lambda: readiness(root).get("code") == 503, 60, "/readyz to report the database away")
            wait_for(
                lambda: (
                    readiness(root)["database"]["journal_entries"] >= 2
                    and time.monotonic() - outage_started >= OUTAGE_S
                ),
                180,
                "frames selected during the outage to be journaled",
            )
            assert run.poll() is None, "the pipeline survives its database going away"
            assert scrape_metric(root, "visioncap_store_available") == 0
            cluster.start()
            restarted_at = datetime.now(UTC)
            wait_for(
                lambda: (ready := readiness(root)).get("code") == 200 and ready["database"]["journal_entries"] == 0,
                120,
                "the journal to be written to the database",
            )
            wait_for(
                lambda: any(r.captured_at > restarted_at for r in store.list(status="captioned", limit=50)),
                180,
                "a caption of a frame seen after the database came back",
            )
            # Camera-state writes failed during the outage and are retried: both rows report after it.
            wait_for(
                lambda: (
                    {
                        camera
                        for camera, report in camera_states(store.engine).items()
                        if report.reported_at and report.reported_at > restarted_at and report.state == "online"
                    }
                    == {"door", "yard"}
                ),
                60,
                "camera states written again after the outage",
            )
            run.send_signal(signal.SIGTERM)
            out, errors = run.communicate(timeout=120)
        finally:
            if run.poll() is None:
                run.kill()
    assert run.returncode == 0, errors[-3000:]
    assert "Traceback" not in errors
    assert "database unavailable" in errors and "database available again" in errors
    summary = re.search(r"(\d+) captions, (\d+) skipped, (\d+) pending, (\d+) errors", out)
    assert summary is not None, out
    captions, skipped, pending, failed = map(int, summary.groups())
    rows = store.list(limit=5000)
    assert len(rows) == captions + skipped + pending + failed, "every selected frame has exactly one row"
    assert failed == 0 and {r.status for r in rows} <= {"captioned", "pending", "skipped"}
    images = [r.image_path for r in rows if r.image_path]
    assert len(images) == len(set(images)), "no frame stored twice"
    during = [r for r in rows if stopped_at < r.captured_at < restarted_at]
    assert during and {r.camera for r in during} == {"door", "yard"}, "frames selected during the outage are kept"
    assert any(r.status == "captioned" for r in during), "and captioned"
    assert not list((tmp_path / "data" / "journal").rglob("*.json"))


LOG_STAMP_LAG_S = 1.0  # most time between the disk warning's rate check and its log record; it takes microseconds


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """64 KB: two or three of the test video's pictures (6-30 KB each) fill it."""
    with tmpfs(tmp_path / "tiny", "64k") as mount:
        yield mount


def test_pipeline_on_a_full_disk_skips_what_it_cannot_save_and_recovers_with_retention(
    tiny_disk: Path, tmp_path: Path, vllm_server: VllmServer
) -> None:
    video = tmp_path / "people.mp4"
    people = ["zidane-right", "bus-right", "bus-mid"] * 3  # nine events; their pictures are 6-30 KB each
    make_event_video(video, [(None, 1)] + [step for name in people for step in ((name, 2), (None, 2.5))])
    database = f"sqlite:///{tmp_path / 'c.db'}"  # the database is on another disk; the frames fill this one
    env = {
        "VISIONCAP_DATABASE_URL": database,
        "VISIONCAP_DATA_DIR": str(tiny_disk),
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        "VISIONCAP_RETENTION_MIN_FREE_MB": "0.04",
    }
    data = pipeline_dict(video, caption={"max_image_tokens": 512}, outbox=FAST_DRAIN, selection={"event_end_s": 1.0})
    started = time.monotonic()
    result = run_cli("run", str(write_pipeline(tmp_path, data)), "--progress", "none", env=env, timeout=600)
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stderr
    assert "Traceback" not in log
    # Retention deletes the oldest finished rows to keep space free, the disk_full ones among them, so the run's
    # own account is the evidence: its log in order, and its summary.
    first_full = log.find("not saved (disk_full")
    freed = log.find("for free space:", first_full)
    saved_again = log.find("disk: frames are saved again", freed)
    assert 0 <= first_full < freed < saved_again, log[-4000:]
    assert "camera cam-1 frame" in log[saved_again:], "a frame saved after the disk was full got its caption"
    summary = re.search(r"(\d+) captions, (\d+) skipped, (\d+) pending, (\d+) errors", result.stdout)
    assert summary is not None, result.stdout
    captions, skipped, pending, errors = map(int, summary.groups())
    assert skipped >= 1 and pending == 0 and errors == 0
    assert captions >= 3, "the run went on captioning"
    # The limiter lets one warning through per camera (this run has one) every DISK_WARN_EVERY_S, so how many a run
    # logs depends on how long it ran: under load the disk can fill again minutes after the first warning.
    warned = [
        datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
        for stamp in re.findall(r"^(\S+ \S+) WARNING .*not saved \(disk_full", log, re.MULTILINE)
    ]
    assert 1 <= len(warned) <= 1 + elapsed // DISK_WARN_EVERY_S, f"one warning per minute of the run ({elapsed:.0f} s)"
    # A line is stamped a moment after the limiter read its clock: LOG_STAMP_LAG_S bounds that moment.
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(warned)]
    assert all(gap >= DISK_WARN_EVERY_S - LOG_STAMP_LAG_S for gap in gaps), f"one per minute, not per frame: {gaps}"
    store = CaptionStore(create_db_engine(database))
    for row in store.list(limit=500):
        assert row.image_path is None or (tiny_disk / row.image_path).is_file(), "no row names a deleted picture"
