"""The request flow behind the routers: parameter checks, queries, images, the live stream, readiness."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

import anyio
import httpx
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError
from starlette.requests import Request

from visioncap.api.errors import ApiError, bad_param
from visioncap.api.metrics import ApiMetrics
from visioncap.api.protocol import Camera, CameraList, Caption, Check, Readiness, Regenerated, caption_page_json
from visioncap.api.settings import ApiSettings
from visioncap.store import CaptionStore
from visioncap.store.cameras import camera_states
from visioncap.store.records import CaptionRecord
from visioncap.store.retention import RetentionJob
from visioncap.store.search import (
    CaptionFilter,
    Position,
    camera_summaries,
    captioned_since,
    latest_change,
    search_captions,
    status_counts,
)

log = logging.getLogger(__name__)

MAX_CAMERAS = 50
MAX_CAMERA_LENGTH = 64  # the column's size
MAX_ID = 2**31 - 1  # INTEGER on PostgreSQL


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


def cameras_param(values: Sequence[str]) -> list[str]:
    """`camera=a&camera=b` or `camera=a,b`."""
    cameras = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if len(cameras) > MAX_CAMERAS:
        raise bad_param("camera", f"at most {MAX_CAMERAS} cameras")
    for camera in cameras:
        _check_text("camera", camera, MAX_CAMERA_LENGTH)
    return cameras


def encode_cursor(position: Position) -> str:
    raw = json.dumps({"t": position.captured_at.isoformat(), "i": position.id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        captured_at = datetime.fromisoformat(data["t"])
        row_id = data["i"]
        if captured_at.tzinfo is None or not isinstance(row_id, int) or not 0 < row_id <= MAX_ID:
            raise ValueError("bad cursor")
        return Position(captured_at.astimezone(UTC), row_id)
    except (binascii.Error, UnicodeDecodeError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise bad_param("cursor", "not a cursor this API returned") from exc


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
    ) -> bytes:
        """A `CaptionPage` as JSON."""
        if limit > self.settings.api_max_page_size:
            raise bad_param("limit", f"at most {self.settings.api_max_page_size}")
        since, until = _utc("since", since), _utc("until", until)
        if since is not None and until is not None and since >= until:
            raise bad_param("until", "must be after since")
        if q is not None:
            q = _check_text("q", q, self.settings.api_max_query_length).strip() or None
        after = decode_cursor(_check_text("cursor", cursor, 200)) if cursor is not None else None
        query = CaptionFilter(
            cameras=cameras_param(cameras),
            since=since,
            until=until,
            text=q,
            min_people=min_people,
            statuses=list(dict.fromkeys(statuses)),
        )
        rows, next_position = search_captions(self.engine, query, limit, after)
        return caption_page_json(rows, encode_cursor(next_position) if next_position else None, limit)

    def row(self, caption_id: int) -> CaptionRecord:
        row = self.store.get(caption_id)
        if row is None:
            raise ApiError(404, f"no caption {caption_id}", param="id")
        return row

    def regenerate(self, caption_id: int) -> Regenerated:
        row = self.row(caption_id)
        if not row.image_path:
            raise ApiError(409, f"caption {caption_id} has no stored image to caption again", param="id")
        if not self.store.requeue(caption_id):
            raise ApiError(409, f"caption {caption_id} is already pending", param="id")
        return Regenerated(
            id=caption_id,
            status="pending",
            detail="back in the outbox as pending; the pipeline captions it when it next loads pending rows "
            "(the start of `visioncap run`, before new frames)",
        )

    def cameras(self) -> CameraList:
        """Cameras a pipeline reported (state, newest frame) merged with what their stored rows say."""
        summaries = {summary.camera: summary for summary in camera_summaries(self.engine)}
        states = camera_states(self.engine)
        names = sorted(set(summaries) | set(states))
        return CameraList(items=[Camera.of(name, summaries.get(name), states.get(name)) for name in names])

    def status_counts(self) -> dict[str, int]:
        return status_counts(self.engine)

    # -- live stream -----------------------------------------------------------------------------

    async def stream(self, request: Request, cameras: list[str], min_people: int | None) -> AsyncIterator[str]:
        """Server-sent events: `event: caption` with a Caption as data, for rows captioned from now on."""
        poll_s = self.settings.api_stream_poll_s
        heartbeat_s = self.settings.api_stream_heartbeat_s
        watermark = await anyio.to_thread.run_sync(latest_change, self.engine) or datetime.now(UTC)
        sent: dict[int, datetime] = {}  # id -> updated_at already sent (rows inside the overlap window)
        self.open_streams += 1
        self.metrics.streams.inc()
        try:
            yield f"retry: {round(poll_s * 2000)}\n: connected\n\n"
            quiet_s = 0.0
            while not await request.is_disconnected():
                try:
                    poll = partial(captioned_since, self.engine, watermark, cameras, min_people)
                    rows = await anyio.to_thread.run_sync(poll)
                except SQLAlchemyError as exc:  # a database restart must not end every stream with a 500
                    log.warning("stream: database poll failed: %s", exc)
                    rows = []
                for row in rows:
                    watermark = max(watermark, row.updated_at)
                    if sent.get(row.id) == row.updated_at:
                        continue
                    sent[row.id] = row.updated_at
                    quiet_s = 0.0
                    self.metrics.stream_events.inc()
                    body = Caption.of(row).model_dump_json()
                    yield f"id: {row.id}\nevent: caption\ndata: {body}\n\n"
                horizon = watermark.timestamp() - 10
                sent = {key: value for key, value in sent.items() if value.timestamp() >= horizon}
                await asyncio.sleep(poll_s)
                quiet_s += poll_s
                if quiet_s >= heartbeat_s:
                    quiet_s = 0.0
                    yield ": keep-alive\n\n"
        finally:
            self.open_streams -= 1
            self.metrics.streams.dec()

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

    async def readiness(self) -> Readiness:
        checks = {"database": await anyio.to_thread.run_sync(self._database_check)}
        if self.settings.api_ready_check_vlm:
            checks["vlm"] = await self._vlm_check()
        ready = all(check.ok for check in checks.values())
        return Readiness(status="ready" if ready else "unavailable", checks=checks)


def static_dir() -> Path:
    return Path(__file__).parent / "static"
