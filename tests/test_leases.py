"""Camera leases between workers on a real PostgreSQL: claims up to the fair share, hand-over when a worker joins,
takeover when one stops renewing, and fencing of a stale owner's caption writes.

Each worker is a LeaseKeeper driven round by round with `step()` (its thread is not started), so the tests decide
who renews when; only lease expiry, which is the database's clock, is waited for. A worker that was paused is a
keeper whose clock stands still: its process never saw time pass, which is what a paused process sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers import wait_for
from pg import fresh_database
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from visioncap.config.cameras import CameraConfig
from visioncap.config.outbox import OutboxConfig
from visioncap.config.settings import Settings
from visioncap.config.sources import FileSourceConfig
from visioncap.config.worker import WorkerConfig
from visioncap.errors import ConfigError
from visioncap.frames import Caption
from visioncap.pipeline.journal import Journal, JournalEntry, Outcome
from visioncap.pipeline.lease_keeper import LeaseKeeper
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox, PutResult
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.camera_configs import add_camera, update_camera
from visioncap.store.cameras import CameraReport, camera_states, write_camera
from visioncap.store.leases import FORGET_WORKER_S, FencedOut, lease_held
from visioncap.store.records import CameraState
from visioncap.store.safety import is_unavailable

LEASE_S = 1.5
CAMERAS = ["cam-0", "cam-1", "cam-2", "cam-3"]
CAPTION = Caption("a person", "tiny", 300, 8, 0.1)
WAIT_S = 30.0  # a bound on a broken test, never a measurement


class StoppedClock:
    """The clock of a paused process: it does not move while the process is stopped."""

    def __call__(self) -> float:
        return 0.0


@pytest.fixture
def engine(postgres: str, tmp_path: Path) -> Engine:
    engine = create_db_engine(fresh_database(postgres))
    CaptionStore(engine).create_schema()
    for camera in CAMERAS:
        add_camera(engine, CameraConfig(pipeline="p", source=FileSourceConfig(camera=camera, path=tmp_path / "x.mp4")))
    return engine


def keeper(
    engine: Engine, capacity: int, clock: StoppedClock | None = None, metrics: PipelineMetrics | None = None
) -> LeaseKeeper:
    config = WorkerConfig(capacity=capacity, lease_s=LEASE_S, renew_s=0.5, stop_margin_s=0.3)
    return LeaseKeeper(engine, "p", config, metrics=metrics, **({"clock": clock} if clock else {}))


def sample(metrics: PipelineMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def holds(keeper: LeaseKeeper) -> Callable[[str], bool]:
    return lambda camera: camera in keeper.cameras()


def frame(camera: str, index: int) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source="x.mp4",
        frame_index=index,
        offset_s=index / 10,
        captured_at=datetime(2026, 12, 1, 12, 0, index, tzinfo=UTC),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key=f"{camera}:e{index}",
        image_path=f"frames/{camera}/{index}.jpg",
    )


def test_two_workers_share_the_cameras_by_capacity_and_never_hold_the_same_one(engine: Engine) -> None:
    a, b = keeper(engine, capacity=3), keeper(engine, capacity=1)
    a.step()  # alone so far: up to its capacity
    assert len(a.cameras()) == 3
    b.step()  # a's 3 of 4 capacity: b's share is ceil(4 * 1 / 4) = 1, the one camera left
    a.step()
    assert len(a.cameras()) == 3 and len(b.cameras()) == 1
    assert a.cameras() | b.cameras() == set(CAMERAS)


def test_a_joining_worker_gets_its_share_from_one_that_holds_too_many(engine: Engine) -> None:
    a, b = keeper(engine, capacity=4), keeper(engine, capacity=4)
    a.step()
    assert a.cameras() == set(CAMERAS)
    b.step()  # nothing free yet: its heartbeat now makes a's share 2
    assert b.cameras() == set()
    a.step()  # a stops two cameras at once and gives their leases back in its next round
    assert len(a.cameras()) == 2
    a.step()
    b.step()
    assert len(b.cameras()) == 2 and not a.cameras() & b.cameras()


def test_a_camera_moved_to_another_pipeline_is_not_renewed_by_the_old_pipelines_worker(
    engine: Engine, tmp_path: Path
) -> None:
    a = keeper(engine, capacity=4)
    a.step()
    assert "cam-0" in a.cameras()
    moved = CameraConfig(pipeline="q", source=FileSourceConfig(camera="cam-0", path=tmp_path / "x.mp4"))
    assert update_camera(engine, moved) is not None
    a.step()
    assert a.cameras() == set(CAMERAS) - {"cam-0"}


def test_a_worker_stalled_inside_a_fenced_write_lets_go_of_the_lease_row_within_its_idle_limit(engine: Engine) -> None:
    """A worker cut off (or paused) between the lease check of a write and its commit: the server sees its
    session idle in a transaction that holds the lease row (FOR SHARE), which every other worker's claim skips.
    The worker's engine has the server end such a session after `idle_transaction_s`, so the camera is taken
    once its lease expires, not when the server's keepalives give up on the dead client."""
    stalled_engine = create_db_engine(engine.url.render_as_string(hide_password=False), idle_transaction_s=0.5)
    stalled = LeaseKeeper(stalled_engine, "p", WorkerConfig(capacity=4, lease_s=LEASE_S, renew_s=0.5,
                                                             stop_margin_s=0.3))  # fmt: skip
    stalled.step()
    with stalled_engine.connect() as conn:
        conn.begin()
        assert lease_held(conn, stalled, "cam-0")  # the write's check: the row is locked from here
        live = keeper(engine, capacity=4)

        def live_has_all() -> bool:
            live.step()
            return live.cameras() == set(CAMERAS)

        wait_for(live_has_all, WAIT_S, "the live worker to take every camera, the locked one too", poll_s=0.1)
        with pytest.raises(DBAPIError, match="idle-in-transaction") as ended:
            conn.execute(text("SELECT 1"))  # the stalled write's next statement: its session is gone
        # The outbox keeps the frame and retries on a new connection, as for any connection the database dropped.
        assert is_unavailable(ended.value)
    stalled_engine.dispose()


def test_a_worker_that_stops_renewing_loses_its_cameras_to_a_live_one_within_the_lease(engine: Engine) -> None:
    a, b = keeper(engine, capacity=2), keeper(engine, capacity=4)
    a.step()
    b.step()
    assert len(a.cameras()) == 2 and len(b.cameras()) == 2
    tokens = {camera: a.token(camera) for camera in a.cameras()}
    last_renewal = time.monotonic()
    a.step()  # its last round: from here on it is as good as killed
    # Polled finely: it stops 1.2 s (lease less stop margin) after that renewal began, and a coarse poll's
    # oversleep on a loaded host would eat the 0.3 s this bound leaves.
    wait_for(lambda: not a.cameras(), WAIT_S, "the silent worker to stop its own cameras", poll_s=0.01)
    stopped_after = time.monotonic() - last_renewal
    assert stopped_after < LEASE_S, f"a stopped its cameras {stopped_after:.1f} s after its last renewal"

    def b_has_all() -> bool:
        b.step()
        return b.cameras() == set(CAMERAS)

    wait_for(b_has_all, WAIT_S, "the live worker to take the silent one's cameras", poll_s=0.1)
    took = time.monotonic() - last_renewal
    assert took < LEASE_S + 1.0, f"takeover took {took:.1f} s"
    assert all(b.token(camera) == token + 1 for camera, token in tokens.items() if token is not None)


def test_rows_of_workers_long_gone_are_deleted_by_a_live_workers_round(engine: Engine) -> None:
    with engine.begin() as conn:
        for worker, age_s in (("gone/1/a", FORGET_WORKER_S + 60), ("dead-a-minute/2/b", 60)):
            conn.execute(
                text("INSERT INTO workers (id, pipeline, capacity, heartbeat_at) "
                     "VALUES (:id, 'p', 1, now() - make_interval(secs => :age))"),
                {"id": worker, "age": age_s},
            )  # fmt: skip
    live = keeper(engine, capacity=4)
    live.step()
    with engine.connect() as conn:
        left = set(conn.scalars(text("SELECT id FROM workers")))
    assert left == {"dead-a-minute/2/b", live.owner}


def test_a_paused_then_resumed_worker_cannot_write_as_owner(engine: Engine, tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    paused = keeper(engine, capacity=4, clock=StoppedClock(), metrics=metrics)
    paused.step()
    assert paused.cameras() == set(CAMERAS)
    assert sample(metrics, "visioncap_leased_cameras") == 4 and sample(metrics, "visioncap_lease_fair_share") == 4
    stale, stale_tokens = CaptionStore(engine, fence=paused), {c: paused.token(c) for c in CAMERAS}
    row = stale.add(frame("cam-0", 1))  # pending, as the paused worker left it
    assert row is not None

    live = keeper(engine, capacity=4)

    def live_has_all() -> bool:
        live.step()
        return live.cameras() == set(CAMERAS)

    wait_for(live_has_all, WAIT_S, "the live worker to take the cameras of the paused one", poll_s=0.1)
    # Resumed: its own clock says its leases still hold, and its tokens are unchanged.
    assert paused.cameras() == set(CAMERAS) and {c: paused.token(c) for c in CAMERAS} == stale_tokens
    owner = CaptionStore(engine, fence=live)
    with pytest.raises(FencedOut):
        stale.mark_captioned(row, CAPTION, attempts=1)
    assert "cam-0" not in paused.cameras(), "a fenced-out camera stops at once"
    with pytest.raises(FencedOut):
        stale.add(frame("cam-1", 2))
    assert paused.refusals == 2
    # What an operator sees: each refused write counted by camera, and the cameras this worker still runs.
    assert sample(metrics, "visioncap_fenced_writes_total", camera="cam-0") == 1
    assert sample(metrics, "visioncap_fenced_writes_total", camera="cam-1") == 1
    assert sample(metrics, "visioncap_leased_cameras") == 2

    # The new owner's outbox takes the pending row over and its caption lands, once.
    outbox = Outbox(owner, tmp_path, OutboxConfig(), PipelineMetrics(), pipeline="p", owns=holds(live))
    assert outbox.recover() == 1
    item = outbox.take(timeout=0)
    assert item is not None and item.id == row
    outbox.complete(item, CAPTION)
    record = owner.get(row)
    assert record is not None and record.status is CaptionStatus.CAPTIONED
    assert owner.count(CaptionStatus.CAPTIONED) == 1
    assert owner.count() == 1  # the stale insert left no row


def test_a_worker_that_lost_a_camera_never_writes_over_its_new_owners_camera_state(engine: Engine) -> None:
    paused = keeper(engine, capacity=4, clock=StoppedClock())
    paused.step()
    report = CameraReport("cam-0", "p", "x.mp4", CameraState.ONLINE, datetime.now(UTC))
    assert write_camera(engine, report, fence=paused)
    live = keeper(engine, capacity=4)

    def live_has_all() -> bool:
        live.step()
        return live.cameras() == set(CAMERAS)

    wait_for(live_has_all, WAIT_S, "the live worker to take the cameras of the paused one", poll_s=0.1)
    assert write_camera(engine, replace(report, state=CameraState.STARTING), fence=live)
    # The old owner, resumed, still believes it holds cam-0 and reports it stopped: dropped, not written.
    assert "cam-0" in paused.cameras()
    assert not write_camera(engine, replace(report, state=CameraState.FINISHED), fence=paused)
    assert camera_states(engine)["cam-0"].state is CameraState.STARTING
    assert paused.refusals == 0  # a state report is no caption: it does not count as a fenced write


def test_the_old_owners_outbox_discards_its_answer_when_fenced_out(engine: Engine, tmp_path: Path) -> None:
    paused = keeper(engine, capacity=4, clock=StoppedClock())
    paused.step()
    stale = CaptionStore(engine, fence=paused)
    outbox = Outbox(stale, tmp_path, OutboxConfig(), PipelineMetrics(), pipeline="p", owns=holds(paused))
    (tmp_path / "frames" / "cam-2").mkdir(parents=True)
    result, row = outbox.put(frame("cam-2", 3), b"\xff\xd8 jpeg \xff\xd9")
    assert result is PutResult.QUEUED and row is not None
    item = outbox.take(timeout=0)
    assert item is not None

    live = keeper(engine, capacity=4)

    def live_has_it() -> bool:
        live.step()
        return "cam-2" in live.cameras()

    wait_for(live_has_it, WAIT_S, "the live worker to take cam-2", poll_s=0.1)
    # The paused worker's VLM answered after all: too late, discarded (and so neither logged nor counted as stored).
    assert outbox.complete(item, CAPTION) is False
    assert outbox.counts[PutResult.FENCED] == 1 and outbox.counts[CaptionStatus.CAPTIONED] == 0
    record = stale.get(row)
    assert record is not None and record.status is CaptionStatus.PENDING  # the new owner's to caption


def test_a_frame_journaled_before_the_camera_moved_is_stored_for_its_new_owner(engine: Engine, tmp_path: Path) -> None:
    """A worker selects a frame while it holds the camera, but its database is away: the frame waits in its
    journal. Meanwhile the camera moves to another worker. When the database is back, the frame's row is written
    all the same (nobody else knows of that frame) and the new owner captions it; only the old worker's outcome
    for it is refused."""
    old = keeper(engine, capacity=4, clock=StoppedClock())
    old.step()
    journal = Journal(tmp_path, "p", shared=True)  # the slot the old worker's outbox takes again below
    selected = frame("cam-3", 5)
    journal.save(JournalEntry(key=str(selected.image_path), seq=1, new=selected,
                              outcome=Outcome(CaptionStatus.PENDING, attempts=1, error="ConnectError")))  # fmt: skip
    journal.close()
    (tmp_path / "frames" / "cam-3").mkdir(parents=True)
    (tmp_path / str(selected.image_path)).write_bytes(b"\xff\xd8 jpeg \xff\xd9")
    live = keeper(engine, capacity=4)

    def live_has_all() -> bool:
        live.step()
        return live.cameras() == set(CAMERAS)

    wait_for(live_has_all, WAIT_S, "the live worker to take every camera", poll_s=0.1)
    outbox = Outbox(CaptionStore(engine, fence=old), tmp_path, OutboxConfig(), PipelineMetrics(), pipeline="p",
                    owns=holds(old))  # fmt: skip
    outbox.recover()
    assert outbox.wait_journal_empty(WAIT_S), "the journal is written back"
    store = CaptionStore(engine, fence=live)
    (row,) = store.list(limit=10)
    assert row.camera == "cam-3" and row.status is CaptionStatus.PENDING and row.image_path == selected.image_path
    # The new owner's outbox takes the row and its caption lands, once.
    owner = Outbox(store, tmp_path / "live", OutboxConfig(), PipelineMetrics(), pipeline="p", owns=holds(live))
    assert owner.recover() == 1
    item = owner.take(timeout=0)
    assert item is not None and item.id == row.id
    assert owner.complete(item, CAPTION)
    assert store.count(CaptionStatus.CAPTIONED) == 1 and store.count() == 1
    outbox.close()


def test_a_worker_on_sqlite_says_several_workers_need_postgresql(tmp_path: Path) -> None:
    from visioncap.config.pipeline import PipelineConfig
    from visioncap.pipeline.compose import build_pipeline

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'one.db'}", data_dir=tmp_path)
    config = PipelineConfig.model_validate(
        {"name": "p", "sources": [{"camera": "c", "path": str(tmp_path / "x.mp4")}], "vlm": {"model": "m"}}
    )
    with pytest.raises(ConfigError, match="several workers through leases in PostgreSQL"):
        build_pipeline(config, settings, check_vlm=False, worker=WorkerConfig())
