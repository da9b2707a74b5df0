"""The request flow behind the routers: parameter checks, queries, images, the live stream, readiness."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
from pydantic import ValidationError
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request

from visioncap.api.ask import Asker
from visioncap.api.auth import EVERY_CAMERA, CameraScope
from visioncap.api.cursors import MAX_ID as MAX_ID  # the routes' bound on ids
from visioncap.api.cursors import decode_cursor, decode_ranked_cursor, encode_cursor, encode_ranked_cursor
from visioncap.api.errors import RETRY_AFTER_S, ApiError, bad_param, validation_problem
from visioncap.api.metrics import ApiMetrics
from visioncap.api.protocol import (
    Camera,
    CameraList,
    CameraSettings,
    Caption,
    Check,
    Readiness,
    Regenerated,
    caption_page_json,
)
from visioncap.config.api import ApiSettings
from visioncap.config.cameras import CameraChange, SubmittedCamera
from visioncap.store import CaptionStatus, CaptionStore
from visioncap.store.camera_configs import (
    CameraExists,
    add_camera,
    get_camera,
    list_cameras,
    remove_camera,
    update_camera,
)
from visioncap.store.cameras import camera_states
from visioncap.store.changes import (
    ChangePage,
    ChangePosition,
    StreamStart,
    changes_after,
    is_reachable,
    past_seen,
    stream_start,
)
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.retention import RetentionJob
from visioncap.store.search import (
    CaptionFilter,
    SearchLimits,
    SearchTimeout,
    camera_summaries,
    search_captions,
    status_counts,
)
from visioncap.store.semantic import explained_search
from visioncap.store.vector_index import index_for
from visioncap.store.vectors import BackgroundEmbedder, vector_method

log = logging.getLogger(__name__)

MAX_CAMERAS = 50
MAX_CAMERA_LENGTH = 64  # the column's size
LAST_EVENT_ID = "Last-Event-ID"


def _check_text(param: str, value: str, max_length: int) -> str:
    if "\x00" in value:
        raise bad_param(param, "must not contain NUL characters")
    if len(value) > max_length:
        raise bad_param(param, f"at most {max_length} characters")
    return value


def _utc(param: str, value: datetime | None) -> datetime | None:
    """Timezone-aware UTC; a time without an offset is taken as UTC."""
    if value is None:
        return None
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise bad_param(param, f"out of range: {exc}") from exc


MAX_ZONES, MAX_ZONE_LENGTH = 32, 64


def names_param(values: Sequence[str], param: str, most: int, longest: int) -> list[str]:
    """`param=a&param=b` or `param=a,b`, each name once, in the order given. A name nothing has matches nothing."""
    names = list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))
    return checked_names(names, param, most, longest)


def checked_names(names: Sequence[str], param: str, most: int, longest: int) -> list[str]:
    """`names` (a repeated parameter) as given, refused (422) when more than `most`, or one is longer than
    `longest` or holds a NUL (PostgreSQL refuses it in a query: a 500, not an empty answer)."""
    if len(names) > most:
        raise bad_param(param, f"at most {most} {param}s")
    for name in names:
        _check_text(param, name, longest)
    return list(names)


def cameras_param(values: Sequence[str]) -> list[str]:
    return names_param(values, "camera", MAX_CAMERAS, MAX_CAMERA_LENGTH)


def zones_param(values: Sequence[str]) -> list[str]:
    return names_param(values, "zone", MAX_ZONES, MAX_ZONE_LENGTH)


class StreamSlot:
    """One open /v1/stream, counted from before the request's first await until `release` (idempotent), which the
    response calls when it ends however it ends, and the route when it fails before there is a response."""

    def __init__(self, api: ApiService) -> None:
        self._api: ApiService | None = api
        api.open_streams += 1
        api.metrics.streams.inc()

    def release(self) -> None:
        if self._api is not None:
            self._api.open_streams -= 1
            self._api.metrics.streams.dec()
            self._api = None


class ApiService:
    """Shared by all requests of one app."""

    def __init__(self, settings: ApiSettings, engine: Engine, metrics: ApiMetrics) -> None:
        self.settings = settings
        self.engine = engine
        self.store = CaptionStore(engine)
        self.metrics = metrics
        self.data_dir = settings.data_dir
        self.http: httpx.AsyncClient | None = None
        self.open_streams = 0
        self.retention: RetentionJob | None = None  # set while the app runs
        self.embedder = TextEmbedder() if settings.api_semantic_search else None
        if self.embedder is not None:  # the vector index's first build, in its own thread (store/vector_index.py)
            index_for(engine)
        self.background_embedder: BackgroundEmbedder | None = None  # set while the app runs
        self.asker = Asker(settings, engine, self.embedder)

    # -- captions --------------------------------------------------------------------------------

    def list_captions(
        self,
        cameras: Sequence[str],
        since: datetime | None,
        until: datetime | None,
        q: str | None,
        min_people: int | None,
        statuses: Sequence[str],
        limit: int,
        cursor: str | None,
        semantic: str | None = None,
        hybrid: bool = False,
        scope: CameraScope = EVERY_CAMERA,
        zones: Sequence[str] = (),
        min_dwell_s: float | None = None,
    ) -> bytes:
        """A `CaptionPage` as JSON, of the cameras `scope` sees."""
        if limit > self.settings.api_max_page_size:
            raise bad_param("limit", f"at most {self.settings.api_max_page_size}")
        since, until = _utc("since", since), _utc("until", until)
        if since is not None and until is not None and since >= until:
            raise bad_param("until", "must be after since")
        if q is not None:
            q = _check_text("q", q, self.settings.api_max_query_length).strip() or None
        if semantic is not None:
            semantic = _check_text("semantic", semantic, self.settings.api_max_query_length).strip() or None
        if semantic is None and hybrid:
            raise bad_param("hybrid", "needs `semantic` (the text to rank by)")
        if semantic is not None and q is not None:
            raise bad_param("q", "not with `semantic`: add hybrid=true to rank by its words as well")
        if semantic is not None and self.embedder is None:
            raise bad_param("semantic", "semantic search is off here (VISIONCAP_API_SEMANTIC_SEARCH)")
        after = decode_cursor(_check_text("cursor", cursor, 200)) if cursor is not None and not semantic else None
        ranked_after = decode_ranked_cursor(_check_text("cursor", cursor, 300)) if cursor and semantic else None
        visible = scope.narrow(cameras_param(cameras))
        if visible is None:  # only cameras the key may not see: as for cameras that do not exist
            return caption_page_json([], None, limit)
        query = CaptionFilter(
            cameras=visible,
            since=since,
            until=until,
            text=q,
            min_people=min_people,
            statuses=[CaptionStatus(status) for status in dict.fromkeys(statuses)],
            zones=zones_param(zones),
            min_dwell_s=min_dwell_s,
        )
        limits = SearchLimits(self.settings.api_search_scan_rows, self.settings.api_search_timeout_s)
        try:
            if semantic is not None:
                assert self.embedder is not None
                found = explained_search(
                    self.engine, self.embedder, query, semantic, limit, hybrid=hybrid, after=ranked_after, limits=limits
                )
                why: list[dict[str, Any]] = [{"similarity": similarity} for similarity in found.similarities]
                for explained, words in zip(why, found.matched_words or (), strict=False):
                    explained["matched_words"] = words
                following = encode_ranked_cursor(found.next) if found.next else None
                return caption_page_json(found.rows, following, limit, explanations=why)
            rows, next_position = search_captions(self.engine, query, limit, after, limits)
        except SearchTimeout as exc:
            log.warning("search stopped at its time limit (%s): %s", exc, query)
            raise ApiError(
                503,
                f"the search took longer than its limit of {limits.timeout_s:g} s and was stopped; try again "
                "shortly, or narrow it (camera, since/until)",
                headers={"Retry-After": RETRY_AFTER_S},
                error_type="search_timeout",
            ) from exc
        if next_position is None:
            return caption_page_json(rows, None, limit)
        # Fewer rows than asked with more to come: the search stopped at its scan bound (see search_captions).
        return caption_page_json(rows, encode_cursor(next_position), limit, partial=len(rows) < limit)

    def row(self, caption_id: int, scope: CameraScope = EVERY_CAMERA) -> CaptionRecord:
        """The row, or 404: also for a camera `scope` does not see, with the same answer, so ids tell nothing."""
        row = self.store.get(caption_id)
        if row is None or not scope.sees(row.camera):
            raise ApiError(404, f"no caption {caption_id}", param="id")
        return row

    def regenerate(self, caption_id: int, scope: CameraScope = EVERY_CAMERA) -> Regenerated:
        row = self.row(caption_id, scope)
        if not row.image_path:
            raise ApiError(409, f"caption {caption_id} has no stored image to caption again", param="id")
        if not self.store.requeue(caption_id):
            raise ApiError(409, f"caption {caption_id} is already pending", param="id")
        return Regenerated(
            id=caption_id,
            status=CaptionStatus.PENDING,
            detail="back in the outbox as pending; the pipeline captions it when it next loads pending rows "
            "(the start of `visioncap run`, before new frames)",
        )

    def cameras(self, scope: CameraScope = EVERY_CAMERA) -> CameraList:
        """Cameras configured or reported by a pipeline (state, newest frame) merged with their stored rows; those
        `scope` sees (one entry per camera, no pages: leaving the others out loses nothing)."""
        summaries = {summary.camera: summary for summary in camera_summaries(self.engine)}
        states = camera_states(self.engine)
        configs = {stored.camera: stored for stored in list_cameras(self.engine)}
        names = sorted(name for name in set(summaries) | set(states) | set(configs) if scope.sees(name))
        return CameraList(
            items=[Camera.of(name, summaries.get(name), states.get(name), configs.get(name)) for name in names]
        )

    def add_camera(self, config: SubmittedCamera, scope: CameraScope = EVERY_CAMERA) -> CameraSettings:
        # Before looking it up: a 409 would tell a limited key that another's camera exists.
        if not scope.sees(config.camera):
            raise ApiError(
                403, f"this API key may not add camera {config.camera}: not one of its cameras", param="camera"
            )
        try:
            return CameraSettings.of(add_camera(self.engine, config))
        except CameraExists:
            raise ApiError(409, f"camera {config.camera} exists; change it with PATCH", param="camera") from None

    def change_camera(self, camera: str, change: CameraChange, scope: CameraScope = EVERY_CAMERA) -> CameraSettings:
        current = get_camera(self.engine, camera) if scope.sees(camera) else None
        if current is None:
            raise ApiError(404, f"no camera {camera} is configured", param="camera")
        try:
            config = change.applied_to(current.config)
        except ValidationError as exc:
            raise validation_problem([{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]) from None
        updated = update_camera(self.engine, config, expected_version=current.version)
        if updated is None:
            raise ApiError(409, f"camera {camera} was changed or removed meanwhile; read it and try again")
        return CameraSettings.of(updated)

    def remove_camera(self, camera: str, scope: CameraScope = EVERY_CAMERA) -> None:
        if not scope.sees(camera) or not remove_camera(self.engine, camera):
            raise ApiError(404, f"no camera {camera} is configured", param="camera")

    def status_counts(self) -> dict[str, int]:
        return {str(status): count for status, count in status_counts(self.engine).items()}

    # -- live stream -----------------------------------------------------------------------------

    def reserve_stream(self) -> StreamSlot | None:
        """One of the VISIONCAP_API_MAX_STREAMS slots, or None when all are taken.

        No await between the check and the count: requests that arrive together cannot all see a free slot.
        """
        if self.open_streams >= self.settings.api_max_streams:
            return None
        return StreamSlot(self)

    async def stream_start(self, last_event_id: str | None) -> StreamStart:
        """Where a stream starts: right after `last_event_id` (an event id this API sent), else now."""
        if last_event_id is None:
            return await anyio.to_thread.run_sync(stream_start, self.engine)
        try:
            position = ChangePosition.parse(last_event_id)
        except ValueError as exc:
            raise bad_param(LAST_EVENT_ID, "not an event id of this stream") from exc
        try:
            reachable = await anyio.to_thread.run_sync(is_reachable, self.engine, position)
        except SQLAlchemyError as exc:
            # An EventSource gives up on any answer but 200: while the database is away, a reconnect resumes
            # unchecked and waits for it like any open stream (a new stream has no start without it: 503).
            log.warning("stream: cannot check Last-Event-ID %s: %s", last_event_id, exc)
            reachable = True
        if not reachable:
            raise bad_param(LAST_EVENT_ID, "ahead of every change in this database (an id from another database?)")
        return StreamStart(position)

    async def stream(
        self, request: Request, start: StreamStart, cameras: list[str] | None, min_people: int | None
    ) -> AsyncGenerator[str, None]:
        """Server-sent events: `event: caption` with a Caption as data and its change position as id, for every
        row captioned after `start`, each change once, in the order of their positions (see store/changes.py).
        `cameras`: empty, every camera; None, none (a limited key asked only for cameras it may not see): the
        stream stays open with keep-alives, as for cameras that do not exist."""
        poll_s = self.settings.api_stream_poll_s
        heartbeat_s = self.settings.api_stream_heartbeat_s
        position, seen = start.position, start.seen
        # The start's id first: a client that reconnects before any caption still resumes from where it started.
        # (On PostgreSQL it may then also get rows committed just before it first connected, by transactions
        # newer than one still running then: the start's snapshot skips those, an id cannot carry it.)
        told = position  # the client's last event id: what it sends as Last-Event-ID if it reconnects now
        yield f"retry: {round(poll_s * 2000)}\nid: {position.token()}\n: connected\n\n"
        quiet_s = 0.0
        while not await request.is_disconnected():
            more = False
            try:
                if cameras is None:
                    page = ChangePage([], position, more=False)
                else:
                    read = partial(changes_after, self.engine, position, cameras, min_people, seen=seen)
                    page = await anyio.to_thread.run_sync(read)
            except SQLAlchemyError as exc:  # a database restart must not end every stream with a 500
                log.warning("stream: database poll failed: %s", exc)
            else:
                for row in page.rows:
                    quiet_s = 0.0
                    self.metrics.stream_events.inc()
                    told = ChangePosition.of(row)
                    yield f"id: {told.token()}\nevent: caption\ndata: {Caption.of(row).model_dump_json()}\n\n"
                position, seen, more = page.position, past_seen(page.position, seen), page.more
            if more:  # a burst: the next page now, not after a poll interval
                continue
            await asyncio.sleep(poll_s)
            quiet_s += poll_s
            if quiet_s >= heartbeat_s:
                quiet_s = 0.0
                # An id with no data moves the client's last event id (EventSource dispatches nothing) past the
                # changes its filter left out, so that a reconnect does not walk them again.
                moved = f"id: {position.token()}\n" if position != told else ""
                told = position
                yield f"{moved}: keep-alive\n\n"

    # -- health ----------------------------------------------------------------------------------

    def _database_check(self) -> Check:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return Check(ok=True, detail=f"{self.engine.dialect.name}: SELECT 1 answered")
        except SQLAlchemyError as exc:
            return Check(ok=False, detail=f"{self.engine.dialect.name}: {type(exc).__name__}")

    async def _vlm_check(self) -> Check:
        url = self.settings.vlm_base_url.rstrip("/") + "/models"
        assert self.http is not None
        try:
            response = await self.http.get(
                url, headers={"Authorization": f"Bearer {self.settings.vlm_api_key.get_secret_value()}"}
            )
        except httpx.HTTPError as exc:
            return Check(ok=False, detail=f"GET {url}: {type(exc).__name__}")
        if response.status_code != 200:
            return Check(ok=False, detail=f"GET {url}: HTTP {response.status_code}")
        return Check(ok=True, detail=f"GET {url}: HTTP 200")

    def _semantic_check(self) -> Check:
        """Not a dependency of readiness (always ok): says how semantic search ranks and whether vectors lag."""
        try:
            method = vector_method(self.engine)
        except SQLAlchemyError as exc:
            method = f"unknown ({type(exc).__name__})"
        embedder = self.background_embedder
        state = "not started" if embedder is None else ("catching up" if embedder.behind else "caught up")
        index = index_for(self.engine).describe()
        return Check(ok=True, detail=f"{self.engine.dialect.name}: {index}; {method}; background embedder: {state}")

    async def readiness(self) -> Readiness:
        checks = {"database": await anyio.to_thread.run_sync(self._database_check)}
        if self.embedder is not None:
            checks["semantic"] = await anyio.to_thread.run_sync(self._semantic_check)
        if self.settings.api_ready_check_vlm:
            checks["vlm"] = await self._vlm_check()
        ready = all(check.ok for check in checks.values())
        return Readiness(status="ready" if ready else "unavailable", checks=checks)


def static_dir() -> Path:
    return Path(__file__).parent / "static"
