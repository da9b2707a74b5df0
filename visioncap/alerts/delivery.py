"""The delivery workers, one per destination: each sends its destination's pending deliveries oldest first,
records every attempt, backs off on failure. A receiver that hangs holds up its own worker only.

A worker claims the rows it is about to send (a lease in the row: `store.due`), so two delivery processes on one
database never send one delivery at once; a crashed process's claims lapse and the rows are sent by another.

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
    @property
    def timeout_s(self) -> float:
        """The longest one `send` takes."""
        ...

    def send(self, delivery: store.Due) -> Outcome: ...

    def close(self) -> None: ...


def backoff(config: DeliveryConfig, attempts: int) -> float:
    """Seconds before the next attempt after `attempts` failed ones: doubling from the first wait to the longest."""
    return float(min(config.retry_initial_s * 2 ** (attempts - 1), config.retry_max_s))


# A claim covers the sends of one pass at their longest: passes claim fewer rows of a slow destination, so that a
# crashed process's claims lapse within about this long.
CLAIM_TARGET_S = 120.0
CLAIM_SLACK_S = 30.0  # for the database writes between sends


class DeliveryWorker:
    """`run_once` sends what is due to one destination; after a failure the pass ends, so that its messages keep
    their order and a receiver that is down is not asked again at once for each of them."""

    def __init__(
        self,
        engine: Engine,
        destination: str,
        sender: Sender,
        config: DeliveryConfig,
        metrics: AlertMetrics,
        claimant: str,
    ) -> None:
        self._engine = engine
        self.destination = destination
        self._sender = sender
        self._config = config
        self._metrics = metrics
        self._claimant = claimant
        self._batch = max(1, min(config.batch, int(CLAIM_TARGET_S // sender.timeout_s)))
        self._lease_s = self._batch * sender.timeout_s + CLAIM_SLACK_S

    def run_once(self) -> int:
        """Sends one batch of this destination's due deliveries; returns how many were attempted."""
        now = datetime.now(UTC)
        claimed = store.due(self._engine, now, self._batch, self.destination, self._claimant, self._lease_s)
        attempted = 0
        for index, delivery in enumerate(claimed):
            outcome = self._sender.send(delivery)
            attempted += 1
            if not self._record(delivery, outcome):
                store.release(self._engine, [later.id for later in claimed[index + 1 :]], self._claimant)
                break
        return attempted

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
        log.warning(
            "delivery %d to %s failed (attempt %d, next in %.1f s): %s",
            delivery.id,
            delivery.destination,
            attempts,
            wait.total_seconds(),
            outcome.error,
        )
        store.record_attempt(self._engine, delivery.id, attempts, DeliveryState.PENDING, outcome.error, now + wait)
        self._metrics.deliveries.labels(delivery.destination, "retry").inc()
        return False


class Housekeeping:
    """`run_once`, every PURGE_EVERY_S: deletes expired finished deliveries, and fails the pending ones of
    destinations no longer configured (no worker takes them)."""

    def __init__(self, engine: Engine, destinations: list[str], config: DeliveryConfig) -> None:
        self._engine = engine
        self._destinations = destinations
        self._config = config
        self._done_at: float | None = None  # time.monotonic() of the last pass; None: not yet

    def run_once(self) -> int:
        """0 always: the loop waits between passes (the next one is due minutes later)."""
        if self._done_at is not None and time.monotonic() - self._done_at < PURGE_EVERY_S:
            return 0
        self._done_at = time.monotonic()
        orphans = store.fail_unknown_destinations(self._engine, self._destinations)
        if orphans:
            log.warning("alerts: %d pending deliveries to destinations no longer configured failed", orphans)
        self.purge()
        return 0

    def purge(self) -> int:
        """Delete the finished deliveries older than `keep_finished_days`, a batch at a time; how many went."""
        before = datetime.now(UTC) - timedelta(days=self._config.keep_finished_days)
        total = 0
        while (deleted := store.purge_finished(self._engine, before, self._config.batch)) > 0:
            total += deleted
        if total:
            log.info("alerts: deleted %d deliveries finished before %s", total, before.isoformat(timespec="seconds"))
        return total
