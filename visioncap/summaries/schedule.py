"""Scheduled digests: each camera's last complete hour or day (in the configured time zone), written once.

`Digests.run_once` writes the digests that are due and not yet stored; the `digest_key` column makes a digest
written by two processes at once stored once (the later one's insert fails and is dropped).
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import Engine

from visioncap.config.alerts import AlertsConfig
from visioncap.config.summaries import SummariesConfig
from visioncap.summaries import store
from visioncap.summaries.writer import SummaryError, SummaryWriter

log = logging.getLogger(__name__)


def last_complete_window(now: datetime, every: str, zone: ZoneInfo) -> tuple[datetime, datetime]:
    """The latest hour or day of `zone` that ended at or before `now`, as UTC datetimes. Days follow the local
    calendar (23 or 25 hours across a daylight-saving change)."""
    local = now.astimezone(zone)
    if every == "hourly":
        end = local.replace(minute=0, second=0, microsecond=0).astimezone(UTC)
        return end - timedelta(hours=1), end
    midnight = local.replace(hour=0, minute=0, second=0, microsecond=0)
    day_before = (midnight - timedelta(hours=12)).replace(hour=0, minute=0, second=0, microsecond=0)
    return day_before.astimezone(UTC), midnight.astimezone(UTC)


class Digests:
    def __init__(self, engine: Engine, writer: SummaryWriter, config: SummariesConfig, alerts: AlertsConfig | None):
        self._engine = engine
        self._writer = writer
        self._config = config
        self._alerts = alerts
        self._stop = threading.Event()

    def stop(self) -> None:
        """Ends run_once before its next VLM request (safe in a signal handler: it only sets an event). The digest
        being written stays due: nothing is stored until its last request has answered."""
        self._stop.set()

    def run_once(self, now: datetime | None = None) -> int:
        """Writes the due digests; how many were stored. A failing VLM leaves a digest due for the next pass."""
        now = now or datetime.now(UTC)
        zone = ZoneInfo(self._config.time_zone)
        written = 0
        for schedule in self._config.digests:
            if self._stop.is_set():
                break
            start, end = last_complete_window(now, schedule.every, zone)
            key = store.digest_key(schedule.every, schedule.camera, start)
            if store.digest_exists(self._engine, key):
                continue
            captions = store.window_captions(self._engine, [schedule.camera], start, end, self._config.max_captions)
            try:
                summary = self._writer.write(schedule.every, [schedule.camera], start, end, captions, self._stop)
            except SummaryError as exc:
                log.warning("digest %s failed, tried again next pass: %s", key, exc)
                continue
            if store.add_summary(self._engine, summary, self._alerts, key) is not None:
                written += 1
        return written

    def close(self) -> None:
        self._writer.close()
