"""`visioncap alerts`: the engine and the delivery worker, each in its own thread, until stopped."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from sqlalchemy import Engine

from visioncap.alerts.delivery import DeliveryWorker, Sender
from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.alerts.mqtt import MqttSender
from visioncap.alerts.webhook import WebhookSender
from visioncap.config.alerts import AlertsConfig
from visioncap.config.settings import Settings

log = logging.getLogger(__name__)


def make_senders(config: AlertsConfig) -> dict[str, Sender]:
    senders: dict[str, Sender] = {hook.name: WebhookSender(hook) for hook in config.webhooks}
    if config.mqtt is not None:
        senders[config.mqtt.name] = MqttSender(config.mqtt)
    return senders


class AlertService:
    """Both loops; each pass that found work is followed at once by the next, an idle one waits `poll_s`."""

    def __init__(self, engine: Engine, config: AlertsConfig, metrics: AlertMetrics | None = None) -> None:
        self.metrics = metrics or AlertMetrics()
        self.engine = AlertEngine(engine, config, self.metrics)
        self._senders = make_senders(config)
        self.worker = DeliveryWorker(engine, self._senders, config.delivery, self.metrics)
        self._poll_s = config.delivery.poll_s
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(self.engine.run_once,), name="alerts-engine", daemon=True),
            threading.Thread(target=self._loop, args=(self.worker.run_once,), name="alerts-delivery", daemon=True),
        ]

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
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        for sender in self._senders.values():
            sender.close()

    def stop_soon(self) -> None:
        """Ends wait() and both loops (safe in a signal handler: it only sets an event)."""
        self._stop.set()

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
    return AlertService(engine, config)


def run_alerts(config: AlertsConfig, settings: Settings, metrics_port: int | None = None) -> None:
    """Run the alerts service in the foreground until SIGINT or SIGTERM; /metrics on 127.0.0.1:`metrics_port`."""
    from prometheus_client import start_http_server

    with build_alerts(config, settings) as service:
        if metrics_port is not None:
            start_http_server(metrics_port, addr="127.0.0.1", registry=service.metrics.registry)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: service.stop_soon())
        service.wait()
