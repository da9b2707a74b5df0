"""Caption workers: take due frames from the outbox, caption them, record the outcome."""

from __future__ import annotations

import logging
import threading
import time

from visioncap.caption.client import (
    AccessRefusedError,
    CaptionError,
    SkippedCaptionError,
    TransientCaptionError,
    VlmCaptioner,
)
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.access import CaptionAccess
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox, OutboxItem

log = logging.getLogger(__name__)
# A VLM that is away fails every attempt; one warning per this many seconds says so without flooding.
WARN_EVERY_S = 10.0


class CaptionWorkers:
    """N threads draining the outbox until it is closed."""

    def __init__(
        self,
        outbox: Outbox,
        captioner: VlmCaptioner,
        count: int,
        metrics: PipelineMetrics,
        access: CaptionAccess | None = None,
    ) -> None:
        self._outbox = outbox
        self._metrics = metrics
        self._captioner = captioner
        # Shared with whoever reports it (the runner's /readyz); None: one of the workers' own, default backoff.
        self.access = access or CaptionAccess(OutboxConfig(), metrics)
        self._threads = [threading.Thread(target=self._loop, name=f"caption-{i}", daemon=True) for i in range(count)]
        self._last_warning = 0.0
        self._warn_lock = threading.Lock()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def join(self, timeout: float | None = None) -> None:
        for thread in self._threads:
            thread.join(timeout)

    def is_alive(self) -> bool:
        """Whether any of them may still record an outcome."""
        return any(thread.is_alive() for thread in self._threads)

    def _loop(self) -> None:
        while (item := self._outbox.take()) is not None:
            try:
                caption = self._ask(item)
            except Exception as exc:
                # A worker must survive anything one frame throws at it (a missing file, a bug): the frame goes
                # back to the queue instead of vanishing with the thread. No answer was received, so none is lost.
                log.exception("caption worker: frame %s: unexpected error", item.id or item.key)
                self._outbox.retry(item, f"{type(exc).__name__}: {exc}")
                continue
            if caption is None:
                continue
            # Recorded in the database or, while it is away, in the journal: an answer is never asked for twice.
            # A worker that lost the camera meanwhile discards it (the outbox says so): neither counted nor shown.
            if not self._outbox.complete(item, caption):
                continue
            self._metrics.captions.labels(item.camera).inc()
            self._metrics.caption_latency.observe(caption.latency_s)
            log.info("camera %s frame %s: %s", item.camera, item.id or item.key, caption.text[:120])

    def _ask(self, item: OutboxItem) -> Caption | None:
        """The VLM's caption, or None when the frame's outcome is already recorded (retry, skip, failure) or it
        waits untried (its camera's captioning is paused)."""
        wait = self.access.admit(item.camera)
        if wait > 0:
            self._outbox.defer(item, wait)
            return None
        try:
            return self._attempt(item)
        finally:
            self.access.done(item.camera)

    def _attempt(self, item: OutboxItem) -> Caption | None:
        files = item.files
        missing = next((path for path in files if not path.is_file()), None)
        if not files or missing is not None:
            self._outbox.fail(item, f"image file {missing or item.image_path} is missing")
            return None
        try:
            if item.frame_paths:
                # An event description: its frames, oldest first, as the images of one request.
                caption = self._captioner.describe([path.read_bytes() for path in files], camera=item.camera)
            else:
                caption = self._captioner.caption(files[0].read_bytes(), camera=item.camera)
        except AccessRefusedError as exc:
            # The key, not the frame: the frame stays pending and the camera waits for the key to work again.
            self.access.refused(item.camera, str(exc))
            self._outbox.retry(item, str(exc))
            return None
        except TransientCaptionError as exc:
            delay = self._outbox.retry(item, str(exc))
            self._warn(f"caption of frame {item.id or item.key} failed ({exc}); attempt {item.attempts + 2} "
                       f"in {delay:.1f} s")  # fmt: skip
        except SkippedCaptionError as exc:
            self.access.answered(item.camera)
            log.info("frame %s skipped: %s", item.id or item.key, exc)
            self._outbox.skip(item, exc.reason, exc.detail)
        except CaptionError as exc:
            self.access.answered(item.camera)
            log.error("caption of frame %s refused: %s", item.id or item.key, exc)
            self._outbox.fail(item, str(exc))
        else:
            self.access.answered(item.camera)
            return caption
        return None

    def _warn(self, message: str) -> None:
        with self._warn_lock:
            now = time.monotonic()
            if now - self._last_warning < WARN_EVERY_S:
                return
            self._last_warning = now
        log.warning("%s", message)
