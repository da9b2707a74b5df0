"""Process-wide settings: environment variables (prefix VISIONCAP_) and an optional .env file, read once per
command by `load_settings`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, TypeVar, overload

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from visioncap.config.camera_hosts import HostAllowList, parse_entry
from visioncap.config.loading import settings_problems
from visioncap.errors import ConfigError


class Settings(BaseSettings):
    """Settings shared by every command; per-pipeline choices live in the pipeline YAML instead."""

    model_config = SettingsConfigDict(env_prefix="VISIONCAP_", env_file=".env", extra="ignore")

    data_dir: Path = Field(
        default=Path("data"),
        description="Folder for the default SQLite database, saved frames and built models.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the caption database; defaults to SQLite at DATA_DIR/visioncap.db.",
    )
    vlm_base_url: str = Field(
        default="http://127.0.0.1:8000/v1",
        description="OpenAI-compatible base URL of the VLM, used when a pipeline file names none.",
    )
    vlm_api_key: SecretStr = Field(
        default=SecretStr("EMPTY"),
        description="API key sent to the VLM endpoint (vLLM accepts any value unless started with --api-key).",
    )
    server_python: Path = Field(
        default=Path(".venv-vllm/bin/python"),
        description="Python interpreter of the vLLM server environment, used by `visioncap serve`.",
    )
    models_dir: Path = Field(
        default=Path("models"),
        description="Folder searched for model profiles named with `visioncap serve --profile NAME`.",
    )
    retention_days: float | None = Field(
        default=None,
        gt=0,
        le=36500,
        description="Delete rows captured more than this many days ago, with their stored JPEGs (pending rows "
        "stay until captioned); unset (the default): keep everything. Sweeps run in `visioncap run` and "
        "`visioncap api` every RETENTION_INTERVAL_S, and once with `visioncap retention`.",
    )
    retention_camera_days: dict[str, Annotated[float, Field(gt=0, le=36500)] | None] = Field(
        default_factory=dict,
        description='Per-camera override of RETENTION_DAYS as JSON, e.g. {"dock": 30, "lobby": 3, "vault": null}; '
        "null keeps that camera's rows forever. Cameras not named follow RETENTION_DAYS.",
    )
    retention_min_free_mb: float | None = Field(
        default=None,
        gt=0,
        description="Keep at least this many MB (1 MB = 1,048,576 bytes, as `df -m` counts) free on the file "
        "system of DATA_DIR/frames: while free space is below it, each retention sweep deletes the oldest "
        "finished rows (captioned, failed, skipped; never pending) with their JPEGs, whatever their age, until it "
        "is back; also without RETENTION_DAYS. A pipeline whose frame write fails for lack of space asks for a "
        "sweep at once. Unset (the default): free space is not watched.",
    )
    retention_interval_s: float = Field(
        default=3600,
        ge=1,
        description="Seconds between retention sweeps in long-running processes (the first runs at start).",
    )

    # NoDecode: a list of hosts reads better as 10.0.0.0/8,cam.lan than as JSON (both are taken).
    camera_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts cameras may be at: networks (10.0.0.0/8, fd00::/8), addresses, host names (cam.lan) or "
        "every name under one (*.cams.lan), separated by commas or as a JSON list. Cameras added or changed through "
        "the API or `visioncap cameras` must be at one of them (checked when submitted), and a worker checks every "
        "network camera's host again, a name not listed resolved and each of its addresses checked, each time it "
        "opens it. Empty (the default): any host.",
    )

    @field_validator("camera_allowed_hosts", mode="before")
    @classmethod
    def _hosts_as_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [part for part in text.split(",") if part.strip()]
        return value

    @field_validator("camera_allowed_hosts")
    @classmethod
    def _hosts_parse(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_entry(entry)  # a typo fails at start, not as every camera refused
        return [entry.strip() for entry in value]

    def camera_hosts(self) -> HostAllowList:
        """CAMERA_ALLOWED_HOSTS, parsed."""
        return HostAllowList.of(self.camera_allowed_hosts)

    def resolved_database_url(self) -> str:
        """The configured database URL, or SQLite inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'visioncap.db').resolve()}"


S = TypeVar("S", bound=BaseSettings)


@overload
def load_settings() -> Settings: ...


@overload
def load_settings(kind: type[S]) -> S: ...


def load_settings(kind: type[BaseSettings] = Settings) -> BaseSettings:
    """`kind` read from the VISIONCAP_* variables and .env; a bad value is a ConfigError naming the variable."""
    try:
        return kind()
    except ValidationError as exc:  # one line per variable, not pydantic's multi-line dump
        prefix = kind.model_config.get("env_prefix") or ""
        lines = settings_problems(exc, kind, prefix)
        raise ConfigError("\n".join(f"invalid VISIONCAP_* setting {line}" for line in lines)) from exc
    # SettingsError: a value that is not the JSON its field needs (a list or dict setting); OSError and
    # UnicodeDecodeError (a ValueError): a .env not readable.
    except (SettingsError, OSError, ValueError) as exc:
        raise ConfigError(f"invalid VISIONCAP_* setting: {exc}") from exc
