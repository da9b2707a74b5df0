"""`visioncap alerts`: the engine, one delivery worker per destination, the housekeeping and the scheduled
digests (VISIONCAP_SUMMARIES_CONFIG's `digests`), each in its own thread, until stopped."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from visioncap.alerts.delivery import DeliveryWorker, Housekeeping, Sender
from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.mqtt import MqttSender
from visioncap.alerts.verify import Verifier
from visioncap.alerts.webhook import WebhookSender
from visioncap.config.alerts import AlertsConfig
from visioncap.config.settings import Settings, load_settings
from visioncap.errors import VisioncapError

if TYPE_CHECKING:
    from visioncap.summaries.schedule import Digests

log = logging.getLogger(__name__)

# How long stop() waits for a digest's VLM request in flight before it closes the writer under it.
DIGEST_STOP_S = 5.0
# How often the scheduled digests are checked: an hourly digest is written within this of its hour's end.
DIGEST_CHECK_S = 60.0


def make_senders(config: AlertsConfig) -> dict[str, Sender]:
    senders: dict[str, Sender] = {hook.name: WebhookSender(hook) for hook in config.webhooks}
    if config.mqtt is not None:
        senders[config.mqtt.name] = MqttSender(config.mqtt)
    return senders


def claimant_id() -> str:
    """This process's name on the deliveries it claims (64 characters at most): host, pid, and a random part for
    a pid reused in another container."""
    return f"{socket.gethostname()[:40]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class AlertService:
    """The loops; each pass that found work is followed at once by the next, an idle one waits `poll_s`."""

    def __init__(
        self,
        engine: Engine,
        config: AlertsConfig,
        metrics: AlertMetrics | None = None,
        data_dir: Path | None = None,
        verifier: Verifier | None = None,
        digests: Digests | None = None,
    ) -> None:
        self.metrics = metrics or AlertMetrics()
        self._config = config
        self.engine = AlertEngine(engine, config, self.metrics, data_dir=data_dir, verifier=verifier)
        self._senders = make_senders(config)
        claimant = claimant_id()
        self.workers = [
            DeliveryWorker(engine, name, sender, config.delivery, self.metrics, claimant)
            for name, sender in self._senders.items()
        ]
        self.housekeeping = Housekeeping(engine, list(self._senders), config.delivery)
        self._poll_s = config.delivery.poll_s
        self._stop = threading.Event()
        self.digests = digests
        self._threads = [
            threading.Thread(target=self._loop, args=(self.engine.run_once,), name="alerts-engine", daemon=True),
            threading.Thread(
                target=self._loop, args=(self.housekeeping.run_once,), name="alerts-housekeeping", daemon=True
            ),
            *(
                threading.Thread(
                    target=self._loop,
                    args=(worker.run_once,),
                    name=f"alerts-delivery-{worker.destination}",
                    daemon=True,
                )
                for worker in self.workers
            ),
        ]
        if digests is not None:
            loop = threading.Thread(target=self._digest_loop, args=(digests,), name="digests", daemon=True)
            self._threads.append(loop)

    def _digest_loop(self, digests: Digests) -> None:
        """The due digests, at once and then every DIGEST_CHECK_S: a digest is due once its hour or day is over, so
        it is written within that of its end (a VLM that failed is tried again at the next check)."""
        while not self._stop.is_set():
            try:
                digests.run_once()
            except Exception:
                log.exception("digests: the pass failed; trying again in %.0f s", DIGEST_CHECK_S)
            self._stop.wait(DIGEST_CHECK_S)

    def _loop(self, step: Callable[[], int]) -> None:
        while not self._stop.is_set():
            try:
                busy = step() > 0
            except Exception:
                # The database away, mostly: nothing is lost (the cursor and deliveries are durable); try later.
                log.exception(
                    "alerts: %s failed; trying again in %.1f s", threading.current_thread().name, self._poll_s
                )
                busy = False
            if not busy:
                self._stop.wait(self._poll_s)  # pacing of an idle loop, woken at once by stop()

    def start(self) -> None:
        mqtt = self._config.mqtt
        log.info(
            "alerts: started: %d rules in the file, destinations %s%s",
            len(self._config.rules),
            ", ".join(self._senders) or "none",
            f", Home Assistant discovery under {mqtt.discovery_prefix}/"
            if mqtt is not None and mqtt.home_assistant
            else "",
        )
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self.stop_soon()
        for thread in self._threads:
            if thread.name == "digests":
                # It may be inside a VLM request (up to the summaries' timeout_s): wait for it a bounded time only.
                # A digest not finished is not stored and stays due for the next start; the thread is a daemon.
                thread.join(DIGEST_STOP_S)
                if thread.is_alive():
                    log.info("digests: a VLM request was in flight at stop; that digest is written at the next start")
            elif thread.is_alive():
                thread.join()
        for sender in self._senders.values():
            sender.close()
        if self.engine.verifier is not None:
            self.engine.verifier.close()
        if self.digests is not None:
            self.digests.close()

    def stop_soon(self) -> None:
        """Ends wait() and the loops (safe in a signal handler: it only sets events)."""
        self._stop.set()
        if self.digests is not None:
            self.digests.stop()

    def wait(self) -> None:
        """Until stop_soon() or stop()."""
        self._stop.wait()

    def __enter__(self) -> AlertService:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def build_alerts(config: AlertsConfig, settings: Settings) -> AlertService:
    """The composition root of `visioncap alerts`: the database (schema brought up to date), the engine, the
    senders; nothing runs before `start()`."""
    from visioncap.store import create_db_engine
    from visioncap.store.schema import ensure_schema

    engine = create_db_engine(settings.resolved_database_url())
    ensure_schema(engine)
    verifier = Verifier(config.vlm, settings.vlm_base_url, settings.vlm_api_key.get_secret_value())
    return AlertService(
        engine, config, data_dir=settings.data_dir, verifier=verifier, digests=build_digests(engine, config, settings)
    )


def build_digests(engine: Engine, alerts: AlertsConfig, settings: Settings) -> Digests | None:
    """The scheduled digests of VISIONCAP_SUMMARIES_CONFIG, written through the VLM with the background key
    (VISIONCAP_VLM_API_KEY) and delivered like alerts; None when none are scheduled. A schedule without a model
    is refused here, at the start, rather than failing every hour."""
    from visioncap.config.api import ApiSettings
    from visioncap.config.summaries import SummariesSettings
    from visioncap.summaries import store
    from visioncap.summaries.schedule import Digests
    from visioncap.summaries.writer import SummaryWriter

    # load_settings: a malformed VISIONCAP_SUMMARIES_* value is one line naming it, not pydantic's dump
    summaries = load_settings(SummariesSettings)
    if not summaries.config.digests:
        return None
    model = summaries.model or load_settings(ApiSettings).ask_model
    if model is None:
        raise VisioncapError(
            "digests are scheduled (VISIONCAP_SUMMARIES_CONFIG) but no model is named: set VISIONCAP_SUMMARIES_MODEL"
        )
    store.ensure_table(engine)
    writer = SummaryWriter(summaries.config, settings.vlm_base_url, settings.vlm_api_key.get_secret_value(), model)
    cameras = ", ".join(f"{d.camera} ({d.every})" for d in summaries.config.digests)
    log.info("digests: %s, in %s, written by %s", cameras, summaries.config.time_zone, model)
    return Digests(engine, writer, summaries.config, alerts)


def run_alerts(config: AlertsConfig, settings: Settings, metrics_port: int | None = None) -> None:
    """Run the alerts service in the foreground until SIGINT or SIGTERM; /metrics on 127.0.0.1:`metrics_port`."""
    from prometheus_client import start_http_server

    service = build_alerts(config, settings)
    # Before the start (and its "started" line): a SIGTERM from then on is a clean stop, exit 0, however early.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: service.stop_soon())
    with service:
        if metrics_port is not None:
            start_http_server(metrics_port, addr="127.0.0.1", registry=service.metrics.registry)
        service.wait()
