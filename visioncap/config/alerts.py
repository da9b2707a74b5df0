"""The alerts file (`visioncap alerts --config FILE`): rules, where alerts go, and the bounds of delivery."""

from __future__ import annotations

from datetime import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, Strict, create_model, model_validator

from visioncap.config.base import PlainText, StrictModel, TimeZoneName
from visioncap.config.loading import load_yaml_model
from visioncap.config.verify import VerifySpec, VlmEndpoint
from visioncap.config.zones import ZoneName

NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # also an MQTT topic level: no '/', '+' or '#'
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
_CLOCK = r"^([01]\d|2[0-3]):[0-5]\d$"  # HH:MM, 00:00 to 23:59


def _not_a_boolean(value: object) -> object:
    # JSON `true` is no count of people: pydantic would take it as 1. Rules come as API bodies too.
    if isinstance(value, bool):
        raise ValueError("a number, not a boolean")
    return value


# Rules also come as API request bodies: no coercion a JSON schema would not allow (`false` as 0 s, "yes" as true).
Count = Annotated[int, Field(ge=0, le=100_000), BeforeValidator(_not_a_boolean)]
Seconds = Annotated[float, Strict(), Field(ge=0, le=366 * 86_400)]
Flag = Annotated[bool, Strict()]


class TimeWindow(StrictModel):
    """A daily window of local time; one whose end is before its start runs across midnight (22:00-06:00)."""

    start: str = Field(pattern=_CLOCK, description="HH:MM, local time of the file's `timezone`, inclusive.")
    end: str = Field(pattern=_CLOCK, description="HH:MM, exclusive; before `start`: the window ends the next day.")

    def contains(self, moment: time) -> bool:
        start, end = time.fromisoformat(self.start), time.fromisoformat(self.end)
        if start <= end:
            return start <= moment < end
        return moment >= start or moment < end


class SemanticMatch(StrictModel):
    """Caption text close in meaning to `text` (cosine similarity of sentence embeddings)."""

    text: PlainText = Field(min_length=1, max_length=500, description="What the caption should be about.")
    threshold: Annotated[float, Strict()] = Field(
        default=0.5, ge=-1, le=1, description="Least cosine similarity (all-MiniLM-L6-v2) that matches."
    )


class AlertRule(StrictModel):
    """One rule: every condition given must hold (AND); an empty rule matches every caption."""

    name: Name = Field(description="Unique rule id: the MQTT topic `visioncap/alerts/<name>` and metric label.")
    cameras: list[Name] = Field(default_factory=list, description="Only these cameras; empty: all.")
    words: list[Annotated[PlainText, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=20,
        description="Words in the caption text (case-insensitive, whole words); see `all_words`.",
    )
    all_words: Flag = Field(default=False, description="Every word of `words` must appear; false: any one.")
    semantic: SemanticMatch | None = Field(default=None, description="Caption text similar in meaning.")
    min_people: Count | None = Field(default=None, description="At least this many people (stored count).")
    max_people: Count | None = Field(default=None, description="At most this many people.")
    activities: list[Annotated[PlainText, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=20,
        description="Any of these in the structured caption's activities (case-insensitive substring); a caption "
        "without structured fields never matches.",
    )
    windows: list[TimeWindow] = Field(
        default_factory=list, description="Only at these times of day (capture time); empty: at any time."
    )
    zones: list[ZoneName] = Field(
        default_factory=list,
        max_length=32,
        description="Only frames with a person standing in one of these zones (the selection config's `zones`); "
        "empty: anywhere.",
    )
    min_dwell_s: Seconds | None = Field(
        default=None,
        description="Only frames with a person who had stayed at least this many seconds in a zone (one of `zones`, "
        "when given): 'in back-door for 60 s or more'. Zones with `loiter_s` describe a person once that long.",
    )
    cooldown_s: Seconds = Field(
        default=300,
        description="After an alert of this rule for a camera, no other for that camera until this many seconds "
        "of capture time have passed; checked against stored alerts, so restarts keep it.",
    )
    notify: list[Name] = Field(
        default_factory=list, description="Names of destinations (webhooks, mqtt) to send to; empty: all of them."
    )
    verify: VerifySpec | None = Field(
        default=None,
        description="A watch rule: the VLM is asked this question about each caption the other conditions pass, "
        "and only a match fires (every answer is stored: GET /v1/alerts/decisions).",
    )


def _patch_model() -> type[StrictModel]:
    """AlertRule with every field but `name` optional and the same constraints: the body of a PATCH."""
    fields: dict[str, Any] = {}
    for name, info in AlertRule.model_fields.items():
        if name == "name":
            continue
        kind = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
        default = {"default_factory": info.default_factory} if info.default_factory else {"default": info.default}
        fields[name] = (kind, Field(description=info.description, **default))
    return create_model("AlertRulePatch", __base__=StrictModel, __doc__="Fields of a rule to replace.", **fields)


AlertRulePatch = _patch_model()


class WebhookDestination(StrictModel):
    """An HTTP endpoint that gets each alert as a signed JSON POST."""

    name: Name = Field(description="Destination id: metric label, and what rules name in `notify`.")
    url: str = Field(pattern=r"^https?://", description="Where to POST.")
    secret_env: str | None = Field(
        default=None,
        description="Environment variable holding the HMAC-SHA256 key of the `X-Visioncap-Signature` header; "
        "unset: requests are not signed.",
    )
    timeout_s: float = Field(default=5.0, gt=0, le=120, description="Whole request, connect to response.")


class MqttDestination(StrictModel):
    """An MQTT broker: alerts, every caption, and each camera's retained state, all at QoS 1."""

    name: Name = Field(default="mqtt", description="Destination id: metric label, and what rules name in `notify`.")
    host: str = Field(default="127.0.0.1", description="Broker host.")
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port.")
    client_id: str = Field(default="visioncap-alerts", max_length=64, description="MQTT client id.")
    username: str | None = Field(default=None, description="User name, if the broker wants one.")
    password_env: str | None = Field(default=None, description="Environment variable holding the password.")
    password_file: Path | None = Field(
        default=None, description="File holding the password (a mounted secret); not with `password_env`."
    )
    tls: bool = Field(default=False, description="Connect over TLS (port 8883, mostly); implied by `ca_file`.")
    ca_file: Path | None = Field(
        default=None,
        description="CA certificate(s) (PEM) the broker's certificate is checked against; unset with "
        "`tls: true`: the system's CAs.",
    )
    cert_file: Path | None = Field(default=None, description="Client certificate (PEM), if the broker wants one.")
    key_file: Path | None = Field(default=None, description="The client certificate's private key (PEM).")
    captions: bool = Field(
        default=True,
        description="Publish every stored caption to `visioncap/<camera>/captions` and the newest, retained, to "
        "`visioncap/<camera>/state`.",
    )
    home_assistant: bool = Field(
        default=False,
        description="Also publish retained Home Assistant discovery configs under `discovery_prefix`: per camera a "
        "people-count sensor, an occupancy binary sensor and a snapshot image; per rule an event entity; all "
        "available while `visioncap/status` is `online` (the connection's last will says `offline`).",
    )
    discovery_prefix: str = Field(
        default="homeassistant",
        pattern=r"^[A-Za-z0-9_-]+(/[A-Za-z0-9_-]+)*$",
        description="Home Assistant's MQTT discovery prefix.",
    )
    occupancy_quiet_s: float = Field(
        default=120.0,
        gt=0,
        le=86_400,
        description="A camera's occupancy turns off this many seconds (capture time) after its last caption with "
        "people; the service publishes the `OFF` itself.",
    )
    snapshot_max_bytes: int = Field(
        default=1_000_000,
        ge=0,
        le=10_000_000,
        description="Largest frame published (base64) as a camera's Home Assistant snapshot; larger ones are "
        "skipped, 0: no snapshots.",
    )
    ack_timeout_s: float = Field(default=10.0, gt=0, le=120, description="Longest wait for a PUBACK.")

    @model_validator(mode="after")
    def _password(self) -> MqttDestination:
        if self.password_env is not None and self.password_file is not None:
            raise ValueError("password_env and password_file: give one")
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca_file is not None or self.cert_file is not None


class DeliveryConfig(StrictModel):
    """Bounds of the delivery worker and the engine."""

    poll_s: float = Field(default=0.5, gt=0, le=60, description="Pause between passes when there is nothing to do.")
    batch: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="Captions read, or deliveries claimed and sent per destination, per pass (fewer for a slow "
        "destination: a pass claims about two minutes of its timeouts).",
    )
    max_pending: int = Field(
        default=100_000,
        ge=1,
        description="Most deliveries waiting per destination; a destination with this many gets its new messages "
        "recorded as failed while the others go on. When every destination has this many, the engine stops reading "
        "captions until some are sent or given up (nothing is dropped: the captions wait in the database).",
    )
    retry_initial_s: float = Field(default=1.0, gt=0, description="Wait after a delivery's first failure.")
    retry_max_s: float = Field(default=60.0, gt=0, description="Longest wait; the wait doubles up to it.")
    max_attempts: int = Field(default=20, ge=1, description="Attempts before a delivery is recorded as failed.")
    max_age_s: float = Field(
        default=86_400, gt=0, description="A delivery still not sent this long after it was made is failed."
    )
    keep_finished_days: float = Field(
        default=7,
        gt=0,
        le=36500,
        description="Days a finished delivery (delivered or failed) is kept, then deleted: with MQTT every caption "
        "makes two, so the table needs a bound. Alerts go with their captions' retention (VISIONCAP_RETENTION_DAYS).",
    )


class AlertsConfig(StrictModel):
    """The whole alerts file."""

    rules: list[AlertRule] = Field(
        default_factory=list, description="Rules from the file; the API shows them read-only and adds its own."
    )
    webhooks: list[WebhookDestination] = Field(default_factory=list, description="Webhook destinations.")
    mqtt: MqttDestination | None = Field(default=None, description="The MQTT broker, if any.")
    timezone: TimeZoneName = Field(default="UTC", description="IANA zone of the rules' time-of-day windows.")
    start_at_beginning: bool = Field(
        default=False,
        description="On the very first start (no stored cursor), go through every stored caption; false: only "
        "captions stored from then on.",
    )
    delivery: DeliveryConfig = Field(default_factory=DeliveryConfig, description="Delivery bounds and retries.")
    vlm: VlmEndpoint = Field(default_factory=VlmEndpoint, description="The VLM that answers watch rules (`verify`).")

    @model_validator(mode="after")
    def _names(self) -> AlertsConfig:
        rules = [rule.name for rule in self.rules]
        if len(set(rules)) != len(rules):
            raise ValueError("rules: two rules share a name")
        destinations = self.destination_names()
        if len(set(destinations)) != len(destinations):
            raise ValueError("webhooks, mqtt: two destinations share a name")
        for rule in self.rules:
            unknown = sorted(set(rule.notify) - set(destinations))
            if unknown:
                raise ValueError(f"rules: {rule.name} notifies unknown destinations {unknown}")
        return self

    def destination_names(self) -> list[str]:
        return [hook.name for hook in self.webhooks] + ([self.mqtt.name] if self.mqtt else [])


def load_alerts_config(path: Path) -> AlertsConfig:
    return load_yaml_model(path, AlertsConfig, "alerts file")
