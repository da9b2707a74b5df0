"""/v1/alerts: what fired (with its deliveries), and the rules (those of the alerts file read-only)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, cast

from fastapi import APIRouter, Depends, Path, Query, Request
from starlette.responses import Response

from visioncap.alerts import store
from visioncap.alerts.decisions import (
    AlertDecision,
    AlertDecisionPage,
    Answer,
    DecisionFilter,
    firing_decisions,
    list_decisions,
)
from visioncap.api.auth import EVERY_CAMERA, CameraScope, camera_scope
from visioncap.api.cursors import decode_alert_cursor, encode_alert_cursor
from visioncap.api.errors import ApiError, bad_param
from visioncap.api.protocol import (
    Alert,
    AlertDelivery,
    AlertPage,
    AlertRuleList,
    AlertRuleView,
    AlertVerification,
    ErrorResponse,
)
from visioncap.api.routers.captions import Time
from visioncap.api.routers.common import BAD_BODY, ERRORS, SECURED, Responses, SharedPathRoute, service
from visioncap.api.serving import MAX_CAMERA_LENGTH, MAX_CAMERAS, MAX_ID, ApiService, checked_names
from visioncap.config.alerts import NAME_PATTERN, AlertRule, AlertRulePatch, AlertsConfig
from visioncap.store.records import DeliveryState

router = APIRouter(
    prefix="/v1/alerts", tags=["alerts"], dependencies=SECURED, responses=ERRORS, route_class=SharedPathRoute
)

RuleName = Annotated[str, Path(pattern=NAME_PATTERN, description="Rule name.")]
MAX_RULE_FILTERS = 50  # `rule=` repeated: more names than any alerts file holds is a hostile query
RULE_NAME_LENGTH = 64  # NAME_PATTERN's: a longer name matches nothing, refused before the database
RULE_ERRORS: Responses = {
    404: {"model": ErrorResponse, "description": "No rule of that name."},
    409: {"model": ErrorResponse, "description": "A rule of that name exists, or the rule is the file's."},
}
BODY_ERRORS: Responses = {
    **RULE_ERRORS,
    **BAD_BODY,
    403: {
        "model": ErrorResponse,
        "description": "The key lacks the write scope, or is limited to some cameras and the rule's `cameras` does "
        "not name only those (`param`: cameras).",
    },
}


def file_config(request: Request) -> AlertsConfig | None:
    return cast(AlertsConfig | None, request.app.state.alerts_config)


def _utc(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


def _cursor(cursor: str | None) -> int | None:
    return None if cursor is None else decode_alert_cursor(cursor)


def _next_cursor(alert_id: int) -> str:
    return encode_alert_cursor(alert_id)


def _rules(values: list[str]) -> list[str]:
    return checked_names(values, "rule", MAX_RULE_FILTERS, RULE_NAME_LENGTH)


def _cameras(values: list[str]) -> list[str]:
    return checked_names(values, "camera", MAX_CAMERAS, MAX_CAMERA_LENGTH)


def _verification(decision: AlertDecision | None) -> AlertVerification | None:
    if decision is None:
        return None
    return AlertVerification(decision_id=decision.id, question=decision.question, reason=decision.reason)


@router.get("", response_model=AlertPage, summary="Alerts that fired, newest first")
def list_alerts(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    rule: Annotated[list[str], Query(description="Rule name; repeat for several.")] = [],  # noqa: B006
    camera: Annotated[list[str], Query(description="Camera id; repeat for several.")] = [],  # noqa: B006
    since: Annotated[Time, Query(description="Captured at or after (ISO 8601; no offset means UTC).")] = None,
    until: Annotated[Time, Query(description="Captured before (ISO 8601; no offset means UTC).")] = None,
    state: Annotated[
        DeliveryState | None, Query(description="Only alerts with at least one delivery in this state.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    cursor: Annotated[str | None, Query(max_length=40, description="`next_cursor` of the previous page.")] = None,
) -> AlertPage:
    after = _cursor(cursor)
    rule, camera = _rules(rule), _cameras(camera)
    visible = scope.narrow(camera)
    if visible is None:  # only cameras the key may not see: as for cameras that do not exist
        return AlertPage(items=[], next_cursor=None)
    where = store.AlertFilter(rule, visible, _utc(since), _utc(until), state, after)
    found = store.list_alerts(api.engine, where, limit)
    fired_by = firing_decisions(api.engine, [(alert.id, alert.rule, alert.caption_id) for alert, _ in found])
    items = [
        Alert(
            id=alert.id,
            rule=alert.rule,
            camera=alert.camera,
            caption_id=alert.caption_id,
            captured_at=alert.captured_at,
            fired_at=alert.fired_at,
            caption=alert.caption,
            people_count=alert.people_count,
            deliveries=[
                AlertDelivery(
                    id=d.id,
                    destination=d.destination,
                    state=d.state,
                    attempts=d.attempts,
                    last_error=d.last_error,
                    finished_at=d.finished_at,
                )
                for d in deliveries
            ],
            verification=_verification(fired_by.get(alert.id)),
        )
        for alert, deliveries in found
    ]
    return AlertPage(items=items, next_cursor=_next_cursor(items[-1].id) if len(items) == limit else None)


@router.get(
    "/rules",
    response_model=AlertRuleList,
    summary="Alert rules: the file's (read-only), then the API's",
    description="A key limited to some cameras sees only the rules whose `cameras` it names, all of them its own "
    "(a rule without `cameras` watches every camera: not a limited key's).",
)
def list_rules(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    config: Annotated[AlertsConfig | None, Depends(file_config)],
) -> AlertRuleList:
    file_rules = list(config.rules) if config else []
    names = {rule.name for rule in file_rules}
    items = [
        AlertRuleView(rule=rule, source="file", read_only=True) for rule in file_rules if scope.covers(rule.cameras)
    ]
    # A short list, not a page: leaving out the rules of other cameras here loses nothing.
    items += [
        AlertRuleView(rule=rule, source="api", read_only=False)
        for rule in store.api_rules(api.engine)
        if rule.name not in names and scope.covers(rule.cameras)
    ]
    return AlertRuleList(items=items, destinations=config.destination_names() if config else None)


def _checked(rule: AlertRule, config: AlertsConfig | None, scope: CameraScope) -> AlertRule:
    if not scope.covers(rule.cameras):
        raise ApiError(
            403,
            "this API key may only make rules for its own cameras: name them (and only them) in `cameras`",
            param="cameras",
        )
    if rule.verify is not None and rule.verify.force_answer is not None:
        # A test hook of the alerts file: through the API it would let a key decide the VLM's verdict.
        raise bad_param("verify.force_answer", "is for tests, in the alerts file only; not accepted through the API")
    if config is not None:
        unknown = sorted(set(rule.notify) - set(config.destination_names()))
        if unknown:
            raise bad_param("notify", f"no such destinations in the alerts file: {unknown}")
    return rule


def _file_rule(config: AlertsConfig | None, name: str, scope: CameraScope) -> bool:
    """Whether `name` is a rule of the file that `scope` sees (one it does not see is as unknown as no rule)."""
    return config is not None and any(rule.name == name and scope.covers(rule.cameras) for rule in config.rules)


def _api_rule(api: ApiService, name: str, scope: CameraScope) -> AlertRule:
    """The API's rule `name`; 404 also for one of cameras `scope` does not cover."""
    found = next((rule for rule in store.api_rules(api.engine) if rule.name == name), None)
    if found is None or not scope.covers(found.cameras):
        raise ApiError(404, f"no rule named {name!r}")
    return found


@router.post(
    "/rules",
    response_model=AlertRuleView,
    status_code=201,
    summary="Add a rule (write scope)",
    description="The alerts process applies it from its next page of captions on.",
    responses=BODY_ERRORS,
)
def add_rule(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    config: Annotated[AlertsConfig | None, Depends(file_config)],
    rule: AlertRule,
) -> AlertRuleView:
    # Rule names are one namespace: a limited key learns that a name is taken, never the rule itself.
    if _file_rule(config, rule.name, EVERY_CAMERA) or not store.add_rule(api.engine, _checked(rule, config, scope)):
        raise ApiError(409, f"a rule named {rule.name!r} exists", param="name")
    return AlertRuleView(rule=rule, source="api", read_only=False)


@router.patch(
    "/rules/{name}",
    response_model=AlertRuleView,
    summary="Change some fields of a rule (write scope)",
    responses=BODY_ERRORS,
)
def patch_rule(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    config: Annotated[AlertsConfig | None, Depends(file_config)],
    name: RuleName,
    changes: AlertRulePatch,  # type: ignore[valid-type]
) -> AlertRuleView:
    if _file_rule(config, name, scope):
        raise ApiError(409, f"rule {name!r} is the alerts file's: change it there")
    current = _api_rule(api, name, scope)
    # Validated field by field already (the patch has the rule's constraints): this cannot fail.
    rule = AlertRule.model_validate({**current.model_dump(), **changes.model_dump(exclude_unset=True)})  # type: ignore[attr-defined]
    if not store.replace_rule(api.engine, _checked(rule, config, scope)):
        raise ApiError(404, f"no rule named {name!r}")
    return AlertRuleView(rule=rule, source="api", read_only=False)


@router.delete("/rules/{name}", status_code=204, summary="Delete a rule (write scope)", responses=RULE_ERRORS)
def delete_rule(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    config: Annotated[AlertsConfig | None, Depends(file_config)],
    name: RuleName,
) -> Response:
    if _file_rule(config, name, scope):
        raise ApiError(409, f"rule {name!r} is the alerts file's: change it there")
    if scope.limited:
        _api_rule(api, name, scope)
    if not store.delete_rule(api.engine, name):
        raise ApiError(404, f"no rule named {name!r}")
    return Response(status_code=204)


@router.get(
    "/decisions",
    response_model=AlertDecisionPage,
    summary="Watch rules' decisions (the VLM's answers), newest first",
    description="A key limited to some cameras sees only those cameras' decisions.",
)
def list_alert_decisions(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    rule: Annotated[list[str], Query(description="Rule name; repeat for several.")] = [],  # noqa: B006
    camera: Annotated[list[str], Query(description="Camera id; repeat for several.")] = [],  # noqa: B006
    answer: Annotated[
        list[Answer], Query(description="match, no_match or error (no answer); repeat for several.")
    ] = [],  # noqa: B006
    caption_id: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="Only the questions about this caption.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Page size.")] = 50,
    # Bounded as the ids are (INTEGER on PostgreSQL): a larger number would reach the database and fail there.
    before: Annotated[int | None, Query(ge=1, le=MAX_ID, description="`next_cursor` of the previous page.")] = None,
) -> AlertDecisionPage:
    rule, camera = _rules(rule), _cameras(camera)
    visible = scope.narrow(camera)
    if visible is None:  # only cameras the key may not see: as for cameras that do not exist
        return AlertDecisionPage(items=[], next_cursor=None)
    where = DecisionFilter(rule, visible, answer, caption_id, before)
    return list_decisions(api.engine, where, limit)
