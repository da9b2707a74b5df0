"""Response models of the API; every model and field is described (they make the OpenAPI document)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import to_json
from sqlalchemy import Row

from visioncap import __version__
from visioncap.config.alerts import AlertRule
from visioncap.frames import SelectionReason
from visioncap.redact import mask_credentials, mask_urls
from visioncap.store.camera_configs import StoredCamera
from visioncap.store.cameras import CameraReport
from visioncap.store.records import CameraOrigin, CameraState, CaptionRecord, CaptionStatus, DeliveryState
from visioncap.store.search import CameraSummary, CaptionRow


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Box(_Model):
    """One detected person, in pixels of the camera frame (not of the stored image)."""

    x1: float = Field(description="Left edge.")
    y1: float = Field(description="Top edge.")
    x2: float = Field(description="Right edge.")
    y2: float = Field(description="Bottom edge.")
    confidence: float = Field(description="Detector confidence, 0..1.")
    class_id: int | None = Field(default=None, description="Detector class of the person.")
    track_id: int | None = Field(default=None, description="Tracker id of the person within its camera.")


class ZoneStay(_Model):
    """A person of the frame standing in a zone (the bottom-centre of their box), and for how long so far."""

    zone: str = Field(description="The zone's name (the selection config's `zones`).")
    track_id: int = Field(description="Tracker id of the person.")
    dwell_s: float = Field(description="Seconds the person had been in the zone when the frame was captured.")


class DescriptionFrame(_Model):
    """A frame an event description was written from."""

    role: str = Field(
        description="Why the frame was kept: first (first seen), best, last (last seen), zone:<name> (entered the "
        "zone there); several joined by + when one frame is more than one."
    )
    frame_index: int = Field(description="Index of the frame in its source.")
    offset_s: float = Field(description="Seconds from the start of the source.")
    width: int = Field(description="Width of the JPEG sent, in pixels.")
    height: int = Field(description="Height of the JPEG sent, in pixels.")
    image_tokens: int = Field(description="Image tokens the frame cost, as estimated before the request.")
    image_url: str = Field(description="Path of the frame's image (the image route with `frame`).")


class Caption(_Model):
    """One selected frame and what became of it (a row of the outbox); or, with reason event-end, the description
    of a whole event written from several of its frames."""

    id: int = Field(description="Caption id; stable, used by every /v1/captions/{id} route.")
    camera: str = Field(description="Camera id from the pipeline file.")
    pipeline: str = Field(description="Name of the pipeline that selected the frame.")
    source: str = Field(
        description="The camera's file path or URL (credentials masked: user:***@, pwd=***, token=***)."
    )
    captured_at: datetime = Field(description="When the frame was captured (UTC, ISO 8601).")
    frame_index: int = Field(description="Index of the frame in its source.")
    offset_s: float = Field(description="Seconds from the start of the source.")
    reason: SelectionReason = Field(
        description="Why the frame was selected: new-event (a person became stable), people-left (people it was "
        "described with left), movement (a person moved far), zone-entry (a person entered a zone), zone-dwell (a "
        "person stayed in a zone for its loiter_s), recaption (the recaption interval passed), stream-end (held "
        "back by the rate limits until its stream ended) or event-end (a description of the whole event once it "
        "ended, from the frames listed in `frames`)."
    )
    event_key: str = Field(description="The person event the frame describes.")
    event_ids: list[int] = Field(description="Track ids of the people the frame describes.")
    score: float = Field(description="Frame quality score used to choose it.")
    people_count: int = Field(description="People detected in the frame.")
    boxes: list[Box] = Field(description="The detected people.")
    zones: list[ZoneStay] = Field(
        description="The zones the frame's people stood in, each person's stay so far; empty without zones."
    )
    status: CaptionStatus = Field(description="pending, captioned, failed (refused for good) or skipped.")
    caption: str | None = Field(description="The caption text; null until captioned.")
    structured: dict[str, Any] | None = Field(description="Structured caption (JSON mode), when the pipeline asks.")
    error: str | None = Field(description="Why the row failed or was skipped, or the last transient error.")
    model: str = Field(description="The VLM that captioned (or will caption) the frame.")
    prompt_tokens: int | None = Field(description="Prompt tokens the VLM counted, image tokens included.")
    completion_tokens: int | None = Field(description="Tokens of the caption.")
    image_tokens: int = Field(description="Image tokens sent, as estimated before the call.")
    latency_ms: float | None = Field(description="VLM request time of the successful attempt.")
    attempts: int = Field(description="Caption attempts so far.")
    image_width: int = Field(description="Width of the stored JPEG in pixels.")
    image_height: int = Field(description="Height of the stored JPEG in pixels.")
    image_url: str | None = Field(description="Path of the image route; null when no image was stored.")
    created_at: datetime = Field(description="When the row was written (UTC).")
    updated_at: datetime = Field(description="When the row last changed (UTC).")
    similarity: float | None = Field(
        default=None,
        description="Search by meaning (`semantic`) only: cosine similarity of the caption to the search text "
        "(-1..1, higher is closer); why the row was found. Null elsewhere.",
    )
    matched_words: list[str] | None = Field(
        default=None,
        description="Hybrid search only: the words of the search text (stop words left out) that the caption "
        "matched by full-text search (stemmed; the last word also as a prefix). Null elsewhere.",
    )
    frames: list[DescriptionFrame] | None = Field(
        default=None,
        description="An event description (reason event-end) only: the frames it was written from, oldest first, "
        "sent as the images of one request; `image_url` is the best of them. Null for a frame's caption.",
    )

    @classmethod
    def of(cls, row: CaptionRecord | CaptionRow) -> Caption:
        return cls.model_validate(caption_fields(row))


_BOX_FIELDS = tuple(Box.model_fields)
_ZONE_FIELDS = tuple(ZoneStay.model_fields)
_RECORD_KEYS = tuple(column.key for column in CaptionRecord.__table__.c)


def caption_fields(record: CaptionRecord | CaptionRow) -> dict[str, Any]:
    """A stored row as the fields of `Caption`: the one mapping from the table to the API's shape."""
    # A dict, once per row: attribute access on a Row costs a lookup each, 28 per row, 50 rows a page.
    row = record._asdict() if isinstance(record, Row) else {key: getattr(record, key) for key in _RECORD_KEYS}
    return {
        "id": row["id"],
        "camera": row["camera"],
        "pipeline": row["pipeline"],
        # The pipeline stores sources masked; rows written before it masked query parameters may still hold them.
        "source": mask_credentials(row["source"]),
        "captured_at": row["captured_at"],
        "frame_index": row["frame_index"],
        "offset_s": row["offset_s"],
        "reason": row["reason"],
        "event_key": row["event_key"],
        "event_ids": list(row["event_ids"] or []),
        "score": row["score"],
        "people_count": row["people_count"],
        # The pipeline stores more per person than a box (e.g. keypoints); the API shows the box.
        "boxes": [{name: person[name] for name in _BOX_FIELDS if name in person} for person in row["people"] or []],
        "zones": [{name: stay[name] for name in _ZONE_FIELDS} for stay in row.get("zones") or []],
        "status": row["status"],
        "caption": row["caption"],
        "structured": row["structured"],
        "error": row["error"],
        "model": row["model"],
        "prompt_tokens": row["prompt_tokens"],
        "completion_tokens": row["completion_tokens"],
        "image_tokens": row["image_tokens"],
        "latency_ms": row["latency_ms"],
        "attempts": row["attempts"],
        "image_width": row["image_width"],
        "image_height": row["image_height"],
        "image_url": f"/v1/captions/{row['id']}/image" if row["image_path"] else None,
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        # A search's why (caption_page_json fills them in): null on every route otherwise, as the model says.
        "similarity": None,
        "matched_words": None,
        "frames": _description_frames(row["id"], row.get("frames")),
    }


_FRAME_FIELDS = ("role", "frame_index", "offset_s", "width", "height", "image_tokens")


def _description_frames(row_id: int, frames: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """An event description's frames as the API shows them; an entry the pipeline would not write (a row written
    by something else) is left out rather than failing the page, and the others keep their numbers."""
    if not isinstance(frames, list) or not frames:
        return None
    return [
        {**{name: frame[name] for name in _FRAME_FIELDS}, "image_url": f"/v1/captions/{row_id}/image?frame={number}"}
        for number, frame in enumerate(frames)
        if isinstance(frame, dict) and all(name in frame for name in _FRAME_FIELDS)
    ] or None


class CaptionPage(_Model):
    """One page of captions, newest first."""

    items: list[Caption] = Field(description="The captions of this page.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
    limit: int = Field(description="The page size used.")
    partial: bool = Field(
        description="True when the search stopped at its scan bound (VISIONCAP_API_SEARCH_SCAN_ROWS) before the "
        "page was full: `items` may be fewer than `limit`, or none, and yet older captions may match, so follow "
        "`next_cursor`, which carries on from where the search stopped. A page is the last only when "
        "`next_cursor` is null."
    )


def caption_page_json(
    rows: Sequence[CaptionRow],
    next_cursor: str | None,
    limit: int,
    partial: bool = False,
    explanations: Sequence[dict[str, Any]] | None = None,
) -> bytes:
    """A `CaptionPage` as JSON, straight from the rows.

    Pages are the API's hot path: validating 50 rows into models (and FastAPI validating the returned model
    again) cost several times the query. The rows come from our own table, and the tests check that these
    bytes validate as a `CaptionPage` and equal what `Caption.of` makes of the same rows.
    """
    items = [caption_fields(row) for row in rows]
    for item, explained in zip(items, explanations or (), strict=False):  # a search by meaning's why
        item.update(explained)
    return to_json({"items": items, "next_cursor": next_cursor, "limit": limit, "partial": partial})


class StatusCounts(_Model):
    """Rows of one camera by status."""

    pending: int = Field(description="Waiting for a caption.")
    captioned: int = Field(description="Captioned.")
    failed: int = Field(description="Refused by the VLM for good.")
    skipped: int = Field(description="Never sent (coalesced, queue full, too old).")


class CameraSettings(_Model):
    """A camera's stored configuration, as a worker runs it; secrets masked (they are never stored)."""

    camera: str = Field(description="Camera id.")
    pipeline: str = Field(description="The pipeline whose worker runs the camera.")
    source: dict[str, Any] = Field(description="The source config (as in a pipeline file), its URL masked.")
    selection: dict[str, Any] = Field(description="Selection settings that replace the pipeline's.")
    caption: dict[str, Any] = Field(description="Image settings that replace the pipeline's.")
    paused: bool = Field(description="Whether the camera is paused (kept, not read).")
    origin: CameraOrigin = Field(description="`file` (seeded from a pipeline file) or `api`.")
    version: int = Field(description="Bumped on every change; a running worker applies a change within seconds.")
    created_at: datetime = Field(description="When the camera was configured (UTC).")
    updated_at: datetime = Field(description="When its configuration last changed (UTC).")

    @classmethod
    def of(cls, stored: StoredCamera) -> CameraSettings:
        source = stored.config.source.model_dump(mode="json")
        if isinstance(source.get("url"), str):
            source["url"] = mask_credentials(source["url"])
        return cls(
            camera=stored.camera,
            pipeline=stored.config.pipeline,
            source=source,
            selection=stored.config.selection,
            caption=stored.config.caption,
            paused=stored.config.paused,
            origin=stored.origin,
            version=stored.version,
            created_at=stored.created_at,
            updated_at=stored.updated_at,
        )


class Camera(_Model):
    """What the database knows of one camera: the state its pipeline last reported, and its stored rows."""

    camera: str = Field(description="Camera id.")
    state: CameraState | None = Field(
        description="As the pipeline last reported it: starting, online (frames arrive), reconnecting, offline "
        "(still failing at the longest retry interval), finished (stopped or its file ended), failed (a file or "
        "folder that could not be read). Null when no pipeline has reported the camera. A pipeline that was "
        "killed leaves its last state: compare `reported_at` with the time."
    )
    state_since: datetime | None = Field(description="When the camera entered `state` (UTC).")
    error: str | None = Field(description="Why the camera failed, when `state` is failed.")
    pipeline: str | None = Field(description="Name of the pipeline that last reported the camera.")
    reported_at: datetime | None = Field(
        description="When the pipeline last wrote this camera's state (UTC): on every state change, and every "
        "few seconds while frames arrive."
    )
    frames_analysed: int | None = Field(description="Frames the detector ran on in the reporting run.")
    last_frame_at: datetime | None = Field(
        description="Capture time of the newest frame known (UTC): the newest the pipeline analysed (reported "
        "every few seconds) or the newest stored row, whichever is later."
    )
    last_caption_at: datetime | None = Field(description="Capture time of its newest captioned frame (UTC).")
    events: int = Field(description="Distinct person events with a stored frame.")
    captions: int = Field(description="Stored rows, all statuses.")
    by_status: StatusCounts = Field(description="Stored rows by status.")
    config: CameraSettings | None = Field(
        default=None, description="What a worker is asked to run for this camera; null when it is not configured."
    )

    @classmethod
    def of(
        cls,
        camera: str,
        summary: CameraSummary | None,
        report: CameraReport | None,
        stored: StoredCamera | None = None,
    ) -> Camera:
        summary = summary or CameraSummary(camera)
        counts = StatusCounts(**{status: summary.by_status.get(status, 0) for status in CaptionStatus})
        frame_times = [t for t in (summary.last_frame_at, report.last_frame_at if report else None) if t is not None]
        return cls(
            camera=camera,
            # A state some other (newer) writer stored reads as None: shown as unknown, the list still answers.
            state=report.state if report else None,
            state_since=report.state_since if report else None,
            error=mask_urls(report.error) if report and report.error is not None else None,
            pipeline=report.pipeline if report else None,
            reported_at=report.reported_at if report else None,
            frames_analysed=report.frames_analysed if report else None,
            last_frame_at=max(frame_times) if frame_times else None,
            last_caption_at=summary.last_caption_at,
            events=summary.events,
            captions=sum(summary.by_status.values()),
            by_status=counts,
            config=CameraSettings.of(stored) if stored else None,
        )


class CameraList(_Model):
    """Every camera configured, reported by a pipeline or with at least one stored row, by name."""

    items: list[Camera] = Field(description="The cameras.")


class Regenerated(_Model):
    """A caption put back in the outbox."""

    id: int = Field(description="The caption id.")
    status: Literal[CaptionStatus.PENDING] = Field(description="Always pending: waiting for the pipeline.")
    detail: str = Field(description="When the new caption will come.")


class Check(_Model):
    """One readiness check."""

    ok: bool = Field(description="Whether the dependency answered.")
    detail: str = Field(description="What was checked, or why it failed.")


class Health(_Model):
    """Liveness: the process answers."""

    status: Literal["ok"] = Field(description="Always ok.")
    version: str = Field(default=__version__, description="The visioncap version this server runs.")


class Readiness(_Model):
    """Readiness: the dependencies answer."""

    status: Literal["ready", "unavailable"] = Field(description="ready when every check is ok.")
    version: str = Field(default=__version__, description="The visioncap version this server runs.")
    checks: dict[str, Check] = Field(
        description="By dependency: database, vlm, ask (the VLM serves the model Ask asks for); and, with "
        "semantic search on, semantic (always ok: how it ranks on this database, and whether the background "
        "embedder has caught up)."
    )


class ErrorDetail(_Model):
    """What went wrong."""

    message: str = Field(description="Human-readable message; names the parameter for bad input.")
    type: str = Field(
        description="authentication_error, permission_error, invalid_request_error, not_found, conflict, "
        "unavailable, search_timeout, ..."
    )
    param: str | None = Field(description="The request parameter at fault, if any.")
    code: int = Field(description="The HTTP status.")


class ErrorResponse(_Model):
    """Every error answer has this shape."""

    error: ErrorDetail = Field(description="The error.")


# --- Alerts ---


class AlertRuleView(_Model):
    """A rule and where it comes from."""

    rule: AlertRule = Field(description="The rule.")
    source: Literal["file", "api"] = Field(
        description="`file`: the alerts file (VISIONCAP_ALERTS_CONFIG), read-only here; `api`: made through this API."
    )
    read_only: bool = Field(description="True for rules of the file: PATCH and DELETE answer 409.")


class AlertRuleList(_Model):
    """Every rule, the file's first."""

    items: list[AlertRuleView] = Field(description="The rules.")
    destinations: list[str] | None = Field(
        default=None,
        description="The names a rule may list in `notify` (the alerts file's webhooks, then its MQTT broker); "
        "null: this API was given no alerts file (VISIONCAP_ALERTS_CONFIG), so `notify` is not checked here.",
    )


class AlertDelivery(_Model):
    """One message of an alert to one destination."""

    id: int = Field(description="Delivery id; the `Idempotency-Key` of its webhook requests.")
    destination: str = Field(description="Destination name from the alerts file.")
    state: DeliveryState = Field(description="pending (not yet acknowledged), delivered, or failed (given up).")
    attempts: int = Field(description="Attempts so far.")
    last_error: str | None = Field(description="Why the last attempt failed; null after a success.")
    finished_at: datetime | None = Field(description="When it was delivered or given up (UTC).")


class AlertVerification(_Model):
    """What a watch rule asked the VLM about the caption, and the reason of its `match` answer."""

    decision_id: int = Field(description="The decision that fired the alert (/v1/alerts/decisions).")
    question: str = Field(description="The rule's question when it was asked.")
    reason: str | None = Field(description="The model's reason for its match.")


class Alert(_Model):
    """A rule that fired on a caption."""

    id: int = Field(description="Alert id.")
    rule: str = Field(description="Rule name.")
    camera: str = Field(description="Camera id.")
    caption_id: int = Field(description="The caption that fired it (/v1/captions/{id}).")
    captured_at: datetime = Field(description="Capture time of the caption (UTC).")
    fired_at: datetime = Field(description="When the rule fired (UTC).")
    caption: str = Field(description="The caption text.")
    people_count: int = Field(description="People in the frame.")
    deliveries: list[AlertDelivery] = Field(description="Its messages, one per destination.")
    verification: AlertVerification | None = Field(
        default=None, description="A watch rule's alert: the question and the VLM's reason; null for other rules."
    )


class AlertPage(_Model):
    """One page of alerts, newest first."""

    items: list[Alert] = Field(description="The alerts of this page.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


# -- Ask: POST /v1/chat/completions (a subset of OpenAI's chat completions, and the `visioncap` field) ----------


class _ChatIn(BaseModel):
    # Fields of OpenAI's request this API does not use (top_p, user, stream_options, ...) are ignored, not refused:
    # chat UIs send them.
    model_config = ConfigDict(extra="ignore")


class ChatTextPart(_ChatIn):
    """A text part of a message's content (image parts are refused: questions are text)."""

    type: Literal["text"] = Field(description="Only `text`.")
    text: str = Field(description="The text.")


class ChatMessage(_ChatIn):
    """One turn of the conversation."""

    role: Literal["system", "user", "assistant"] = Field(
        description="`user` and `assistant` turns are kept (the last must be `user`: the question); `system` "
        "messages are dropped, the API writes its own."
    )
    content: str | list[ChatTextPart] = Field(description="Text, or a list of text parts (joined by newlines).")

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)


class ChatRequest(_ChatIn):
    """An OpenAI chat completions request, of which these fields are used."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"model": "visioncap-ask", "messages": [{"role": "user", "content": "Who came to the door today?"}]},
                {
                    "model": "visioncap-ask",
                    "stream": True,
                    "max_tokens": 200,
                    "messages": [
                        {"role": "user", "content": "Was there a delivery yesterday after 6 pm?"},
                        {"role": "assistant", "content": "Yes: a courier left a parcel at 18:40 [12]."},
                        {"role": "user", "content": "and in the last 2 hours on the driveway?"},
                    ],
                },
            ]
        },
    )

    model: str = Field(max_length=200, description="Echoed in the answer; the VLM asked is the configured one.")
    messages: list[ChatMessage] = Field(
        min_length=1, description="The conversation; the last `user` message is the question."
    )
    stream: bool = Field(
        default=False, strict=True, description="Server-sent events of `chat.completion.chunk` objects."
    )
    max_tokens: int | None = Field(
        default=None, ge=1, description="Longest answer in tokens; at most VISIONCAP_ASK_MAX_TOKENS (its default)."
    )
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Same as `max_tokens` (newer name).")
    temperature: float | None = Field(
        default=None, ge=0, le=2, description="Sampling temperature; the VLM's default when left out."
    )

    @field_validator("max_tokens", "max_completion_tokens", "temperature", mode="before")
    @classmethod
    def _a_number_not_a_boolean(cls, value: Any) -> Any:
        # Lax numbers take JSON's 5.0 for 5, as JSON Schema's integer does, but also true for 1: the fuzzer found
        # `"temperature": false` answered as 0.
        if isinstance(value, bool):
            raise ValueError("must be a number, not a boolean")
        return value


class Citation(_Model):
    """A caption the answer was given (and may cite by its id in square brackets)."""

    caption_id: int = Field(description="Caption id (`GET /v1/captions/{id}`).")
    camera: str = Field(description="Camera id.")
    captured_at: datetime = Field(description="When the frame was captured (UTC).")
    caption: str = Field(description="The caption text as the VLM was given it.")
    image_url: str | None = Field(description="Path of the caption's image route; null when no image is stored.")


class AskContext(_Model):
    """What the answer was built from: the `visioncap` field of a completion, and of a stream's first chunk."""

    retrieved: list[int] = Field(description="Ids of the captions retrieved for the question, best first.")
    citations: list[Citation] = Field(
        description="The retrieved captions the prompt held (all of `retrieved` unless the model's context cut "
        "some), best first: always a subset of `retrieved`. Empty when nothing matched."
    )
    frames: list[int] = Field(
        default_factory=list,
        description="Ids of the cited captions whose frames the VLM was shown as images (VISIONCAP_ASK_FRAMES), "
        "best first: always a subset of `citations`' ids.",
    )
    cameras: list[str] = Field(description="Cameras the question named (empty: all cameras).")
    since: datetime | None = Field(description="Start of the time range the question named (UTC); null: none.")
    until: datetime | None = Field(description="End of that range, exclusive (UTC); null: none.")
    search: Literal["hybrid", "words", "newest", "task"] = Field(
        description="How captions were ranked: `hybrid` (meaning and words, VISIONCAP_API_SEMANTIC_SEARCH), "
        "`words` (full-text, any word), `newest` (the question had no words to search: newest first); `task`: "
        "none were, the message was a chat UI's task prompt (`### Task:`: a title, tags, follow-ups), answered "
        "as plain chat."
    )


class ChatAnswerMessage(_Model):
    role: Literal["assistant"] = Field(description="Always `assistant`.")
    content: str = Field(description="The answer.")


class ChatChoice(_Model):
    index: int = Field(description="Always 0.")
    message: ChatAnswerMessage = Field(description="The answer.")
    finish_reason: str | None = Field(description="`stop`, `length`, ... as the VLM said.")


class ChatUsage(_Model):
    prompt_tokens: int = Field(description="Prompt tokens as the VLM counted them (0 when it was not asked).")
    completion_tokens: int = Field(description="Answer tokens.")
    total_tokens: int = Field(description="Their sum.")


class ChatCompletion(_Model):
    """OpenAI's `chat.completion`, plus `visioncap`."""

    id: str = Field(description="An id of this answer.")
    object: Literal["chat.completion"] = Field(description="Always `chat.completion`.")
    created: int = Field(description="Unix seconds.")
    model: str = Field(description="The request's `model`.")
    choices: list[ChatChoice] = Field(description="One choice.")
    usage: ChatUsage = Field(description="Tokens.")
    visioncap: AskContext = Field(description="The retrieved captions and the citations.")


class ChatModel(_Model):
    id: str = Field(description="A model name to send as `model`.")
    object: Literal["model"] = Field(description="Always `model`.")
    created: int = Field(description="Unix seconds (the API's start).")
    owned_by: str = Field(description="Always `visioncap`.")


class ChatModelList(_Model):
    """OpenAI's model list, so that clients and chat UIs that list models first find one."""

    object: Literal["list"] = Field(description="Always `list`.")
    data: list[ChatModel] = Field(description="The one model: Ask.")
