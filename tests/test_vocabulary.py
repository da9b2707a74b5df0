"""Each closed set of names (caption status, selection reason, camera state, skip reason, the gateway's refusal
reasons and error types, the admission controller's actions and violations, the caption image mode) is one
StrEnum: the database stores and returns it, metrics label with it, config validates it and the API schema lists
exactly its values."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.exc import StatementError

import visioncap.gateway
from visioncap.api import create_app
from visioncap.caption.client import SkippedCaptionError
from visioncap.caption.encode import compose
from visioncap.config.api import ApiSettings
from visioncap.config.caption import CaptionConfig, ImageMode
from visioncap.config.gateway import BackgroundConfig, ControllerConfig, ObjectivesConfig, PacingConfig
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption, PersonBox, SelectionReason
from visioncap.gateway.admission import Action, AdmissionController, Decision, Violation
from visioncap.gateway.errors import ErrorType, RefusalReason
from visioncap.gateway.metrics import GatewayMetrics
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
        write_camera(store.engine, CameraReport("cam", "p", "x.mp4", "hibernating", T0))  # type: ignore[arg-type]


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


# -- the gateway ---------------------------------------------------------------------------------------------

GATEWAY_SOURCES = sorted(Path(visioncap.gateway.__file__).parent.glob("*.py"))


def calls(name: str) -> list[tuple[str, ast.Call]]:
    """Every call of `name` (a function, or a method as `.name`) in the gateway package, with its file."""
    found = []
    for path in GATEWAY_SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                func = node.func
                called = (
                    func.id
                    if isinstance(func, ast.Name)
                    else f".{func.attr}"
                    if isinstance(func, ast.Attribute)
                    else ""
                )
                if called == name:
                    found.append((f"{path.name}:{node.lineno}", node))
    return found


def member_of(node: ast.expr, enum: type[Any]) -> bool:
    """`node` is `Enum.MEMBER` of `enum`, spelled out at the call site."""
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == enum.__name__
        and node.attr in enum.__members__
    )


def test_every_gateway_refusal_names_a_refusal_reason_and_an_error_type() -> None:
    refusals = calls("GatewayError")
    assert len(refusals) >= 10  # the scan sees the package's refusals (an empty scan would pass anything)
    for where, call in refusals:
        reason = {keyword.arg: keyword.value for keyword in call.keywords}.get("reason")
        assert reason is not None and member_of(reason, RefusalReason), f"{where}: reason is not a RefusalReason"
        assert len(call.args) >= 2 and member_of(call.args[1], ErrorType), f"{where}: error type not ErrorType"
    bodies = calls("error_body")
    assert bodies
    for where, call in bodies:
        # Or the type a GatewayError carries (checked above).
        error_type = call.args[1]
        assert member_of(error_type, ErrorType) or ast.unparse(error_type) == "self.error_type", where
    labelled = calls(".labels")
    rejections = [(where, call) for where, call in labelled if ast.unparse(call.func).endswith("rejections.labels")]
    assert rejections
    for where, call in rejections:
        reason = call.args[1]
        # Either spelled out, or the reason a GatewayError carries (checked above).
        assert member_of(reason, RefusalReason) or ast.unparse(reason) == "exc.reason", (
            f"{where}: {ast.unparse(reason)}"
        )


def test_a_refusal_must_say_why() -> None:
    from visioncap.gateway.errors import GatewayError

    with pytest.raises(TypeError, match="reason"):
        GatewayError(400, ErrorType.INVALID_REQUEST, "no reason given")  # type: ignore[call-arg]
    refused = GatewayError(429, ErrorType.QUEUE_FULL, "full", reason=RefusalReason.QUEUE_FULL)
    # The wire strings are the values: clients match the error type, dashboards the metric label.
    assert refused.response().body == (b'{"error":{"message":"full","type":"queue_full","param":null,"code":429}}')


OBJECTIVES = ObjectivesConfig(ttft_p99_ms=100, itl_p99_ms=20, window_s=10)
BACKGROUND = BackgroundConfig(max_concurrency=8, min_concurrency=1, max_image_tokens_in_flight=4000)
CONTROLLER = ControllerConfig(
    additive_increase=1,
    decrease_factor=0.5,
    idle_after_s=1.0,
    increase_interval_s=0,
    upstream_waiting_limit=0,
    upstream_running_limit=4,
)


def overload(controller: AdmissionController, at: float) -> None:
    """Interactive traffic meeting no objective: slow first tokens and gaps, vLLM over both of its limits."""
    controller.interactive_started(at)
    for i in range(20):
        controller.observe_itl(at + i / 100, 0.060)
        controller.observe_ttft(at + i / 100, 0.5)
    controller.observe_upstream(at + 0.2, waiting=5, running=20)


def every_kind_of_step(pacing: PacingConfig | None) -> list[Decision]:
    """Each step of one policy: idle, a decrease asked for by every objective at once, a hold for want of fresh
    evidence, a hold at the floor and an increase."""
    overloaded = AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER, start_limit=8, pacing=pacing)
    steps = [overloaded.tick(0.0, 0)]
    overload(overloaded, 1.0)
    steps += [overloaded.tick(1.5, 8), overloaded.tick(1.6, 8)]
    at_floor = pacing.model_copy(update={"start_per_s": pacing.min_per_s}) if pacing is not None else None
    floored = AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER, pacing=at_floor)
    overload(floored, 1.0)
    steps.append(floored.tick(1.5, 1))
    healthy = AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER, pacing=pacing)
    healthy.interactive_started(0.0)
    healthy.observe_itl(0.1, 0.005)
    healthy.observe_ttft(0.1, 0.01)
    steps.append(healthy.tick(0.2, 1, background_waiting=1))
    if pacing is not None and pacing.learn_rate:
        steps.append(learnt_step(pacing))
    return steps


def learnt_step(pacing: PacingConfig) -> Decision:
    """A pacer whose learnt model holds enough evidence that every frame start costs a gap above the objective."""
    settled = pacing.model_copy(update={"model_min_frames": 10, "model_min_gaps": 200, "evidence_z": 50.0})
    learner = AdmissionController(OBJECTIVES, BACKGROUND, CONTROLLER, pacing=settled)
    learner.interactive_started(0.0)
    learner.tick(0.0, 1)  # interactive time counts from the first tick
    for i in range(400):  # 2 s of 5 ms gaps; a frame start every 0.1 s, whose next gap is 60 ms
        if i % 20 == 0:
            learner.background_started(i * 0.005)
        learner.observe_itl(i * 0.005 + 0.005, 0.060 if i % 20 == 1 else 0.005)
        if i % 50 == 49:  # the controller's 0.25 s ticks
            step = learner.tick(i * 0.005 + 0.005, 1, background_waiting=1)
            if step.learnt is not None:
                return step  # the first step with an estimate: 10 starts/s, 5 % above, 0.7 % allows 1.4/s
    raise AssertionError("the model never had enough evidence")


@pytest.mark.parametrize(
    "pacing", [None, PacingConfig(min_fresh_gaps=10, evidence_z=0, first_token_hold_s=0)], ids=["limit", "pacing"]
)
def test_controller_steps_speak_the_action_and_violation_vocabularies(pacing: PacingConfig | None) -> None:
    steps = every_kind_of_step(pacing)
    learnt = [Action.LEARNT] if pacing is not None else []
    assert [step.action for step in steps] == [
        Action.IDLE,
        Action.DECREASE,
        Action.HOLD,
        Action.HOLD,
        Action.INCREASE,
        *learnt,
    ]
    assert all(type(step.action) is Action for step in steps)
    assert set(steps[1].reasons) == set(steps[3].reasons) == set(Violation)
    assert all(type(reason) is Violation for step in steps for reason in step.reasons)
    metrics = GatewayMetrics(["vllm"])
    for step in steps:
        metrics.decision("vllm", step)
    assert counted(metrics, "visioncap_gateway_controller_decisions") == {
        Action.IDLE: 1.0,
        Action.DECREASE: 1.0,
        Action.HOLD: 2.0,
        Action.INCREASE: 1.0,
        Action.LEARNT: float(len(learnt)),  # the limit policy has no learnt rate
    }
    # A hold at the floor was asked for by the same misses, but only a decrease counts them.
    assert counted(metrics, "visioncap_gateway_controller_decreases") == dict.fromkeys(values(Violation), 1.0)


def counted(metrics: GatewayMetrics, family_name: str) -> dict[str, float]:
    return {
        next(value for label, value in sample.labels.items() if label != "upstream"): sample.value
        for family in metrics.registry.collect()
        if family.name == family_name
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def test_the_controller_series_start_at_zero_for_every_value() -> None:
    metrics = GatewayMetrics(["vllm"])
    assert counted(metrics, "visioncap_gateway_controller_decisions") == dict.fromkeys(values(Action), 0.0)
    assert counted(metrics, "visioncap_gateway_controller_decreases") == dict.fromkeys(values(Violation), 0.0)


# -- the caption image mode ----------------------------------------------------------------------------------


def test_the_image_mode_is_validated_against_its_values() -> None:
    assert CaptionConfig.model_validate({"image_mode": "boxes"}).image_mode is ImageMode.BOXES  # as YAML gives it
    assert CaptionConfig().image_mode is ImageMode.FULL
    with pytest.raises(ValidationError) as refused:
        CaptionConfig.model_validate({"image_mode": "zoom"})
    message = str(refused.value)
    assert "image_mode" in message and all(f"'{mode}'" in message for mode in ImageMode)
    assert CaptionConfig.model_json_schema()["$defs"]["ImageMode"]["enum"] == values(ImageMode)


def test_compose_takes_only_an_image_mode() -> None:
    frame = np.zeros((40, 60, 3), np.uint8)
    people = (PersonBox(10, 10, 20, 30, 0.9, 0),)
    assert compose(frame, people, ImageMode.CROP).shape[:2] == (26, 14)
    with pytest.raises(ValueError, match="unknown image mode"):
        compose(frame, people, "zoom")  # type: ignore[arg-type]
