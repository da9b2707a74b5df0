"""Reading a YAML config file into a pydantic model, with every problem as one line naming file and field."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from visioncap.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)


def default_location(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def describe(err: ErrorDetails, location: Callable[[Sequence[int | str]], str] = default_location) -> str:
    """`field.path: message`; a whole-model check names its own field in its message."""
    message = err["msg"].removeprefix("Value error, ")
    where = location(err["loc"])
    return f"{where}: {message}" if where else message


def load_yaml_model(
    path: Path,
    model: type[Model],
    what: str,
    location: Callable[[Sequence[int | str]], str] = default_location,
) -> Model:
    """Parse `path` as YAML and validate it as `model`; `what` names the kind of file in messages."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a {what} must be a mapping of fields, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {'; '.join(describe(err, location) for err in exc.errors())}") from exc
