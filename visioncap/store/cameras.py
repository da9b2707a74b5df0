"""Camera state in the database: what the pipeline reports of each camera, for GET /v1/cameras.

The pipeline learns of state changes on its source reader threads and of frames on its detection thread;
neither may wait on the database. `CameraStateRecorder` keeps the latest report per camera in memory and a
thread of its own writes it: state changes at once, the newest frame time at most every `frame_interval_s`
(never once per frame). `close()` writes what is left, so a finished run leaves `finished` behind.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from visioncap.store.leases import Fence, lease_held
from visioncap.store.records import CameraRecord, CameraState, utcnow

log = logging.getLogger(__name__)

FRAME_INTERVAL_S = 5.0
WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class CameraReport:
    """One camera as the pipeline sees it; also what `camera_states` reads back."""

    camera: str
    pipeline: str
    source: str
    state: CameraState | None  # None: read back, a state some newer writer stored that this version does not know
    state_since: datetime
    error: str | None = None
    last_frame_at: datetime | None = None
    frames_analysed: int = 0
    reported_at: datetime | None = None


def write_camera(engine: Engine, report: CameraReport, fence: Fence | None = None) -> bool:
    """Insert or replace the camera's row; a report without a frame time keeps the stored one. With a `fence` (a
    worker's leases) only while it holds the camera's lease, checked in the same transaction: a worker that lost
    the camera (its `finished` arriving late, or a paused worker resumed) never writes over its new owner's
    `online`. Returns whether it wrote."""
    values = {
        "camera": report.camera,
        "pipeline": report.pipeline,
        "source": report.source,
        "state": report.state,
        "state_since": report.state_since,
        "error": report.error,
        "last_frame_at": report.last_frame_at,
        "frames_analysed": report.frames_analysed,
        "reported_at": report.reported_at or utcnow(),
    }
    changes: dict[str, Any] = {key: value for key, value in values.items() if key != "camera"}
    dialect = engine.dialect.name
    with Session(engine) as session, session.begin():
        if fence is not None and not lease_held(session.connection(), fence, report.camera):
            return False
        if dialect in ("sqlite", "postgresql"):
            insert = (sqlite.insert if dialect == "sqlite" else postgresql.insert)(CameraRecord).values(**values)
            changes["last_frame_at"] = func.coalesce(insert.excluded.last_frame_at, CameraRecord.last_frame_at)
            session.execute(insert.on_conflict_do_update(index_elements=["camera"], set_=changes))
            return True
        # Backends without an upsert: two writers racing on a new camera are settled by the primary key.
        if report.last_frame_at is None:
            del changes["last_frame_at"]
        statement = update(CameraRecord).where(CameraRecord.camera == report.camera).values(**changes)
        if cast(CursorResult[Any], session.execute(statement)).rowcount == 0:
            session.add(CameraRecord(**values))
    return True


def camera_states(engine: Engine) -> dict[str, CameraReport]:
    """Every camera a pipeline has reported, by id."""
    with Session(engine) as session:
        rows = session.scalars(select(CameraRecord).order_by(CameraRecord.camera))
        return {
            row.camera: CameraReport(
                camera=row.camera,
                pipeline=row.pipeline,
                source=row.source,
                state=row.state,
                state_since=row.state_since,
                error=row.error,
                last_frame_at=row.last_frame_at,
                frames_analysed=row.frames_analysed,
                reported_at=row.reported_at,
            )
            for row in rows
        }


class CameraStateRecorder:
    """Collects reports from any thread; one writer thread puts them in the database."""

    def __init__(
        self,
        engine: Engine,
        pipeline: str,
        sources: dict[str, str],
        frame_interval_s: float = FRAME_INTERVAL_S,
        fence: Fence | None = None,
    ) -> None:
        """`fence`: a worker's leases; reports of a camera it no longer holds are dropped (see `write_camera`)."""
        self._engine = engine
        self._fence = fence
        self._pipeline = pipeline
        self._frame_interval_s = frame_interval_s
        now = utcnow()
        self._latest = {
            camera: CameraReport(camera, pipeline, source, CameraState.STARTING, now)
            for camera, source in sources.items()
        }
        self._dirty: set[str] = set(self._latest)  # every camera is written as `starting` first
        self._urgent = True
        self._written_at: dict[str, float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._last_warning = 0.0
        self._thread = threading.Thread(target=self._loop, name="camera-state", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add(self, camera: str, source: str) -> None:
        """A camera started during the run (or restarted with another source): reported as `starting`."""
        with self._cond:
            self._latest[camera] = CameraReport(camera, self._pipeline, source, CameraState.STARTING, utcnow())
            self._dirty.add(camera)
            self._urgent = True
            self._cond.notify()

    def state(self, camera: str, state: CameraState, error: str | None = None) -> None:
        """A state change: written at once (by the writer thread)."""
        with self._cond:
            current = self._latest[camera]
            if current.state == state and current.error == error:
                return
            self._latest[camera] = replace(current, state=state, state_since=utcnow(), error=error)
            self._dirty.add(camera)
            self._urgent = True
            self._cond.notify()

    def frame(self, camera: str, captured_at: datetime) -> None:
        """An analysed frame: kept in memory, written with the next state change or after the interval."""
        with self._cond:
            current = self._latest[camera]
            newest = captured_at if current.last_frame_at is None else max(current.last_frame_at, captured_at)
            self._latest[camera] = replace(current, last_frame_at=newest, frames_analysed=current.frames_analysed + 1)
            self._dirty.add(camera)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the writer after it has written every report it holds."""
        with self._cond:
            self._closed = True
            self._urgent = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
        else:
            self._flush(force=True)

    def _due(self, now: float) -> list[CameraReport]:
        """Reports to write now (under the lock): state changes and frame times whose interval has passed."""
        due = [
            self._latest[camera]
            for camera in self._dirty
            if self._urgent or now - self._written_at.get(camera, 0.0) >= self._frame_interval_s
        ]
        for report in due:
            self._dirty.discard(report.camera)
        self._urgent = False
        return due

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._closed and not self._urgent:
                    self._cond.wait(self._frame_interval_s / 2)
                closed = self._closed
            self._flush(force=closed)
            if closed:
                return

    def _flush(self, force: bool) -> None:
        with self._cond:
            if force:
                self._urgent = True
            due = self._due(time.monotonic())
        for report in due:
            try:
                if not write_camera(self._engine, replace(report, reported_at=utcnow()), self._fence):
                    log.debug("camera %s: state %s not written, its lease is another worker's", report.camera,
                              report.state)  # fmt: skip
                self._written_at[report.camera] = time.monotonic()
            except SQLAlchemyError as exc:
                # Camera state is a report, not a result: a database hiccup must not stop the cameras.
                with self._cond:
                    self._dirty.add(report.camera)
                self._warn(f"camera {report.camera}: cannot write its state ({type(exc).__name__}: {exc})")

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._last_warning >= WARN_EVERY_S:
            self._last_warning = now
            log.warning("%s", message)
