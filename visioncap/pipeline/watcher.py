"""Watches a pipeline's stored camera configs so a running worker follows them without a restart."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from visioncap.store.camera_configs import StoredCamera, camera_versions, list_cameras

log = logging.getLogger(__name__)

POLL_S = 0.5  # an added, changed or removed camera runs (or stops) within about this, a batch and its opening


class CameraWatcher:
    """Polls (camera, version) pairs, a cheap query, and reads the full configs only when they moved; the
    runner takes the new set with `take()` between batches, so the cameras are only ever changed on its thread."""

    def __init__(self, engine: Engine, pipeline: str, poll_s: float = POLL_S) -> None:
        self._engine = engine
        self._pipeline = pipeline
        self._poll_s = poll_s
        self._versions: dict[str, int] | None = None
        self._pending: dict[str, StoredCamera] | None = None
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="camera-watcher", daemon=True)

    def load(self) -> dict[str, StoredCamera]:
        """The configs now (and the versions later polls compare against)."""
        # Every row's version, read before the configs: a stored camera this version refuses is left out of the
        # configs (and logged) but counted here, so later polls do not reload and log it again; a change made
        # between the two reads is found by the next poll.
        versions = camera_versions(self._engine, self._pipeline)
        cameras = {stored.camera: stored for stored in list_cameras(self._engine, self._pipeline)}
        self._versions = versions
        return cameras

    def changed(self) -> bool:
        """Whether a camera of the pipeline was added, changed or removed since the last `load()`."""
        return camera_versions(self._engine, self._pipeline) != self._versions

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def take(self) -> dict[str, StoredCamera] | None:
        """The configs if they changed since the last `take()` (or `load()`), else None."""
        with self._lock:
            pending, self._pending = self._pending, None
            return pending

    def _loop(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                cameras = self.load() if self.changed() else None
            except SQLAlchemyError as exc:
                # The running cameras go on as they are; the next poll tries again. One line per outage.
                if not self._failing:
                    log.warning("cameras: cannot read their configs (%s); keeping the running set", type(exc).__name__)
                self._failing = True
                continue
            if self._failing:
                log.info("cameras: their configs can be read again")
                self._failing = False
            if cameras is None:
                continue
            with self._lock:
                self._pending = cameras
