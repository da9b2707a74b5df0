"""Process-wide settings: environment variables (prefix VISIONCAP_) and an optional .env file, read once per
command by `load_settings`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

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

    def resolved_database_url(self) -> str:
        """The configured database URL, or SQLite inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'visioncap.db').resolve()}"


S = TypeVar("S", bound=Settings)


def load_settings(kind: type[S] = Settings) -> S:  # type: ignore[assignment]
    """`kind` read from the VISIONCAP_* variables and .env; a bad value is a ConfigError naming the variable."""
    try:
        return kind()
    # ValidationError (a ValueError) names the variable and the value it refused; SettingsError, a value that is
    # not the JSON its field needs (a list or dict setting); OSError and UnicodeDecodeError, a .env not readable.
    except (SettingsError, OSError, ValueError) as exc:
        raise ConfigError(f"invalid VISIONCAP_* setting: {exc}") from exc
