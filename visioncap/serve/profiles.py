"""Model profiles: which model vLLM serves and with which arguments (YAML files in models/)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from visioncap.config.base import StrictModel
from visioncap.config.loading import load_yaml_model
from visioncap.errors import ConfigError


class BuildSpec(StrictModel):
    """How to make a model that is built locally rather than downloaded."""

    script: Path = Field(
        description="Builder script, run with the server environment's Python; relative to the profile."
    )
    args: list[str] = Field(default_factory=list, description="Arguments after the output folder.")


class ModelProfile(StrictModel):
    """One servable model."""

    name: str = Field(min_length=1, description="Profile name, as given to `visioncap serve --profile`.")
    served_model_name: str = Field(min_length=1, description="Name clients send as `model`.")
    model: str = Field(
        min_length=1,
        description="Hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct) or a local folder; relative folders are taken "
        "from the profile's folder.",
    )
    build: BuildSpec | None = Field(default=None, description="Builds `model` when the folder is missing.")
    vllm_args: list[str] = Field(default_factory=list, description="Further `vllm serve` arguments.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables for the server.")
    startup_timeout_s: float = Field(default=900.0, gt=0, description="Seconds to wait for /health.")
    path: Path | None = Field(default=None, exclude=True, description="The file this profile was read from.")

    def model_location(self) -> str:
        """The model argument for vLLM: a resolved folder for local models, the hub id otherwise."""
        if self.path is None:
            return self.model
        local = (self.path.parent / self.model).resolve()
        if self.build is not None or local.exists():
            return str(local)
        return self.model


def find_profile(name_or_path: str, models_dir: Path) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in {".yaml", ".yml"} and candidate.is_file():
        return candidate
    named = models_dir / f"{name_or_path}.yaml"
    if named.is_file():
        return named
    known = sorted(p.stem for p in models_dir.glob("*.yaml")) if models_dir.is_dir() else []
    raise ConfigError(f"profile {name_or_path!r} not found in {models_dir} (known profiles: {known})")


def load_profile(name_or_path: str, models_dir: Path) -> ModelProfile:
    path = find_profile(name_or_path, models_dir)
    profile = load_yaml_model(path, ModelProfile, "model profile")
    return profile.model_copy(update={"path": path.resolve()})
