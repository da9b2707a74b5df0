"""Drives the stages for every camera of a pipeline: source -> detect -> track -> select -> outbox -> caption."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from visioncap.caption.client import VlmCaptioner
from visioncap.caption.encode import compose, encode_jpeg, people_region
from visioncap.config.cameras import SUBMITTED_KINDS, resolve_references
from visioncap.config.caption import CaptionConfig, ImageMode
from visioncap.config.pipeline import PipelineConfig
from visioncap.config.sources import StreamSourceConfig
from visioncap.detect.tracking import PersonTracker
from visioncap.detect.yolo import PersonDetector
from visioncap.errors import ConfigError
from visioncap.frames import (
    Detection,
    EncodedImage,
    FinishedEvent,
    Frame,
    PersonBox,
    SelectedFrame,
    SelectionReason,
)
from visioncap.pipeline.access import CaptionAccess
from visioncap.pipeline.hub import FrameHub
from visioncap.pipeline.lease_keeper import LeaseKeeper
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import CAPTIONING, Outbox, PutResult
from visioncap.pipeline.watcher import CameraWatcher
from visioncap.pipeline.workers import CaptionWorkers
from visioncap.redact import mask_credentials, mask_urls
from visioncap.select.event_frames import Encoder, EventFrames
from visioncap.select.events import EventSelector
from visioncap.sources.base import FrameSource
from visioncap.sources.registry import open_source
from visioncap.store.camera_configs import StoredCamera
from visioncap.store.cameras import CameraStateRecorder
from visioncap.store.captions import CaptionStore, NewCaption
from visioncap.store.records import CameraOrigin, CameraState, CaptionStatus

log = logging.getLogger(__name__)
RATE_WINDOW_S = 5.0
REQUEUE_POLL_S = 5.0


class ServedModel(Protocol):
    """The VLM server a run started for itself (`run --serve`: visioncap.serve.VllmServer)."""

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Whether it answers now, with details for /readyz."""
        ...

    def exit_error(self) -> str | None:
        """Why it is gone for good (its supervisor gave up restarting it); None while it runs."""
        ...


@dataclass
class CameraStats:
    """What the progress display shows for one camera."""

    camera: str
    state: CameraState = CameraState.STARTING
    analysed: int = 0
    person_frames: int = 0
    people_in_view: int = 0
    events: int = 0
    selected: int = 0
    error: str | None = None
    _recent: deque[float] = field(default_factory=deque, repr=False)

    def analysed_frame(self, now: float) -> None:
        self.analysed += 1
        self._recent.append(now)
        while self._recent and now - self._recent[0] > RATE_WINDOW_S:
            self._recent.popleft()

    @property
    def fps(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        span = self._recent[-1] - self._recent[0]
        return (len(self._recent) - 1) / span if span > 0 else 0.0


@dataclass
class RunSummary:
    """Counts over one run; `line()` is what the CLI prints."""

    pipeline: str
    cameras: dict[str, CameraStats]
    frames: int = 0
    recovered: int = 0
    captions: int = 0
    failed: int = 0
    skipped: int = 0
    duplicates: int = 0
    pending: int = 0
    journaled: int = 0  # rows and outcomes still in the local journal (the database was away at the end)
    journal_lost: int = 0  # of those, in memory only (the disk and the journal's reserve full): lost at exit
    fatal: str | None = None  # what ended the run early (the VLM server it started is gone for good)
    stopped: bool = False
    elapsed_s: float = 0.0

    @property
    def source_errors(self) -> list[str]:
        return [c.error for c in self.cameras.values() if c.error]

    @property
    def ok(self) -> bool:
        # Pending frames are durable: after a requested stop they are expected and the next run takes them;
        # when sources ended by themselves, the drain timed out, which means the VLM could not be reached.
        if self.fatal is not None:
            return False
        if self.journal_lost:
            return False
        return not self.failed and not self.source_errors and (self.stopped or not (self.pending or self.journaled))

    def line(self) -> str:
        cams = self.cameras.values()
        return (
            f"{self.pipeline}: {self.frames} frames, {sum(c.analysed for c in cams)} analysed, "
            f"{sum(c.person_frames for c in cams)} person frames, {sum(c.events for c in cams)} events, "
            f"{self.captions} captions, {self.skipped} skipped, {self.pending} pending, "
            f"{self.failed + len(self.source_errors)} errors in {self.elapsed_s:.1f} s"
            + (f" ({self.journaled} journaled until the database is back)" if self.journaled else "")
            + (
                f" ({self.journal_lost} lost: neither the database nor the disk could take them, named in the log)"
                if self.journal_lost
                else ""
            )
        )


@dataclass
class _Camera:
    source: FrameSource
    tracker: PersonTracker
    selector: EventSelector
    stats: CameraStats
    caption: CaptionConfig  # the pipeline's, with the camera's overrides
    version: int  # of its stored config: another version means a restart
    events: EventFrames | None  # the frames its events are described from; None: events are not described
    generation: int  # tells this source's late reports from those of a later one for the same camera
    # Whether the source has reported a state of its own (live streams do; files and folders have no connection
    # to report on and count as online from their first analysed frame).
    reports_state: bool = False


class PipelineRunner:
    """Runs until every source has ended (files, folders) or `stop()` is called (live streams)."""

    def __init__(
        self,
        config: PipelineConfig,
        detector: PersonDetector,
        captioner: VlmCaptioner,
        store: CaptionStore,
        data_dir: Path,
        metrics: PipelineMetrics,
        on_disk_full: Callable[[], None] | None = None,
        leases: LeaseKeeper | None = None,
    ) -> None:
        self._config = config
        # A worker sharing cameras (`visioncap worker`) runs those it holds a lease on; without, all of them.
        self._leases = leases
        self._held: frozenset[str] = leases.cameras() if leases is not None else frozenset()
        self._detector = detector
        self._captioner = captioner
        self._store = store
        self._data_dir = data_dir
        self._metrics = metrics
        # Made before any source: a source holds `_on_state` from its creation, and `stop()` may come at any time.
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.outbox = Outbox(
            store,
            data_dir,
            config.outbox,
            metrics,
            pipeline=config.name,
            on_disk_full=on_disk_full,
            owns=None if leases is None else self._holds,
        )
        # The pipeline file's cameras are in the database (compose seeds them); its rows say what runs (see _apply).
        # A file's inline credentials are stored masked; the worker alone keeps them, by their masked URL.
        self._file_urls = {
            mask_credentials(source.url): source.url
            for source in config.sources
            if isinstance(source, StreamSourceConfig)
        }
        self._generations = itertools.count(1)
        # Cameras whose captioning is paused while the VLM endpoint refuses the key (the caption workers report).
        self.caption_access = CaptionAccess(config.outbox, metrics)
        self._cameras: dict[str, _Camera] = {}
        self._frames_of_stopped = 0
        self._paused: set[str] = set()
        self.summary = RunSummary(pipeline=config.name, cameras={})
        # State and newest frame of every camera, for the API's /v1/cameras; written off the hot path. Descriptions
        # are masked: the API serves them.
        # A worker writes the state of the cameras it holds only (its leases fence the writes).
        self._camera_states = CameraStateRecorder(store.engine, config.name, {}, fence=leases)
        self._watcher = CameraWatcher(store.engine, config.name)
        self._hub = FrameHub([], on_finished=self._on_finished)
        # Made here, read in run(): their rates and descriptions are needed now, their frames only then.
        self._desired = self._watcher.load()
        self._apply(self._owned())
        self._served: ServedModel | None = None

    def watch_server(self, served: ServedModel) -> None:
        """Follow the VLM server started for this run: /readyz says whether it answers, and the run ends (not ok)
        when it is gone for good, instead of retrying its captions forever."""
        self._served = served

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """For `/readyz`: not ready while captions cannot reach the database or frames cannot be saved."""
        health = self.outbox.health()
        with self._lock:
            cameras = {camera: stats.state for camera, stats in self.summary.cameras.items()}
        details: dict[str, object] = {
            "database": {
                "ok": health.database_ok,
                "down_since": health.database_down_since,
                "error": health.database_error,
                "journal_entries": health.journal_entries,
            },
            "disk": {
                "ok": health.disk_ok,
                "full_since": health.disk_full_since,
                "frames_skipped": health.disk_full_frames,
            },
            "outbox_depth": self.outbox.depth,
            "cameras": cameras,
            "captioning_paused": self.caption_access.paused(),
        }
        ready = health.database_ok and health.disk_ok
        if self._served is not None:
            served_ok, details["vllm"] = self._served.readiness()
            ready = ready and served_ok
        return ready, details

    def stop(self) -> None:
        """Ask the run to end: sources stop, what is pending stays pending for the next run."""
        self._stop.set()

    def run(self) -> RunSummary:
        summary = self.summary
        started = time.perf_counter()
        summary.recovered = self.outbox.recover()
        if summary.recovered:
            log.info("outbox: %d pending frames from an earlier run are captioned first", summary.recovered)
        next_requeue_check = time.monotonic() + REQUEUE_POLL_S
        workers = CaptionWorkers(
            self.outbox, self._captioner, self._config.vlm.concurrency, self._metrics, self.caption_access
        )
        workers.start()
        self._camera_states.start()
        hub = self._hub
        hub.start()
        self._watcher.start()
        try:
            while not self._stop.is_set():
                if self._served is not None and (fatal := self._served.exit_error()) is not None:
                    log.error("%s; the run stops, pending captions stay pending for the next run", fatal)
                    summary.fatal = fatal
                    self._stop.set()
                    break
                changed = False
                if (desired := self._watcher.take()) is not None:
                    self._desired, changed = desired, True
                if self._leases is not None and (held := self._leases.cameras()) != self._held:
                    self._follow_leases(held)
                    changed = True
                if changed:
                    self._apply(self._owned())
                if time.monotonic() >= next_requeue_check:
                    # Rows put back to pending from outside (the API's regenerate) join the queue while we run.
                    if added := self.outbox.recover():
                        log.info("outbox: %d frames re-queued for a new caption", added)
                    next_requeue_check = time.monotonic() + REQUEUE_POLL_S
                batch = hub.next_batch(timeout=0.5)
                if not batch:
                    # A paused camera may be resumed: the run waits for it as for a live stream.
                    if hub.finished and not self._paused and self._leases is None:
                        break
                    continue
                for detection in self._detector.detect(batch):
                    self._handle(detection)
        finally:
            self._watcher.stop()
            hub.stop()
            hub.join(timeout=10)
            self._camera_states.close()
            for camera in self._cameras.values():
                self._flush(camera)
            drain = 0.0 if self._stop.is_set() else self._config.outbox.drain_timeout_s
            deadline = time.monotonic() + drain
            if not self.outbox.wait_drained(drain) and drain:
                log.warning("outbox: captions still pending after %.0f s; the next run captions them first", drain)
            elif drain and not self.outbox.wait_journal_empty(max(0.0, deadline - time.monotonic())):
                log.warning("outbox: the database did not come back in time; the next run writes the journal")
            self.outbox.close()
            workers.join(timeout=self._config.vlm.timeout_s + 5)
            if not workers.is_alive():
                self.outbox.release()
        summary.frames = self._frames_of_stopped + sum(c.source.frames_read for c in self._cameras.values())
        counts = self.outbox.counts
        summary.captions, summary.failed = counts[CaptionStatus.CAPTIONED], counts[CaptionStatus.FAILED]
        summary.skipped, summary.duplicates = counts[CaptionStatus.SKIPPED], counts[PutResult.DUPLICATE]
        summary.pending = self.outbox.depth
        summary.journal_lost = self.outbox.journal_lost
        summary.journaled = self.outbox.journaled - summary.journal_lost
        summary.stopped = self._stop.is_set()
        summary.elapsed_s = time.perf_counter() - started
        return summary

    def _holds(self, camera: str) -> bool:
        return self._leases is None or camera in self._leases.cameras()

    def _owned(self) -> dict[str, StoredCamera]:
        """The stored cameras this process runs: those it holds a lease on, when it shares them."""
        if self._leases is None:
            return self._desired
        return {camera: stored for camera, stored in self._desired.items() if camera in self._held}

    def _follow_leases(self, held: frozenset[str]) -> None:
        """Lost cameras' waiting frames go (their new owner takes the rows); gained cameras' pending rows come."""
        lost, gained = self._held - held, held - self._held
        self._held = held
        if lost and (dropped := self.outbox.forget(set(lost))):
            log.info("outbox: %d waiting frames of cameras now held elsewhere left to their new owner", dropped)
        if gained and (added := self.outbox.recover()):
            log.info("outbox: %d pending frames of cameras taken over", added)

    def _apply(self, desired: dict[str, StoredCamera]) -> None:
        """Make the running cameras what the stored configs say (on the detection thread, between batches): start
        the new and resumed, restart the changed, stop the paused and removed; the others are left alone."""
        paused = {camera for camera, stored in desired.items() if stored.config.paused}
        for camera, running in list(self._cameras.items()):
            stored = desired.get(camera)
            if stored is None or stored.config.paused or stored.version != running.version:
                self._stop_camera(camera, CameraState.PAUSED if stored and stored.config.paused else None)
        for camera in paused - self._paused:
            if camera not in self.summary.cameras:  # paused before this run started it: still shown as paused
                self.summary.cameras = {**self.summary.cameras, camera: CameraStats(camera, CameraState.PAUSED)}
                self._camera_states.add(camera, desired[camera].config.source.description)
                self._camera_states.state(camera, CameraState.PAUSED)
                self._set_state_metric(camera, CameraState.PAUSED)
        self._paused = paused
        for camera, stored in desired.items():
            if camera not in self._cameras and not stored.config.paused:
                self._start_camera(stored)

    def _start_camera(self, stored: StoredCamera) -> None:
        camera, generation = stored.camera, next(self._generations)
        source_config = stored.config.source
        stats = self.summary.cameras.get(camera) or CameraStats(camera=camera)
        stats.error, stats.state = None, CameraState.STARTING
        self.summary.cameras = {**self.summary.cameras, camera: stats}  # a new dict: others iterate the old one
        try:
            if stored.origin is CameraOrigin.API and source_config.kind not in SUBMITTED_KINDS:
                # A row an older version accepted through the API: only a pipeline file may open local paths.
                raise ConfigError(
                    f"{source_config.kind} sources come from a pipeline file only; this camera was added through "
                    f"the API or `visioncap cameras` (network kinds: {', '.join(SUBMITTED_KINDS)})"
                )
            if isinstance(source_config, StreamSourceConfig):
                url = resolve_references(self._file_urls.get(source_config.url, source_config.url))
                source_config = source_config.model_copy(update={"url": url})
            source = open_source(source_config, on_state=partial(self._on_state, generation))
        except ConfigError as exc:
            # A missing secret or a kind this worker cannot read: that camera fails, the others go on.
            message = mask_urls(f"camera {camera}: {exc}")
            log.error("%s", message)
            self._camera_states.add(camera, stored.config.source.description)
            self._on_finished(camera, message, failed_start=True)
            return
        selection = stored.config.selection_for(self._config.selection)
        caption = stored.config.caption_for(self._config.caption)
        selector = EventSelector(selection)
        self._cameras[camera] = _Camera(
            source=source,
            tracker=PersonTracker(
                self._config.detector.tracker,
                source.analyse_rate(),
                keep_lost_s=selection.event_end_s,
                masks=selection.masks,
            ),
            selector=selector,
            stats=stats,
            caption=caption,
            version=stored.version,
            events=EventFrames(
                caption.events,
                selector,
                selection.event_end_s,
                _event_encoder(caption, self._config.vlm.image_token_size),
            )
            if caption.events.enabled
            else None,
            generation=generation,
        )
        self._camera_states.add(camera, source.description)
        self._hub.add(source)
        log.info("camera %s: started (%s, config version %d)", camera, source.description, stored.version)

    def _stop_camera(self, camera: str, state: CameraState | None) -> None:
        """Stop one camera for good or for a restart; what its selector holds still goes to the outbox."""
        running = self._cameras.pop(camera)
        self._hub.remove(camera)
        self._frames_of_stopped += running.source.frames_read
        self._flush(running)
        final = state or CameraState.FINISHED
        with self._lock:
            running.stats.state = final
        self._set_state_metric(camera, final)
        self._camera_states.state(camera, final)
        log.info("camera %s: %s", camera, "paused" if state else "stopped")

    def _set_state_metric(self, camera: str, state: CameraState) -> None:
        for known in CameraState:
            if known is not CameraState.FAILED:  # the pipeline's verdict on a file, never a source's report
                self._metrics.camera_state.labels(camera, known).set(1 if known == state else 0)

    def _on_state(self, generation: int, camera: str, state: CameraState) -> None:
        with self._lock:
            running = self._cameras.get(camera)
            if running is None or running.generation != generation:
                return  # a stopped source's last words: the camera has moved on
            running.stats.state = state
            running.reports_state = True
        self._set_state_metric(camera, state)
        self._camera_states.state(camera, state)

    def _on_finished(self, camera: str, error: str | None, failed_start: bool = False) -> None:
        with self._lock:
            running = self._cameras.get(camera)
            stats = running.stats if running is not None else self.summary.cameras[camera]
            if running is None and not failed_start:
                return
            stats.error = error
            stats.state = CameraState.FAILED if error else CameraState.FINISHED
        self._camera_states.state(camera, stats.state, error)

    def _handle(self, detection: Detection) -> None:
        camera = self._cameras.get(detection.frame.camera)
        if camera is None:
            return  # stopped while its frame was being detected
        stats = camera.stats
        stats.analysed_frame(time.monotonic())
        self._metrics.frames_analysed.labels(stats.camera).inc()
        if not camera.reports_state and stats.state is CameraState.STARTING:
            stats.state = CameraState.ONLINE
            self._camera_states.state(stats.camera, CameraState.ONLINE)
        self._camera_states.frame(stats.camera, self._captured_at(camera, detection.frame))
        tracked = camera.tracker.update(detection)
        if tracked.people:
            stats.person_frames += 1
        stats.people_in_view = len(tracked.people)
        self._metrics.people_in_view.labels(stats.camera).set(stats.people_in_view)
        before = camera.selector.events_started
        selections = camera.selector.offer(tracked)
        if camera.selector.events_started > before:
            self._metrics.events.labels(stats.camera).inc(camera.selector.events_started - before)
        stats.events = camera.selector.events_started
        for selected in selections:
            self._submit(camera, selected)
        if camera.events is not None:
            untracked = camera.events.untracked
            for event in camera.events.offer(tracked):
                self._submit_event(camera, event)
            if camera.events.untracked > untracked:
                self._metrics.events_undescribed.labels(stats.camera).inc(camera.events.untracked - untracked)

    def _flush(self, camera: _Camera) -> None:
        """A camera's stream ended or it stops: what its selector holds, and its events, go to the outbox."""
        for selected in camera.selector.flush():
            self._submit(camera, selected)
        if camera.events is not None:
            for event in camera.events.flush():
                self._submit_event(camera, event)

    @staticmethod
    def _captured_at(camera: _Camera, frame: Frame) -> datetime:
        return camera.source.time_anchor() + timedelta(seconds=frame.offset_s)

    def _new_caption(
        self,
        camera: _Camera,
        name: str,
        people: Sequence[PersonBox],
        image: EncodedImage,
        frame_size: tuple[int, int],
        **fields: Any,
    ) -> NewCaption:
        """A row to caption, with what every row of this camera's image of these people carries; `fields` add the
        frame's (or the event's) own."""
        caption = camera.caption
        width, height = frame_size
        return NewCaption(
            pipeline=self._config.name,
            camera=name,
            source=camera.source.description,
            people=[person.as_dict() for person in people],
            zone_shapes=camera.selector.zone_shapes(name) or None,
            image_width=image.width,
            image_height=image.height,
            model=self._config.vlm.model,
            # Boxes are in frame pixels; the API needs these to draw them on the (scaled, maybe cropped) image.
            frame_width=width,
            frame_height=height,
            image_region=list(people_region(people, width, height, caption.crop_padding))
            if caption.image_mode is ImageMode.CROP and people
            else None,
            **fields,
        )

    def _submit(self, camera: _Camera, selected: SelectedFrame) -> None:
        caption = camera.caption
        frame = selected.detection.frame
        picture = compose(frame.image, selected.detection.people, caption.image_mode, caption.crop_padding)
        image = encode_jpeg(picture, caption.max_image_tokens, self._config.vlm.image_token_size, caption.jpeg_quality)
        new = self._new_caption(
            camera,
            frame.camera,
            selected.detection.people,
            image,
            (frame.image.shape[1], frame.image.shape[0]),
            frame_index=frame.index,
            offset_s=frame.offset_s,
            captured_at=self._captured_at(camera, frame),
            reason=selected.reason,
            event_key=selected.event_key,
            event_ids=list(selected.event_ids),
            score=selected.score,
            zones=[stay.as_dict() for stay in selected.zones],
            image_tokens=image.image_tokens,
        )
        result, row_id = self.outbox.put(new, image.jpeg)
        camera.stats.selected += 1
        self._metrics.frames_selected.labels(frame.camera, selected.reason).inc()
        if result in CAPTIONING:
            self._metrics.image_tokens.labels(frame.camera).inc(image.image_tokens)
        log.debug("camera %s frame %d: %s -> %s (#%s)", frame.camera, frame.index, selected.reason, result, row_id)

    def _submit_event(self, camera: _Camera, event: FinishedEvent) -> None:
        """An event's description request, durable like a frame's: its row (reason event-end) lists the frames,
        whose files the outbox writes before the row exists."""
        main = event.main
        captured_at = camera.source.time_anchor() + timedelta(seconds=event.ended_s)
        new = self._new_caption(
            camera,
            event.camera,
            (main.person,),
            main.image,
            (main.frame_width, main.frame_height),
            frame_index=event.frames[-1].frame_index,
            offset_s=event.ended_s,
            # Not a frame's instant: a camera's rows are one per instant (a re-run of a file finds them), and its
            # last frame may have a caption of its own. No camera gives two frames a microsecond apart.
            captured_at=captured_at + DESCRIPTION_OFFSET,
            reason=SelectionReason.EVENT_END,
            event_key=event.event_key,
            event_ids=[event.track_id],
            zones=[stay.as_dict() for stay in event.zones],
            image_tokens=sum(frame.image.image_tokens for frame in event.frames),
            frames=[frame.as_dict() for frame in event.frames],
        )
        others = [None if frame is main else frame.image.jpeg for frame in event.frames]
        result, row_id = self.outbox.put(new, main.image.jpeg, others)
        self._metrics.frames_selected.labels(event.camera, SelectionReason.EVENT_END).inc()
        if result in CAPTIONING:
            self._metrics.image_tokens.labels(event.camera).inc(new.image_tokens)
        log.debug("camera %s track %d: %d frames to describe -> %s (#%s)", event.camera, event.track_id,
                  len(event.frames), result, row_id)  # fmt: skip


# See _submit_event.
DESCRIPTION_OFFSET = timedelta(microseconds=1)


def _event_encoder(caption: CaptionConfig, token_size: int) -> Encoder:
    """How a kept frame of a person's event is encoded: the camera's picture of them (full, boxed or cropped)."""

    def encode(frame: Frame, person: PersonBox, tokens: int) -> EncodedImage:
        picture = compose(frame.image, (person,), caption.image_mode, caption.crop_padding)
        return encode_jpeg(picture, tokens, token_size, caption.jpeg_quality)

    return encode
