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
        self._sources = list(sources)
        self._on_finished = on_finished
        self._slots: dict[str, Frame] = {}
        self._running: set[str] = {s.camera for s in self._sources}
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._read, args=(s,), name=f"source-{s.camera}", daemon=True)
            for s in self._sources
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _read(self, source: FrameSource) -> None:
        error: str | None = None
        try:
            for frame in source.frames():
                with self._cond:
                    while source.camera in self._slots and not self._stopping:
                        self._cond.wait()
                    if self._stopping:
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
                self._running.discard(source.camera)
                self._cond.notify_all()
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
        for source in self._sources:
            source.stop()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)
