"""Home Assistant through a real Mosquitto: the discovery configs of every entity kind under a configured prefix, all
tied to the availability topic; a camera's occupancy on with people and off again after the quiet time, published
by the service itself; the snapshot; the rule's event; the last will when a real `visioncap alerts` is killed; the
log lines of start, connection, firing and failure; TLS with a CA file and a password file."""

from __future__ import annotations

import base64
import getpass
import logging
import os
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml
from alerts_support import MOSQUITTO, Mosquitto, Subscriber, add_caption, mosquitto
from helpers import start_cli, wait_for
from paho.mqtt.enums import CallbackAPIVersion

from visioncap.alerts.service import AlertService
from visioncap.config.alerts import AlertsConfig
from visioncap.frames import Caption, SelectionReason
from visioncap.serve import free_port
from visioncap.store import CaptionStore, create_db_engine
from visioncap.store.captions import NewCaption

pytestmark = pytest.mark.mqtt

PREFIX = "ha-test"
JPEG = b"\xff\xd8\xff\xe0" + b"visioncap test frame" * 10 + b"\xff\xd9"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    with mosquitto(tmp_path) as running:
        yield running


@pytest.fixture
def store(tmp_path: Path) -> CaptionStore:
    created = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    created.create_schema()
    return created


def captioned_with_frame(store: CaptionStore, data_dir: Path, camera: str, text: str, people: int) -> int:
    """A caption captured now whose frame is a JPEG in the data directory, as the pipeline stores it."""
    (data_dir / "frames").mkdir(parents=True, exist_ok=True)
    (data_dir / "frames" / f"{camera}.jpg").write_bytes(JPEG)
    new = NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=0,
        offset_s=0.0,
        captured_at=datetime.now(UTC),
        reason=SelectionReason.NEW_EVENT,
        people=[{"x1": 1.0, "y1": 1.0, "x2": 9.0, "y2": 9.0, "confidence": 0.9} for _ in range(people)],
        image_width=16,
        image_height=16,
        model="tiny",
        image_path=f"frames/{camera}.jpg",
    )
    row = store.add(new)
    assert row is not None
    store.mark_captioned(row, Caption(text, "tiny", 10, 5, 0.1, None), attempts=1)
    return row


def bodies(subscriber: Subscriber, topic: str) -> list[dict[str, Any]]:
    with subscriber.lock:
        return [body for found, body, _ in subscriber.messages if found == topic]


def last(subscriber: Subscriber, topic: str) -> dict[str, Any] | None:
    found = bodies(subscriber, topic)
    return found[-1] if found else None


def ha_config(port: int, **mqtt_extra: Any) -> dict[str, Any]:
    return {
        "mqtt": {
            "port": port,
            "home_assistant": True,
            "discovery_prefix": PREFIX,
            "occupancy_quiet_s": 1.5,
            "ack_timeout_s": 2,
            **mqtt_extra,
        },
        "rules": [{"name": "crowd", "min_people": 2, "cooldown_s": 0}],
        "delivery": {"poll_s": 0.05, "retry_initial_s": 0.2, "retry_max_s": 1},
    }


def test_entities_availability_occupancy_snapshot_and_rule_event(
    broker: Mosquitto, store: CaptionStore, tmp_path: Path
) -> None:
    data_dir = tmp_path / "data"
    config = AlertsConfig.model_validate(ha_config(broker.port))
    subscriber = Subscriber(broker.port, client_id="ha", clean=True, topics=("visioncap/#", f"{PREFIX}/#"))
    assert subscriber.subscribed.wait(20)
    service = AlertService(store.engine, config, data_dir=data_dir)
    try:
        service.start()
        wait_for(lambda: last(subscriber, "visioncap/status") == {"raw": "online"}, 20, "online")
        caption = captioned_with_frame(store, data_dir, "dock", "two people carry a box", people=2)
        occupancy = "visioncap/dock/occupancy"
        wait_for(lambda: last(subscriber, occupancy) is not None, 30, "occupancy")
        on = last(subscriber, occupancy)
        assert on is not None and on["state"] == "ON" and on["people_count"] == 2 and on["caption_id"] == caption
        # No sleep: the OFF is the service's own, after the quiet time with no caption of people.
        wait_for(lambda: (last(subscriber, occupancy) or {}).get("state") == "OFF", 20, "occupancy to turn off")
        assert last(subscriber, occupancy) == {"state": "OFF", "people_count": 0, "until": None}

        snapshot = last(subscriber, "visioncap/dock/snapshot")
        assert snapshot is not None and base64.b64decode(snapshot["raw"]) == JPEG
        alert = last(subscriber, "visioncap/alerts/crowd")
        assert alert is not None and alert["event_type"] == "fired" and alert["reason"] == "2 people"
        state = last(subscriber, "visioncap/dock/state")
        assert state is not None and state["caption"] == "two people carry a box"
    finally:
        service.stop()
    # A clean stop says offline itself (the last will is for a death).
    wait_for(lambda: last(subscriber, "visioncap/status") == {"raw": "offline"}, 20, "offline on stop")
    subscriber.close()

    configs = {topic: body for topic, body, _ in subscriber.messages if topic.startswith(f"{PREFIX}/")}
    kinds = {topic.split("/")[1]: body for topic, body in configs.items()}
    assert set(kinds) == {"sensor", "binary_sensor", "image", "event"}, sorted(configs)
    for topic, body in configs.items():
        assert topic.endswith(f"/{body['unique_id']}/config")
        assert body["availability_topic"] == "visioncap/status"
        assert (body["payload_available"], body["payload_not_available"]) == ("online", "offline")
        assert body["device"]["identifiers"] and body["device"]["name"]
    assert kinds["sensor"]["state_topic"] == occupancy
    assert kinds["sensor"]["value_template"] == "{{ value_json.people_count }}"
    assert (
        kinds["binary_sensor"].items()
        >= {
            "state_topic": occupancy,
            "device_class": "occupancy",
            "payload_on": "ON",
            "payload_off": "OFF",
            "json_attributes_topic": "visioncap/dock/state",  # the last caption as attributes
        }.items()
    )
    assert kinds["image"]["image_topic"] == "visioncap/dock/snapshot"
    assert kinds["image"]["image_encoding"] == "b64"
    assert kinds["event"]["state_topic"] == "visioncap/alerts/crowd"
    assert kinds["event"]["event_types"] == ["fired"]
    assert kinds["sensor"]["device"] == kinds["binary_sensor"]["device"] == kinds["image"]["device"]


class Lines:
    """A process's stderr, read line by line in a thread (a full pipe would stall the process)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stderr is not None
        stream = process.stderr
        self._thread = threading.Thread(target=lambda: self.lines.extend(iter(stream.readline, "")), daemon=True)
        self._thread.start()

    def having(self, text: str) -> list[str]:
        return [line for line in list(self.lines) if text in line]


def test_killed_process_goes_offline_through_its_last_will(
    broker: Mosquitto, store: CaptionStore, tmp_path: Path
) -> None:
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(ha_config(broker.port) | {"start_at_beginning": True}), encoding="utf-8")
    add_caption(store, "dock", datetime.now(UTC), "a crowd", people=3)
    subscriber = Subscriber(broker.port, client_id="watcher", clean=True, topics=("visioncap/#",))
    assert subscriber.subscribed.wait(20)
    env = {"VISIONCAP_DATABASE_URL": str(store.engine.url), "VISIONCAP_DATA_DIR": str(tmp_path / "data")}
    process = start_cli("alerts", "--config", str(path), env=env)
    lines = Lines(process)
    try:
        wait_for(lambda: last(subscriber, "visioncap/status") == {"raw": "online"}, 60, "online")
        wait_for(lambda: last(subscriber, "visioncap/alerts/crowd") is not None, 30, "the alert")
        wait_for(lambda: lines.having("rule crowd fired"), 10, lambda: f"the firing's log line in {lines.lines}")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=20)
        # The broker, not the process, says it: the connection died without a DISCONNECT.
        wait_for(lambda: last(subscriber, "visioncap/status") == {"raw": "offline"}, 30, "the last will")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=20)
        subscriber.close()
    assert len(lines.having("alerts: started")) == 1
    assert len(lines.having(f"connected to MQTT broker 127.0.0.1:{broker.port}")) == 1
    fired = lines.having("rule crowd fired")
    assert len(fired) == 1 and "camera dock" in fired[0] and "3 people" in fired[0]


def test_a_wrong_broker_port_is_said_at_once_and_each_failed_delivery_too(
    store: CaptionStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    port = free_port()  # nothing listens there
    config = AlertsConfig.model_validate(ha_config(port))
    service = AlertService(store.engine, config)

    def said(text: str) -> list[str]:
        return [record.getMessage() for record in list(caplog.records) if text in record.getMessage()]

    try:
        service.start()
        # paho tries at once; a refused connection is one line within the first attempt, naming the address.
        wait_for(lambda: said("cannot connect to MQTT broker"), 2.5, "the first connection failure's line")
        failure = said("cannot connect to MQTT broker")[0]
        assert f"127.0.0.1:{port}" in failure and "retrying in" in failure and "\n" not in failure
        add_caption(store, "dock", datetime.now(UTC), "a crowd", people=3)
        wait_for(lambda: said("failed (attempt 1"), 10, "a delivery failure's line")
        assert f"not connected to 127.0.0.1:{port}" in said("failed (attempt 1")[0]
        wait_for(lambda: said("rule crowd fired"), 10, "the firing's line")
    finally:
        service.stop()
    assert said("alerts: started")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def test_tls_with_a_ca_file_and_a_password_file(store: CaptionStore, tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "1",
            "-subj", "/CN=visioncap test CA", cwd=certs)  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1", cwd=certs)  # fmt: skip
    (certs / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "1", "-extfile", "san.ext", cwd=certs)  # fmt: skip
    secret = "s3cret-for-the-test"
    passwords = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(passwords), "visioncap", secret], check=True)
    os.chmod(passwords, 0o600)
    port = free_port()
    conf = tmp_path / "tls.conf"
    conf.write_text(
        f"listener {port} 127.0.0.1\ncafile {certs / 'ca.crt'}\ncertfile {certs / 'server.crt'}\n"
        f"keyfile {certs / 'server.key'}\nallow_anonymous false\npassword_file {passwords}\n"
        f"user {getpass.getuser()}\n"
    )
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stderr=subprocess.DEVNULL)
    password_file = tmp_path / "mqtt-password"
    password_file.write_text(secret + "\n")
    received: list[tuple[str, bytes]] = []
    watcher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tls-watcher")
    watcher.tls_set(ca_certs=str(certs / "ca.crt"))
    watcher.username_pw_set("visioncap", secret)
    watcher.on_connect = lambda client, *_: client.subscribe("visioncap/#", 1)
    watcher.on_message = lambda _c, _u, message: received.append((message.topic, message.payload))
    service: AlertService | None = None
    try:

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except OSError:
                return False
            return True

        wait_for(listening, 20, "mosquitto (TLS) to listen")
        watcher.connect("127.0.0.1", port)
        watcher.loop_start()
        config = AlertsConfig.model_validate(
            ha_config(port, username="visioncap", password_file=str(password_file), ca_file=str(certs / "ca.crt"))
        )
        service = AlertService(store.engine, config)
        service.start()
        caption = add_caption(store, "dock", datetime.now(UTC), "over TLS", people=1)
        wait_for(lambda: ("visioncap/status", b"online") in received, 30, "online over TLS")
        wait_for(lambda: any(t == "visioncap/dock/captions" and b'"over TLS"' in p for t, p in received), 30, "caption")
        assert any(f'"caption_id":{caption}'.encode() in p for t, p in received if t == "visioncap/dock/captions")
    finally:
        if service is not None:
            service.stop()
        watcher.disconnect()
        watcher.loop_stop()
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=20)


def test_tls_with_a_wrong_password_is_refused_in_one_line_without_the_password(
    store: CaptionStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The settings: a password file and a CA file are read; the password itself is never in a log line."""
    caplog.set_level(logging.INFO)
    password_file = tmp_path / "mqtt-password"
    password_file.write_text("never-log-me\n")
    with pytest.raises(ValueError, match="password_env and password_file"):
        AlertsConfig.model_validate(ha_config(1883, username="u", password_file=str(password_file), password_env="X"))
    port = free_port()
    config = AlertsConfig.model_validate(ha_config(port, username="u", password_file=str(password_file)))
    service = AlertService(store.engine, config)
    try:
        service.start()
        wait_for(lambda: any("cannot connect" in r.getMessage() for r in list(caplog.records)), 5, "a failure line")
    finally:
        service.stop()
    assert all("never-log-me" not in record.getMessage() for record in caplog.records)
    assert any("user u" in record.getMessage() for record in caplog.records)
