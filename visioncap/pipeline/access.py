"""A camera's captioning paused while the VLM endpoint refuses its key (HTTP 401, 403 or 404: a key rotated on the
gateway before the pipeline got the new one, a key limited to other cameras, a model not served).

Such a refusal says nothing about the frame: every frame of the camera would get the same answer. So the frame
stays pending, the camera is marked paused (`visioncap_captioning_paused`, `/readyz`'s `captioning`), and its
other frames wait untried while one frame at a time probes the endpoint, with a wait that doubles from the
outbox's `retry_initial_s` up to its `retry_max_s`. The first answer that is not a refusal resumes the camera.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from visioncap.config.outbox import OutboxConfig
from visioncap.pipeline.metrics import PipelineMetrics

log = logging.getLogger(__name__)


@dataclass
class _Pause:
    since: float  # time.time() of the first refusal
    error: str  # the newest refusal
    wait_s: float  # the current wait between probes
    probe_at: float  # clock() from when the next frame may ask
    probing: bool = False  # a frame is asking now


class CaptionAccess:
    """Thread-safe: every caption worker asks `admit` before it sends a frame and reports how the request went."""

    def __init__(
        self, config: OutboxConfig, metrics: PipelineMetrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._paused: dict[str, _Pause] = {}

    def admit(self, camera: str) -> float:
        """0: send the frame (the camera is not paused, or this frame is its probe: then `done` must follow);
        otherwise the seconds the frame should wait, untried."""
        with self._lock:
            pause = self._paused.get(camera)
            if pause is None:
                return 0.0
            now = self._clock()
            if pause.probing:
                return pause.wait_s
            if now < pause.probe_at:
                return pause.probe_at - now
            pause.probing = True
            return 0.0

    def refused(self, camera: str, error: str) -> float:
        """The endpoint refused a frame of `camera`: paused, or the wait grows (a probe refused again); returns the
        seconds until the next probe."""
        with self._lock:
            now = self._clock()
            pause = self._paused.get(camera)
            if pause is None:
                pause = _Pause(time.time(), error, self._config.retry_initial_s, now + self._config.retry_initial_s)
                self._paused[camera] = pause
                self._metrics.captioning_paused.labels(camera).set(1)
                log.warning(
                    "camera %s: captioning paused: %s; its frames stay pending, asking again with backoff",
                    camera,
                    error,
                )
            elif now >= pause.probe_at:  # the probe's answer (not a frame that was in flight before the pause)
                pause.wait_s = min(pause.wait_s * 2, self._config.retry_max_s)
                pause.probe_at = now + pause.wait_s
            pause.error = error
            pause.probing = False
            return max(pause.probe_at - now, 0.0)

    def answered(self, camera: str) -> None:
        """The endpoint took a request of `camera` (a caption, or any answer but a refusal): resumed."""
        with self._lock:
            pause = self._paused.pop(camera, None)
        if pause is not None:
            self._metrics.captioning_paused.labels(camera).set(0)
            log.info("camera %s: captioning resumed after %.0f s paused", camera, time.time() - pause.since)

    def done(self, camera: str) -> None:
        """The frame that `admit` let through has its outcome (whatever it was): another may probe."""
        with self._lock:
            pause = self._paused.get(camera)
            if pause is not None:
                pause.probing = False

    def paused(self) -> dict[str, dict[str, object]]:
        """The paused cameras, for `/readyz`: since when (Unix time), why, and the wait between probes."""
        with self._lock:
            return {
                camera: {"since": pause.since, "error": pause.error, "retry_every_s": pause.wait_s}
                for camera, pause in self._paused.items()
            }
