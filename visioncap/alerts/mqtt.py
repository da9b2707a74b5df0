"""MQTT sender: publishes at QoS 1 and counts a delivery as delivered only once the broker's PUBACK is in.

paho's network thread keeps the connection and reconnects after a broker restart; while it is down, sends fail
at once (and are retried with backoff) instead of piling up in paho's memory, where a crash would lose them.
"""

from __future__ import annotations

import os

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from visioncap.alerts.delivery import Outcome
from visioncap.alerts.store import Due
from visioncap.config.alerts import MqttDestination
from visioncap.errors import ConfigError

QOS = 1
KEEPALIVE_S = 30
RECONNECT_MIN_S = 1
RECONNECT_MAX_S = 10


class MqttSender:
    def __init__(self, destination: MqttDestination) -> None:
        self.destination = destination
        self._client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=destination.client_id, protocol=mqtt.MQTTv311)
        if destination.username is not None:
            password = None
            if destination.password_env is not None:
                password = os.environ.get(destination.password_env)
                if password is None:
                    raise ConfigError(f"mqtt: environment variable {destination.password_env} is unset")
            self._client.username_pw_set(destination.username, password)
        self._client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        self._client.connect_async(destination.host, destination.port, keepalive=KEEPALIVE_S)
        self._client.loop_start()

    def send(self, delivery: Due) -> Outcome:
        if not self._client.is_connected():
            return Outcome(False, f"not connected to {self.destination.host}:{self.destination.port}")
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
        self._client.disconnect()
        self._client.loop_stop()
