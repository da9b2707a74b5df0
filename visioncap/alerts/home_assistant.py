"""Home Assistant over MQTT: the discovery configs (what HA's MQTT integration accepts: unique_id, device block,
availability) and each camera's occupancy, which turns off by itself after a quiet time.

Per camera: a people-count sensor and an occupancy binary sensor, both read from the retained
`visioncap/<camera>/occupancy` topic, with the last caption (`visioncap/<camera>/state`) as attributes, and a
snapshot image (the captioned frame, base64, on `visioncap/<camera>/snapshot`). Per rule: an event entity fed by
the rule's alert topic. Every entity is available while `visioncap/status` says `online`; the connection's last
will says `offline`, so HA greys them out when `visioncap alerts` dies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

AVAILABILITY_TOPIC = "visioncap/status"
ONLINE = "online"
OFFLINE = "offline"
OCCUPANCY_TOPIC = "visioncap/{camera}/occupancy"
SNAPSHOT_TOPIC = "visioncap/{camera}/snapshot"
ON = "ON"
OFF = "OFF"
EVENT_TYPE = "fired"  # the one event type of a rule's event entity
MAX_TRACKED = 10_000  # cameras whose occupancy is on at once; past it the one that ends first is turned off early

_ORIGIN = {"name": "visioncap"}


def object_id(name: str) -> str:
    """A name as HA wants a discovery topic's object id and a unique_id part: [A-Za-z0-9_-]."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name) or "_"


def _common(unique_id: str, name: str, device: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "unique_id": unique_id,
        "availability_topic": AVAILABILITY_TOPIC,
        "payload_available": ONLINE,
        "payload_not_available": OFFLINE,
        "device": device,
        "origin": _origin(),
    }


def _origin() -> dict[str, str]:
    return dict(_ORIGIN)


def camera_device(camera: str) -> dict[str, Any]:
    return {
        "identifiers": [f"visioncap_{object_id(camera)}"],
        "name": f"visioncap {camera}",
        "manufacturer": "visioncap",
        "model": "camera",
    }


def camera_configs(prefix: str, camera: str, level: str, state_topic: str) -> list[tuple[str, dict[str, Any]]]:
    """(discovery topic, config) of a camera's entities; `level` is its topic level, `state_topic` the retained
    last caption."""
    oid = object_id(camera)
    device = camera_device(camera)
    occupancy = OCCUPANCY_TOPIC.format(camera=level)
    people = _common(f"visioncap_{oid}_people", "People", device) | {
        "state_topic": occupancy,
        "value_template": "{{ value_json.people_count }}",
        "unit_of_measurement": "people",
        "state_class": "measurement",
        "icon": "mdi:account-group",
        "json_attributes_topic": state_topic,
    }
    occupied = _common(f"visioncap_{oid}_occupancy", "Occupancy", device) | {
        "state_topic": occupancy,
        "value_template": "{{ value_json.state }}",
        "payload_on": ON,
        "payload_off": OFF,
        "device_class": "occupancy",
        "json_attributes_topic": state_topic,
    }
    snapshot = _common(f"visioncap_{oid}_snapshot", "Snapshot", device) | {
        "image_topic": SNAPSHOT_TOPIC.format(camera=level),
        "image_encoding": "b64",
        "content_type": "image/jpeg",
    }
    return [
        (f"{prefix}/sensor/{people['unique_id']}/config", people),
        (f"{prefix}/binary_sensor/{occupied['unique_id']}/config", occupied),
        (f"{prefix}/image/{snapshot['unique_id']}/config", snapshot),
    ]


def rule_config_topic(prefix: str, rule: str) -> str:
    return f"{prefix}/event/visioncap_rule_{object_id(rule)}/config"


def rule_config(prefix: str, rule: str, alert_topic: str) -> tuple[str, dict[str, Any]]:
    """The event entity of a rule: fires `fired` with the alert (camera, caption, reason) as its attributes."""
    device = {
        "identifiers": ["visioncap_alerts"],
        "name": "visioncap alerts",
        "manufacturer": "visioncap",
        "model": "alert rules",
    }
    config = _common(f"visioncap_rule_{object_id(rule)}", f"Rule {rule}", device) | {
        "state_topic": alert_topic,
        "event_types": [EVENT_TYPE],
        "icon": "mdi:bell-ring",
    }
    return rule_config_topic(prefix, rule), config


@dataclass(slots=True)
class _Occupied:
    until: datetime  # capture time of the last caption with people + the quiet time


class Occupancy:
    """Which cameras are occupied and until when; the engine asks `expired` every pass and publishes their `OFF`.

    Only the engine's thread uses it. Bounded: at most MAX_TRACKED cameras are on at once."""

    def __init__(self, quiet_s: float, max_tracked: int = MAX_TRACKED) -> None:
        self.quiet = timedelta(seconds=quiet_s)
        self._max = max_tracked
        self._on: dict[str, _Occupied] = {}

    def seen(self, level: str, captured_at: datetime, people: int, now: datetime) -> datetime | None:
        """A caption of camera `level`: the time its occupancy now lasts until, or None when it is off (no people
        and not on, or a caption older than the quiet time: a backlog is not the present)."""
        current = self._on.get(level)
        if people > 0:
            until = captured_at + self.quiet
            if until > now and (current is None or until > current.until):
                self._on[level] = _Occupied(until)
                current = self._on[level]
        return current.until if current is not None and current.until > now else None

    def expired(self, now: datetime) -> list[str]:
        """Cameras whose occupancy ended by `now` (forgotten here: the caller publishes their OFF), and the
        earliest-ending ones past the bound."""
        ended = [level for level, occupied in self._on.items() if occupied.until <= now]
        excess = len(self._on) - len(ended) - self._max
        if excess > 0:
            alive = sorted((o.until, level) for level, o in self._on.items() if o.until > now)
            ended += [level for _, level in alive[:excess]]
        for level in ended:
            del self._on[level]
        return ended

    def next_end(self) -> datetime | None:
        return min((occupied.until for occupied in self._on.values()), default=None)
