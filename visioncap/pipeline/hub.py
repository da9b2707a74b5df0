"""Frames from every camera, one reader thread each, gathered into batches for one detector call."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from visioncap.errors import SourceError
from visioncap.frames import Frame
from visioncap.redact import mask_urls
from visioncap.sources.base import FrameSource

log = logging.getLogger(__name__)


class FrameHub:
    """Holds at most one frame per camera. A reader waits until its camera's frame is taken, so a file is
    never skipped through; live sources keep only their newest frame themselves, so they are never behind
    by more than this one slot."""

    def __init__(self, sources: Iterable[FrameSource], on_finished: Callable[[str, str | None], None]) -> None:
        self._on_finished = on_finished
        self._sources: dict[str, FrameSource] = {}
        self._slots: dict[str, Frame] = {}
        self._running: set[str] = set()
        self._cond = threading.Condition()
        self._stopping = False
        self._started = False
        self._threads: list[threading.Thread] = []
        for source in sources:
            self._add(source)

    def start(self) -> None:
        with self._cond:
            self._started = True
            threads = list(self._threads)
        for thread in threads:
            thread.start()

    def add(self, source: FrameSource) -> None:
        """Start reading one more camera (while running, too); its id must not be read already."""
        with self._cond:
            thread = self._add(source)
            started = self._started
        if started:
            thread.start()

    def remove(self, camera: str) -> FrameSource | None:
        """Stop reading one camera and drop its waiting frame, leaving the others alone; its source, if any.
        Its thread ends by itself (without an `on_finished`: the caller knows why it stopped)."""
        with self._cond:
            source = self._sources.pop(camera, None)
            self._running.discard(camera)
            self._slots.pop(camera, None)
            self._cond.notify_all()
        if source is not None:
            source.stop()
        return source

    def _add(self, source: FrameSource) -> threading.Thread:
        if source.camera in self._sources:
            raise ValueError(f"camera {source.camera} is read already")
        self._sources[source.camera] = source
        self._running.add(source.camera)
        thread = threading.Thread(target=self._read, args=(source,), name=f"source-{source.camera}", daemon=True)
        self._threads.append(thread)
        return thread

    def _current(self, source: FrameSource) -> bool:
        """Whether `source` is still read (under the lock): a removed or replaced one must put no more frames."""
        return not self._stopping and self._sources.get(source.camera) is source

    def _read(self, source: FrameSource) -> None:
        error: str | None = None
        try:
            for frame in source.frames():
                with self._cond:
                    while source.camera in self._slots and self._current(source):
                        self._cond.wait()
                    if not self._current(source):
                        break
                    self._slots[source.camera] = frame
                    self._cond.notify_all()
        except SourceError as exc:
            error = str(exc)
            log.error("%s", exc)
        except Exception as exc:  # one broken camera must not take the others down
            # Stored as the camera's error (served by the API) and printed by the CLI: an exception's text may
            # quote the camera's URL.
            error = mask_urls(f"camera {source.camera}: {type(exc).__name__}: {exc}")
            log.exception("camera %s: source failed", source.camera)
        finally:
            with self._cond:
                current = self._sources.get(source.camera) is source
                if current:
                    self._running.discard(source.camera)
                self._cond.notify_all()
            if current:
                self._on_finished(source.camera, error)

    def next_batch(self, timeout: float | None = None) -> list[Frame]:
        """Every camera's waiting frame; waits for at least one. Empty when all sources ended (or timeout)."""
        with self._cond:
            self._cond.wait_for(lambda: self._slots or not self._running or self._stopping, timeout)
            batch = list(self._slots.values())
            self._slots.clear()
            self._cond.notify_all()
            return batch

    @property
    def finished(self) -> bool:
        with self._cond:
            return not self._running and not self._slots

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            sources = list(self._sources.values())
        for source in sources:
            source.stop()

    def join(self, timeout: float | None = None) -> None:
        with self._cond:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout)
