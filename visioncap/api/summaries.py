"""Serving /v1/summaries: checks a request's window and cameras, writes the summary with the VLM (the background
key, VISIONCAP_VLM_API_KEY), stores it and queues its deliveries (MQTT, webhooks of the alerts file)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import Engine

from visioncap.api.auth import CameraScope
from visioncap.api.errors import ApiError, bad_param
from visioncap.api.summaries_protocol import SummaryList, SummaryRequest, SummaryView
from visioncap.config.alerts import AlertsConfig
from visioncap.config.api import ApiSettings
from visioncap.config.settings import load_settings
from visioncap.config.summaries import SummariesSettings
from visioncap.summaries import store
from visioncap.summaries.writer import SummaryError, SummaryWriter, WindowTooLarge


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Summaries:
    def __init__(self, api_settings: ApiSettings, engine: Engine, alerts: AlertsConfig | None) -> None:
        self.settings = load_settings(SummariesSettings)
        self._engine = engine
        self._alerts = alerts
        self._model = self.settings.model or api_settings.ask_model
        self._base_url = api_settings.vlm_base_url
        self._api_key = api_settings.vlm_api_key.get_secret_value()
        self._table_ready = False

    def _ready(self) -> None:
        if not self._table_ready:
            store.ensure_table(self._engine)
            self._table_ready = True

    def create(self, request: SummaryRequest, scope: CameraScope) -> SummaryView:
        start, end = _utc(request.start), _utc(request.end)
        if end <= start:
            raise bad_param("end", "must be after start")
        if (end - start).total_seconds() > self.settings.max_window_s:
            raise bad_param("end", f"the window is at most {self.settings.max_window_s} s")
        if not scope.covers(request.cameras):
            raise ApiError(403, "this API key may not read some of these cameras", param="cameras")
        if self._model is None:
            raise ApiError(503, "no model for summaries: set VISIONCAP_SUMMARIES_MODEL")
        self._ready()
        config = self.settings.config
        captions = store.window_captions(self._engine, request.cameras, start, end, config.max_captions)
        writer = SummaryWriter(config, self._base_url, self._api_key, self._model)
        try:
            summary = writer.write("request", request.cameras, start, end, captions)
        except WindowTooLarge as exc:
            raise bad_param("end", str(exc)) from exc
        except SummaryError as exc:
            raise ApiError(503, f"the VLM could not write the summary: {exc}") from exc
        finally:
            writer.close()
        stored = store.add_summary(self._engine, summary, self._alerts)
        assert stored is not None
        return SummaryView.of(stored)

    def list(self, camera: str | None, limit: int, scope: CameraScope) -> SummaryList:
        self._ready()
        if camera is not None and not scope.sees(camera):
            return SummaryList(summaries=[])
        found = store.list_summaries(self._engine, camera, limit if scope.cameras is None else limit * 4)
        # A limited key sees the summaries of its own cameras only.
        visible = [summary for summary in found if scope.covers(summary.cameras)][:limit]
        return SummaryList(summaries=[SummaryView.of(summary) for summary in visible])
