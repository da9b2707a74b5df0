"""Each closed set of names (caption status, selection reason, camera state, skip reason) is one StrEnum: the
database stores and returns it, metrics label with it and the API schema lists exactly its values."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import StatementError

from visioncap.api import create_app
from visioncap.caption.client import SkippedCaptionError
from visioncap.config.api import ApiSettings
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption, SelectionReason
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.pipeline.workers import CaptionWorkers
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.cameras import CameraReport, camera_states, write_camera
from visioncap.store.records import CameraState, CaptionStatus, SkipReason

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> CaptionStore:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'captions.db'}"))
    store.create_schema()
    return store


def new_caption(reason: str = SelectionReason.NEW_EVENT) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera="cam",
        source="x.mp4",
        frame_index=1,
        offset_s=0.1,
        captured_at=T0,
        reason=reason,  # type: ignore[arg-type]
        people=[],
        image_width=64,
        image_height=48,
        model="tiny",
        event_key="cam:1",
    )


def values(enum: type[Any]) -> list[str]:
    return [member.value for member in enum]


def test_the_api_schema_lists_exactly_the_values_of_each_enum(tmp_path: Path) -> None:
    settings = ApiSettings(_env_file=None, data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'c.db'}")  # type: ignore[call-arg]
    document = create_app(settings).openapi()
    schemas = document["components"]["schemas"]
    assert schemas["CaptionStatus"]["enum"] == values(CaptionStatus)
    assert schemas["SelectionReason"]["enum"] == values(SelectionReason)
    assert schemas["CameraState"]["enum"] == values(CameraState)
    caption, camera = schemas["Caption"]["properties"], schemas["Camera"]["properties"]
    assert caption["status"]["$ref"].endswith("/CaptionStatus")
    assert caption["reason"]["$ref"].endswith("/SelectionReason")
    assert [branch.get("$ref", "").rsplit("/", 1)[-1] for branch in camera["state"]["anyOf"]] == ["CameraState", ""]
    assert list(schemas["StatusCounts"]["properties"]) == values(CaptionStatus)
    assert schemas["Regenerated"]["properties"]["status"]["const"] == CaptionStatus.PENDING
    search = {p["name"]: p["schema"] for p in document["paths"]["/v1/captions"]["get"]["parameters"]}
    assert search["status"]["items"]["$ref"].endswith("/CaptionStatus")


def test_the_database_keeps_the_values_as_text_and_refuses_any_other(store: CaptionStore) -> None:
    row_id = store.add(new_caption())
    assert row_id is not None
    with store.engine.connect() as conn:
        raw = conn.execute(text("SELECT status, reason FROM captions WHERE id = :id"), {"id": row_id}).one()
    assert tuple(raw) == ("pending", "new-event") and type(raw[0]) is str  # the bytes a string column held
    row = store.get(row_id)
    assert row is not None and row.status is CaptionStatus.PENDING and row.reason is SelectionReason.NEW_EVENT
    with pytest.raises(StatementError, match="not a valid SelectionReason"):
        store.add(new_caption(reason="whim"))
    with pytest.raises(StatementError, match="not a valid CaptionStatus"):
        store.add(new_caption(), status="lost")  # type: ignore[arg-type]

    write_camera(store.engine, CameraReport("cam", "p", "x.mp4", CameraState.FAILED, T0, error="unreadable"))
    assert camera_states(store.engine)["cam"].state is CameraState.FAILED
    with pytest.raises(StatementError, match="not a valid CameraState"):
        write_camera(store.engine, CameraReport("cam", "p", "x.mp4", "paused", T0))  # type: ignore[arg-type]


class DecliningCaptioner:
    """Declines every frame the way the gateway does when its deadline for background work passed."""

    def caption(self, jpeg: bytes, camera: str | None = None) -> Caption:
        # A detail that reads like another code: the label must come from the code, not from the text.
        raise SkippedCaptionError(SkipReason.DEADLINE, "queue-full: waited 30 s")


def test_a_skip_is_labelled_by_its_code_and_stored_with_it_first(store: CaptionStore, tmp_path: Path) -> None:
    metrics = PipelineMetrics()
    outbox = Outbox(store, tmp_path, OutboxConfig(), metrics)
    _, row_id = outbox.put(new_caption(), b"\xff\xd8\xff\xd9")
    workers = CaptionWorkers(outbox, DecliningCaptioner(), 1, metrics)  # type: ignore[arg-type]
    workers.start()
    assert outbox.wait_drained(30)
    outbox.close()
    workers.join(10)
    assert row_id is not None
    row = store.get(row_id)
    assert row is not None and row.status is CaptionStatus.SKIPPED
    assert row.error == "deadline: queue-full: waited 30 s"
    skipped = {
        sample.labels["reason"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "visioncap_frames_skipped"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert skipped == {"deadline": 1.0}
    assert outbox.counts[CaptionStatus.SKIPPED] == 1
