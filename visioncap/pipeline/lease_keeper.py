"""A worker's lease keeper: a thread that renews, claims and gives back camera leases (store/leases.py), and
says which cameras the worker may run right now.

The database decides who holds a lease; this process decides, on its own clock, when to stop trusting what it
last heard: a camera counts as held only until `last successful renewal + lease_s - stop_margin_s`, so a worker
cut off from the database (or paused) stops its cameras before any other worker can have claimed them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from visioncap.config.worker import WorkerConfig
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.store.leases import keep_leases, leave, release

log = logging.getLogger(__name__)


def worker_id() -> str:
    """host/pid/random: unique even when a pid is reused after a crash."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


class LeaseKeeper:
    """Thread-safe: `cameras()` and `token()` from the runner and the caption writers, `step()` from its thread."""

    def __init__(
        self,
        engine: Engine,
        pipeline: str,
        config: WorkerConfig,
        owner: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self._engine = engine
        self._metrics = metrics
        self._pipeline = pipeline
        self._config = config
        self._owner = owner or worker_id()
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}  # camera -> token
        self._valid_until = 0.0  # on this process's clock
        self._releasing: list[str] = []  # stopped here, given back in the next round
        self._refused: set[str] = set()
        self.refusals = 0
        self._stopping = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)

    @property
    def owner(self) -> str:
        return self._owner

    def cameras(self) -> frozenset[str]:
        """The cameras this worker may run now: none once its leases may have lapsed."""
        with self._lock:
            if self._clock() >= self._valid_until:
                return frozenset()
            return frozenset(self._held)

    def token(self, camera: str) -> int | None:
        with self._lock:
            if self._clock() >= self._valid_until:
                return None
            return self._held.get(camera)

    def refused(self, camera: str) -> None:
        """A write was fenced out: another worker holds the camera now; it stops here at once."""
        with self._lock:
            self.refusals += 1
            self._held.pop(camera, None)
            self._refused.add(camera)
            held = len(self._held)
        if self._metrics is not None:
            self._metrics.fenced_writes.labels(camera=camera).inc()
            self._metrics.leased_cameras.set(held)
        log.warning("camera %s: its lease was taken over; stopped here", camera)

    def step(self) -> None:
        """One round against the database; raises SQLAlchemyError when it cannot be reached."""
        started = self._clock()
        with self._lock:
            held = dict(self._held)
            giving_back, self._releasing = self._releasing, []
        if giving_back:
            with self._engine.begin() as conn:
                release(conn, self._owner, giving_back)
        result = keep_leases(
            self._engine, self._owner, self._pipeline, held, self._config.capacity, self._config.lease_s
        )
        kept = dict(result.held)
        # Beyond the fair share (a worker joined): stop the extras now, give their leases back next round.
        extras = sorted(kept)[result.fair_share :]
        for camera in extras:
            del kept[camera]
        with self._lock:
            lost = set(self._held) - set(kept) - set(extras)
            gained = set(kept) - set(self._held)
            # A camera refused meanwhile stays stopped unless this round claimed it anew (a new token).
            kept = {c: t for c, t in kept.items() if c not in self._refused or c in gained}
            self._refused.clear()
            self._held = kept
            self._releasing.extend(extras)
            self._valid_until = started + self._config.lease_s - self._config.stop_margin_s
        if self._metrics is not None:
            self._metrics.leased_cameras.set(len(kept))
            self._metrics.lease_fair_share.set(result.fair_share)
        if gained or lost or extras:
            log.info(
                "leases: %d cameras held (fair share %d); claimed %s, lost %s, giving back %s",
                len(kept), result.fair_share, sorted(gained), sorted(lost), extras,
            )  # fmt: skip

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and give every lease back (call once the cameras have stopped)."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._config.lease_s)
        with self._lock:
            cameras = [*self._held, *self._releasing]
            self._held, self._releasing = {}, []
        try:
            leave(self._engine, self._owner, cameras)
        except SQLAlchemyError as exc:
            log.warning("leases: cannot give them back (%s); they lapse in %.0f s", type(exc).__name__,
                        self._config.lease_s)  # fmt: skip

    def _loop(self) -> None:
        while not self._stopping.wait(self._config.renew_s):
            try:
                self.step()
            except SQLAlchemyError as exc:
                # Held cameras run on until their local deadline passes, then stop (see cameras()).
                if not self._failing:
                    log.warning("leases: cannot renew (%s); cameras stop if this lasts", type(exc).__name__)
                self._set_failing(True)
                continue
            if self._failing:
                log.info("leases: renewed again")
                self._set_failing(False)

    def _set_failing(self, failing: bool) -> None:
        self._failing = failing
        if self._metrics is not None:
            self._metrics.lease_renewal_failing.set(int(failing))
