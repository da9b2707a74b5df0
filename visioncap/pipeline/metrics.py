"""Prometheus metrics of the pipeline, in a registry of its own (served by `visioncap run --metrics-port`).

Whoever builds a pipeline makes one `PipelineMetrics` and hands it to every part that records; nothing is
registered on import, so several pipelines (tests) can live in one process.
"""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from visioncap.store.retention import RetentionMetrics

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)


class FailureKind(StrEnum):
    """The `kind` label of failed caption attempts."""

    TRANSIENT = "transient"  # tried again later
    PERMANENT = "permanent"  # refused for good: the row is failed


class PipelineMetrics:
    """All pipeline series, the retention sweeps this process runs and the process's own (memory, CPU, GC)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The process series prometheus_client's default registry would have shown; the soak bench reads them.
        for collector in (GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR):
            r.register(collector)
        self.frames_analysed = Counter(
            "visioncap_frames_analysed_total", "Frames the detector ran on.", ["camera"], registry=r
        )
        self.people_in_view = Gauge(
            "visioncap_people_in_view", "People tracked in the camera's latest analysed frame.", ["camera"], registry=r
        )
        self.events = Counter(
            "visioncap_person_events_total", "Person events (stable tracks) started.", ["camera"], registry=r
        )
        self.frames_selected = Counter(
            "visioncap_frames_selected_total", "Frames chosen for a caption.", ["camera", "reason"], registry=r
        )
        self.events_undescribed = Counter(
            "visioncap_event_tracks_undescribed_total",
            "Tracks whose event gets no description (caption.events): the camera already kept frames of "
            "MAX_TRACKS (256) tracks; their frames are still captioned.",
            ["camera"],
            registry=r,
        )
        self.captions = Counter("visioncap_captions_total", "Captions stored.", ["camera"], registry=r)
        self.caption_failures = Counter(
            "visioncap_caption_failures_total", "Caption attempts that failed.", ["camera", "kind"], registry=r
        )  # kind: a FailureKind
        self.frames_skipped = Counter(
            "visioncap_frames_skipped_total",
            "Selected frames recorded as skipped, never captioned.",
            ["camera", "reason"],
            registry=r,
        )
        self.outbox_depth = Gauge(
            "visioncap_outbox_depth", "Frames waiting for a caption (including in flight).", registry=r
        )
        self.caption_latency = Histogram(
            "visioncap_caption_latency_seconds",
            "VLM request time of successful captions.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.image_tokens = Counter(
            "visioncap_image_tokens_total", "Image tokens sent to the VLM (estimated).", ["camera"], registry=r
        )
        self.camera_state = Gauge(
            "visioncap_camera_state",
            "1 for the camera's current state, 0 for the others.",
            ["camera", "state"],
            registry=r,
        )
        self.captioning_paused = Gauge(
            "visioncap_captioning_paused",
            "1 while the camera's captioning is paused because the VLM endpoint refuses its key (HTTP 401/403/404); "
            "its frames stay pending and are tried again with backoff.",
            ["camera"],
            registry=r,
        )
        self.store_available = Gauge(
            "visioncap_store_available",
            "1 while the caption database takes writes, 0 while rows wait in the journal.",
            registry=r,
        )
        self.store_errors = Counter(
            "visioncap_store_errors_total",
            "Database writes or reads that failed because the database was unavailable.",
            registry=r,
        )
        self.journal_entries = Gauge(
            "visioncap_journal_entries",
            "Frames and outcomes kept on local disk until the database takes them.",
            registry=r,
        )
        self.disk_full = Gauge(
            "visioncap_disk_full", "1 while selected frames cannot be saved for lack of disk space.", registry=r
        )
        self.retention = RetentionMetrics(r)  # the sweeps `visioncap run` runs beside the pipeline
        # `visioncap worker` only (camera leases on PostgreSQL); a single-box `visioncap run` leaves them at zero.
        self.leased_cameras = Gauge(
            "visioncap_leased_cameras", "Cameras this worker holds a lease on and may run now.", registry=r
        )
        self.lease_fair_share = Gauge(
            "visioncap_lease_fair_share", "Cameras this worker should hold, by its share of the live capacity.",
            registry=r,
        )  # fmt: skip
        self.lease_renewal_failing = Gauge(
            "visioncap_lease_renewal_failing",
            "1 while this worker cannot reach the database to renew its leases (its cameras stop once they lapse).",
            registry=r,
        )
        self.fenced_writes = Counter(
            "visioncap_fenced_writes_total",
            "Caption writes refused because another worker had taken the camera's lease (the camera stops here).",
            ["camera"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
