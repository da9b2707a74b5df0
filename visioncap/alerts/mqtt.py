"""MQTT sender: publishes at QoS 1 and counts a delivery as delivered only once the broker's PUBACK is in.

paho's network thread keeps the connection and reconnects after a broker restart (backoff from 1 s doubling to
10 s); while it is down, sends fail at once (and are retried with backoff) instead of piling up in paho's memory,
where a crash would lose them. Each connection, each failure to connect and each loss is logged in one line with
the broker's address (never the credentials). The connection's last will sets `visioncap/status` to `offline`
(retained); each connection sets it `online`, and a clean close `offline`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from visioncap.alerts.delivery import Outcome
from visioncap.alerts.home_assistant import AVAILABILITY_TOPIC, OFFLINE, ONLINE
from visioncap.alerts.store import Due
from visioncap.config.alerts import MqttDestination
from visioncap.errors import ConfigError

QOS = 1
KEEPALIVE_S = 30
RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 10
CLOSE_WAIT_S = 2.0  # for the `offline` of a clean close to reach the broker

log = logging.getLogger(__name__)


def password_of(destination: MqttDestination) -> str | None:
    """The broker password from the environment or a file; a ConfigError naming where, never the value."""
    if destination.password_env is not None:
        password = os.environ.get(destination.password_env)
        if password is None:
            raise ConfigError(f"mqtt: environment variable {destination.password_env} is unset")
        return password
    if destination.password_file is not None:
        try:
            return destination.password_file.read_text().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"mqtt: cannot read password_file {destination.password_file}: {exc.strerror}") from exc
    return None


class MqttSender:
    def __init__(self, destination: MqttDestination) -> None:
        self.destination = destination
        self.address = f"{destination.host}:{destination.port}"
        self._failures = 0  # connection attempts failed in a row: what paho's backoff waits next
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=destination.client_id, protocol=mqtt.MQTTv311)
        if destination.username is not None:
            self._client.username_pw_set(destination.username, password_of(destination))
        if destination.uses_tls:
            try:
                self._client.tls_set(
                    ca_certs=str(destination.ca_file) if destination.ca_file else None,
                    certfile=str(destination.cert_file) if destination.cert_file else None,
                    keyfile=str(destination.key_file) if destination.key_file else None,
                    cert_reqs=ssl.CERT_REQUIRED,
                )
            except (OSError, ValueError) as exc:
                raise ConfigError(f"mqtt: TLS files unusable: {exc}") from exc
        self._client.will_set(AVAILABILITY_TOPIC, OFFLINE, qos=QOS, retain=True)
        self._client.on_connect = self._connected
        self._client.on_connect_fail = self._connect_failed
        self._client.on_disconnect = self._disconnected
        self._client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        log.info(
            "alerts: connecting to MQTT broker %s (%s%s)",
            self.address,
            "TLS" if destination.uses_tls else "plain",
            f", user {destination.username}" if destination.username else "",
        )
        self._client.connect_async(destination.host, destination.port, keepalive=KEEPALIVE_S)
        self._client.loop_start()

    def _next_wait(self) -> float:
        # paho's own backoff: the least wait, doubled after each failure in a row, up to the most.
        return float(min(RECONNECT_MIN_S * 2 ** (self._failures - 1), RECONNECT_MAX_S))

    def _connected(
        self, client: mqtt.Client, _userdata: object, _flags: object, reason: object, _props: object
    ) -> None:
        if getattr(reason, "is_failure", False):
            self._failures += 1
            log.warning(
                "alerts: MQTT broker %s refused the connection: %s; retrying in %.0f s",
                self.address,
                reason,
                self._next_wait(),
            )
            return
        self._failures = 0
        log.info("alerts: connected to MQTT broker %s", self.address)
        client.publish(AVAILABILITY_TOPIC, ONLINE, qos=QOS, retain=True)

    def _connect_failed(self, _client: mqtt.Client, _userdata: object) -> None:
        # paho calls this inside its `except OSError`: the exception at hand is why.
        error = sys.exc_info()[1]
        self._failures += 1
        log.warning(
            "alerts: cannot connect to MQTT broker %s: %s; retrying in %.0f s",
            self.address,
            error or "connection failed",
            self._next_wait(),
        )

    def _disconnected(
        self, _client: mqtt.Client, _userdata: object, _flags: object, reason: object, _props: object
    ) -> None:
        if getattr(reason, "is_failure", False):
            log.warning("alerts: lost MQTT broker %s: %s; reconnecting", self.address, reason)

    @property
    def timeout_s(self) -> float:
        return self.destination.ack_timeout_s

    def send(self, delivery: Due) -> Outcome:
        if not self._client.is_connected():
            return Outcome(False, f"not connected to {self.address}")
        info = self._client.publish(delivery.topic, delivery.body.encode(), qos=QOS, retain=delivery.retain)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            return Outcome(False, f"publish refused: {mqtt.error_string(info.rc)}")
        try:
            info.wait_for_publish(self.destination.ack_timeout_s)
        except (RuntimeError, ValueError) as exc:
            return Outcome(False, f"publish failed: {exc}")
        if not info.is_published():
            return Outcome(False, f"no PUBACK within {self.destination.ack_timeout_s} s")
        return Outcome(True)

    def close(self) -> None:
        if self._client.is_connected():
            # A clean disconnect does not send the last will: say `offline` ourselves.
            info = self._client.publish(AVAILABILITY_TOPIC, OFFLINE, qos=QOS, retain=True)
            # Closing anyway when it fails: the broker keeps the last `online` until the next start.
            with contextlib.suppress(RuntimeError, ValueError):
                info.wait_for_publish(CLOSE_WAIT_S)
        self._client.disconnect()
        self._client.loop_stop()
