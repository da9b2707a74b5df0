"""Real parts for the alerts tests: captions written through the real store, a Mosquitto broker and an HTTP
receiver, and an MQTT subscriber."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from helpers import wait_for
from paho.mqtt.enums import CallbackAPIVersion

from visioncap.frames import Caption, SelectionReason
from visioncap.serve import check_own, free_port
from visioncap.store import CaptionStore
from visioncap.store.captions import NewCaption

MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"


def add_caption(
    store: CaptionStore,
    camera: str,
    captured_at: datetime,
    text: str,
    people: int = 1,
    activities: list[str] | None = None,
) -> int:
    """A captioned row, written as the pipeline writes it (pending, then captioned)."""
    new = NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=0,
        offset_s=0.0,
        captured_at=captured_at,
        reason=SelectionReason.NEW_EVENT,
        people=[{"x1": 1.0, "y1": 1.0, "x2": 9.0, "y2": 9.0, "confidence": 0.9} for _ in range(people)],
        image_width=16,
        image_height=16,
        model="tiny",
    )
    row = store.add(new)
    assert row is not None
    structured = None
    if activities is not None:
        structured = {"people_count": people, "activities": activities, "attributes": [], "summary": text}
    store.mark_captioned(row, Caption(text, "tiny", 10, 5, 0.1, structured), attempts=1)
    return row


class Mosquitto:
    """A real broker on a loopback port; stop() and start() take it down and back on the same port."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.config = folder / "mosquitto.conf"
        # Persistence: a subscriber's session (its subscription, the QoS 1 messages queued for it) outlives a
        # restart, as on a production broker. `user`: as root, mosquitto would switch to a user that cannot write here.
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence true\n"
            f"persistence_location {folder}/\nuser {getpass.getuser()}\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([MOSQUITTO, "-c", str(self.config)], stderr=subprocess.DEVNULL)

        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return False
            assert self.process is not None
            check_own(self.process.pid, self.port)  # not another process on a port both picked
            return True

        wait_for(listening, 20, "mosquitto to listen")

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=20)
        self.process = None


@contextmanager
def mosquitto(folder: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(folder)
    broker.start()
    try:
        yield broker
    finally:
        if broker.process is not None:
            broker.stop()


class Receiver:
    """A webhook receiver: answers each POST with the next status of `statuses` (the last one thereafter) and
    keeps every request it got."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.requests: list[tuple[float, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver.lock:
                    receiver.requests.append((time.monotonic(), dict(self.headers), body))
                    status = receiver.statuses[min(len(receiver.requests) - 1, len(receiver.statuses) - 1)]
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [json.loads(body) for _, _, body in self.requests]


class Subscriber:
    """A persistent-session QoS 1 subscriber: what the broker queued while it was away arrives when it is back."""

    def __init__(
        self,
        port: int,
        client_id: str = "test-subscriber",
        clean: bool = False,
        topics: tuple[str, ...] = ("visioncap/#",),
    ) -> None:
        self.messages: list[tuple[str, dict[str, Any], bool]] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean)
        self.client.on_connect = lambda client, *_: client.subscribe([(topic, 1) for topic in topics])
        self.client.on_subscribe = lambda *_: self.subscribed.set()
        self.client.on_message = self._message
        self.client.reconnect_delay_set(1, 2)
        self.client.connect_async("127.0.0.1", port)
        self.client.loop_start()

    def _message(self, _client: mqtt.Client, _userdata: object, message: mqtt.MQTTMessage) -> None:
        with self.lock:
            try:
                body = json.loads(message.payload)
            except ValueError:  # `visioncap/status` (online/offline), a snapshot (base64), a cleared retained
                body = {"raw": message.payload.decode(errors="replace")}
            self.messages.append((message.topic, body, bool(message.retain)))

    def ids(self, topic: str, key: str) -> list[int]:
        with self.lock:
            return [body[key] for found, body, _ in self.messages if found == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
