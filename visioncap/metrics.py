"""Prometheus metrics of the pipeline (served by `visioncap run --metrics-port`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FRAMES_ANALYSED = Counter("visioncap_frames_analysed_total", "Frames the detector ran on.", ["camera"])
PEOPLE_IN_VIEW = Gauge("visioncap_people_in_view", "People tracked in the camera's latest analysed frame.", ["camera"])
EVENTS = Counter("visioncap_person_events_total", "Person events (stable tracks) started.", ["camera"])
FRAMES_SELECTED = Counter("visioncap_frames_selected_total", "Frames chosen for a caption.", ["camera", "reason"])
CAPTIONS = Counter("visioncap_captions_total", "Captions stored.", ["camera"])
CAPTION_FAILURES = Counter(
    "visioncap_caption_failures_total", "Caption attempts that failed.", ["camera", "kind"]
)  # kind: transient (retried) or permanent
FRAMES_SKIPPED = Counter(
    "visioncap_frames_skipped_total", "Selected frames recorded as skipped, never captioned.", ["camera", "reason"]
)
OUTBOX_DEPTH = Gauge("visioncap_outbox_depth", "Frames waiting for a caption (including in flight).")
CAPTION_LATENCY = Histogram(
    "visioncap_caption_latency_seconds",
    "VLM request time of successful captions.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64),
)
IMAGE_TOKENS = Counter("visioncap_image_tokens_total", "Image tokens sent to the VLM (estimated).", ["camera"])
CAMERA_STATE = Gauge(
    "visioncap_camera_state", "1 for the camera's current state, 0 for the others.", ["camera", "state"]
)
STORE_AVAILABLE = Gauge(
    "visioncap_store_available", "1 while the caption database takes writes, 0 while rows wait in the journal."
)
STORE_ERRORS = Counter(
    "visioncap_store_errors_total", "Database writes or reads that failed because the database was unavailable."
)
JOURNAL_ENTRIES = Gauge(
    "visioncap_journal_entries", "Frames and outcomes kept on local disk until the database takes them."
)
DISK_FULL = Gauge("visioncap_disk_full", "1 while selected frames cannot be saved for lack of disk space.")
