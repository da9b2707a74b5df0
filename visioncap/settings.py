"""Process-wide settings: environment variables (prefix VISIONCAP_) and an optional .env file."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    def resolved_database_url(self) -> str:
        """The configured database URL, or SQLite inside the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'visioncap.db').resolve()}"
