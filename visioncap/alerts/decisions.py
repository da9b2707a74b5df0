"""The watch rules' decisions: one row per question the VLM was asked (or failed to answer), kept for the API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field
from sqlalchemy import ColumnElement, Connection, Engine, insert, or_, select

from visioncap.store.records import AlertDecisionRecord, table_of
from visioncap.store.safety import MAX_ERROR_CHARS, clean_text

# The table is the store's (retention deletes decisions with their captions' age); this module writes and lists it.
DECISIONS = table_of(AlertDecisionRecord)


def create_table(conn: Connection) -> None:
    """Schema migration step: the decisions table."""
    DECISIONS.create(conn, checkfirst=True)


def add_decision(conn: Connection, values: dict[str, object]) -> int:
    """One decision; its texts made storable (the reason is model output: a NUL in it, which the JSON of a guided
    answer may carry, would fail the insert on PostgreSQL and so the alerts engine's page, again at each retry)."""
    if values.get("error") is not None:
        values = {**values, "error": clean_text(str(values["error"]), MAX_ERROR_CHARS)}
    for name in ("question", "reason"):
        if values.get(name) is not None:
            values = {**values, name: clean_text(str(values[name]))}
    return int(conn.execute(insert(DECISIONS).values(**values).returning(DECISIONS.c.id)).scalar_one())


class AlertDecision(BaseModel):
    """One question a watch rule asked the VLM about one caption, and its answer."""

    id: int = Field(description="Decision id (newest first in a page).")
    rule: str = Field(description="The watch rule.")
    caption_id: int = Field(description="The caption asked about.")
    camera: str = Field(description="Its camera.")
    captured_at: datetime = Field(description="Its capture time.")
    question: str = Field(description="The rule's question at the time.")
    frames: int = Field(description="Stored frames sent with the question.")
    match: bool | None = Field(description="The answer; null when there was none (see `error`).")
    reason: str | None = Field(description="The model's reason.")
    latency_ms: float | None = Field(description="From the request to the answer.")
    prompt_tokens: int | None = Field(description="Prompt tokens (frames included), as the server counted them.")
    completion_tokens: int | None = Field(description="Tokens of the answer.")
    error: str | None = Field(description="Why there is no answer: the VLM unreachable, the deadline passed, ...")
    alert_id: int | None = Field(description="The alert this decision fired; null: none (no match, or cooling).")
    decided_at: datetime = Field(description="When the answer (or the error) came.")


class AlertDecisionPage(BaseModel):
    """A page of decisions, newest first."""

    items: list[AlertDecision] = Field(description="The decisions.")
    next_cursor: int | None = Field(description="Pass as `before` for the next page; null: no more.")


def firing_decisions(engine: Engine, alerts: Sequence[tuple[int, str, int]]) -> dict[int, AlertDecision]:
    """The decision that fired each of `alerts` (id, rule, caption id), by alert id; alerts of rules that ask no
    question are absent. The rule and caption narrow the search through their index."""
    if not alerts:
        return {}
    query = select(DECISIONS).where(
        DECISIONS.c.rule.in_(sorted({rule for _, rule, _ in alerts})),
        DECISIONS.c.caption_id.in_(sorted({caption for _, _, caption in alerts})),
        DECISIONS.c.alert_id.in_([alert for alert, _, _ in alerts]),
    )
    with engine.connect() as conn:
        found = [AlertDecision.model_validate(dict(row._mapping)) for row in conn.execute(query)]
    return {decision.alert_id: decision for decision in found if decision.alert_id is not None}


class Answer(StrEnum):
    """How a question ended, as `GET /v1/alerts/decisions?answer=` filters it."""

    MATCH = "match"  # the VLM said yes (and the alert fired, unless cooling)
    NO_MATCH = "no_match"  # the VLM said no
    ERROR = "error"  # no answer: `error` says why


@dataclass(frozen=True)
class DecisionFilter:
    """Which decisions a page lists; an empty sequence or None: no condition."""

    rules: Sequence[str] = ()
    cameras: Sequence[str] = ()
    answers: Sequence[Answer] = ()
    caption_id: int | None = None
    before: int | None = None  # ids below this (the previous page's `next_cursor`)


def _answered(answer: Answer) -> ColumnElement[bool]:
    if answer is Answer.ERROR:
        return DECISIONS.c.match.is_(None)
    return DECISIONS.c.match.is_(answer is Answer.MATCH)


def list_decisions(engine: Engine, where: DecisionFilter, limit: int) -> AlertDecisionPage:
    """Newest first."""
    query = select(DECISIONS).order_by(DECISIONS.c.id.desc()).limit(limit)
    if where.rules:
        query = query.where(DECISIONS.c.rule.in_(list(where.rules)))
    if where.cameras:
        query = query.where(DECISIONS.c.camera.in_(list(where.cameras)))
    if where.answers:
        query = query.where(or_(*(_answered(answer) for answer in set(where.answers))))
    if where.caption_id is not None:
        query = query.where(DECISIONS.c.caption_id == where.caption_id)
    if where.before is not None:
        query = query.where(DECISIONS.c.id < where.before)
    with engine.connect() as conn:
        items = [AlertDecision.model_validate(dict(row._mapping)) for row in conn.execute(query)]
    return AlertDecisionPage(items=items, next_cursor=items[-1].id if len(items) == limit else None)
