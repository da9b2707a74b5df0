"""Drives the stages for every source of a pipeline and counts what happened."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

from visioncap.caption.client import CaptionError, VlmCaptioner
from visioncap.caption.encode import encode_jpeg
from visioncap.config.pipeline import PipelineConfig
from visioncap.detect.yolo import PersonDetector
from visioncap.errors import SourceError
from visioncap.frames import SelectedFrame
from visioncap.select.person_runs import PersonRunSelector
from visioncap.sources.video_file import VideoFileSource
from visioncap.store.captions import CaptionStore, NewCaption

log = logging.getLogger(__name__)


@dataclass
class RunSummary:
    """Counts over one run; `line()` is what the CLI prints."""

    pipeline: str
    frames: int = 0
    analysed: int = 0
    person_frames: int = 0
    captions: int = 0
    errors: int = 0
    source_errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count_caption(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.captions += 1
            else:
                self.errors += 1

    @property
    def failed(self) -> bool:
        return self.errors > 0 or bool(self.source_errors)

    def line(self) -> str:
        return (
            f"{self.pipeline}: {self.frames} frames, {self.analysed} analysed, {self.person_frames} person frames, "
            f"{self.captions} captions, {self.errors + len(self.source_errors)} errors in {self.elapsed_s:.1f} s"
        )


class PipelineRunner:
    """Reads each source to its end; captions run on worker threads while detection goes on."""

    def __init__(
        self,
        config: PipelineConfig,
        detector: PersonDetector,
        captioner: VlmCaptioner,
        store: CaptionStore,
    ) -> None:
        self._config = config
        self._detector = detector
        self._captioner = captioner
        self._store = store

    def run(self) -> RunSummary:
        summary = RunSummary(pipeline=self._config.name)
        started = time.perf_counter()
        workers = self._config.vlm.concurrency
        # Bounds the frames held in memory while captions are slower than detection; detection
        # waits instead of dropping, because a file source can always be read later.
        in_flight = threading.BoundedSemaphore(workers * 2)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="caption") as pool:
            for source_config in self._config.sources:
                source = VideoFileSource(source_config)
                selector = PersonRunSelector(self._config.selection)
                # File frames carry offsets, not clock times: anchor them at the moment the file is read.
                start_time = datetime.now(UTC)
                try:
                    for frame in source.frames():
                        summary.analysed += 1
                        detection = self._detector.detect([frame])[0]
                        if detection.people:
                            summary.person_frames += 1
                        selected = selector.offer(detection)
                        if selected is None:
                            continue
                        in_flight.acquire()
                        future: Future[None] = pool.submit(
                            self._caption_and_store, selected, str(source_config.path), start_time, summary
                        )
                        future.add_done_callback(lambda f: self._finished(f, in_flight, summary))
                except SourceError as exc:
                    log.error("%s", exc)
                    summary.source_errors.append(str(exc))
                finally:
                    summary.frames += source.frames_read
        summary.elapsed_s = time.perf_counter() - started
        return summary

    @staticmethod
    def _finished(future: Future[None], in_flight: threading.BoundedSemaphore, summary: RunSummary) -> None:
        in_flight.release()
        exc = future.exception()
        if exc is not None:
            # Caption failures are handled inside the task; anything here (e.g. the database
            # refusing a write) must still be counted and shown, not vanish with the thread.
            log.error("caption task failed: %s: %s", type(exc).__name__, exc)
            summary.count_caption(ok=False)

    def _caption_and_store(
        self, selected: SelectedFrame, source: str, start_time: datetime, summary: RunSummary
    ) -> None:
        frame = selected.detection.frame
        image = encode_jpeg(frame.image, self._config.caption.max_image_pixels, self._config.caption.jpeg_quality)
        new = NewCaption(
            pipeline=self._config.name,
            camera=frame.camera,
            source=source,
            frame_index=frame.index,
            offset_s=frame.offset_s,
            captured_at=start_time + timedelta(seconds=frame.offset_s),
            reason=selected.reason,
            people=[person.as_dict() for person in selected.detection.people],
            image_width=image.width,
            image_height=image.height,
            model=self._config.vlm.model,
        )
        try:
            caption = self._captioner.caption(image)
        except CaptionError as exc:
            log.error("camera %s frame %d: caption failed: %s", frame.camera, frame.index, exc)
            self._store.add(replace(new, error=str(exc)))
            summary.count_caption(ok=False)
            return
        self._store.add(
            replace(
                new,
                caption=caption.text,
                model=caption.model,
                prompt_tokens=caption.prompt_tokens,
                completion_tokens=caption.completion_tokens,
                latency_ms=caption.latency_s * 1000,
            )
        )
        summary.count_caption(ok=True)
        log.info(
            "camera %s frame %d (%.1f s, %d people): %s",
            frame.camera,
            frame.index,
            frame.offset_s,
            len(selected.detection.people),
            caption.text[:120],
        )
