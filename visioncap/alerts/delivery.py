"""The delivery worker: sends pending deliveries oldest first, records every attempt, backs off on failure.

A delivery is marked delivered right where its acknowledgement (HTTP 2xx, MQTT PUBACK) is learnt, and a
delivered one is never sent again. A crash (or a database write that fails) between the acknowledgement and that
mark leaves it pending, and it is sent once more: webhook receivers dedupe on the `Idempotency-Key` header (the
delivery id), MQTT subscribers on the ids in the body.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import Engine

from visioncap.alerts import store
from visioncap.alerts.metrics import AlertMetrics
from visioncap.config.alerts import DeliveryConfig
from visioncap.store.records import DeliveryState

log = logging.getLogger(__name__)

PURGE_EVERY_S = 600.0  # finished deliveries expire in days: a look every ten minutes is plenty


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt came to: acknowledged, or an error and whether trying again can help."""

    ok: bool
    error: str | None = None
    permanent: bool = False


class Sender(Protocol):
    def send(self, delivery: store.Due) -> Outcome: ...

    def close(self) -> None: ...


def backoff(config: DeliveryConfig, attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling from the first wait to the longest."""
    return min(config.retry_initial_s * 2 ** (attempts - 1), config.retry_max_s)


class DeliveryWorker:
    """`run_once` sends what is due; a destination that fails is left alone for the rest of the pass, so its
    messages keep their order and a receiver that is down is not asked again at once for each of them."""

    def __init__(
        self, engine: Engine, senders: dict[str, Sender], config: DeliveryConfig, metrics: AlertMetrics
    ) -> None:
        self._engine = engine
        self._senders = senders
        self._config = config
        self._metrics = metrics
        self._purged_at: float | None = None  # time.monotonic() of the last purge; None: not yet

    def run_once(self) -> int:
        """Sends one batch of due deliveries (and, every PURGE_EVERY_S, deletes expired finished ones); returns
        how many were attempted."""
        if self._purged_at is None or time.monotonic() - self._purged_at >= PURGE_EVERY_S:
            self.purge()
        blocked: set[str] = set()
        attempted = 0
        for delivery in store.due(self._engine, datetime.now(UTC), self._config.batch):
            if delivery.destination in blocked:
                continue
            sender = self._senders.get(delivery.destination)
            if sender is None:
                outcome = Outcome(False, f"no destination {delivery.destination!r} is configured", permanent=True)
            else:
                outcome = sender.send(delivery)
            attempted += 1
            if not self._record(delivery, outcome):
                blocked.add(delivery.destination)
        return attempted

    def purge(self) -> int:
        """Delete the finished deliveries older than `keep_finished_days`, a batch at a time; how many went."""
        self._purged_at = time.monotonic()
        before = datetime.now(UTC) - timedelta(days=self._config.keep_finished_days)
        total = 0
        while (deleted := store.purge_finished(self._engine, before, self._config.batch)) > 0:
            total += deleted
        if total:
            log.info("alerts: deleted %d deliveries finished before %s", total, before.isoformat(timespec="seconds"))
        return total

    def _record(self, delivery: store.Due, outcome: Outcome) -> bool:
        attempts = delivery.attempts + 1
        if outcome.ok:
            store.record_attempt(self._engine, delivery.id, attempts, DeliveryState.DELIVERED)
            self._metrics.deliveries.labels(delivery.destination, "delivered").inc()
            return True
        now = datetime.now(UTC)
        too_old = now - delivery.created_at > timedelta(seconds=self._config.max_age_s)
        if outcome.permanent or attempts >= self._config.max_attempts or too_old:
            log.warning("delivery %d to %s failed for good: %s", delivery.id, delivery.destination, outcome.error)
            store.record_attempt(self._engine, delivery.id, attempts, DeliveryState.FAILED, outcome.error)
            self._metrics.deliveries.labels(delivery.destination, "failed").inc()
            return outcome.permanent  # a refusal of one message says nothing of the next
        wait = timedelta(seconds=backoff(self._config, attempts))
        store.record_attempt(self._engine, delivery.id, attempts, DeliveryState.PENDING, outcome.error, now + wait)
        self._metrics.deliveries.labels(delivery.destination, "retry").inc()
        return False
