"""Reading a YAML config file into a pydantic model, with every problem as one line naming file and field."""

from __future__ import annotations

import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from visioncap.config.base import closest_key
from visioncap.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)

# A config file is a page or two of YAML; anything far larger is a wrong path (a video, a log), not a config.
MAX_CONFIG_BYTES = 1024 * 1024
# Values after alias expansion: a few aliases can otherwise stand for billions of values ("billion laughs")
# that pydantic would walk one by one.
MAX_YAML_VALUES = 100_000
# Levels of nesting; the YAML composer and pydantic both recurse, and no config needs more than a handful.
MAX_YAML_DEPTH = 64
# Validation problems named in the one line; a file that is wrong everywhere would otherwise fill a screen.
MAX_PROBLEMS_SHOWN = 5

_MERGE_TAG = "tag:yaml.org,2002:merge"
_FILE_TYPES = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def one_line(text: str) -> str:
    """`text` with line breaks and runs of blanks as single spaces: a CLI error is exactly one line."""
    return " ".join(text.split())


def default_location(loc: Sequence[int | str]) -> str:
    return ".".join(str(part) for part in loc)


def describe(
    err: ErrorDetails,
    location: Callable[[Sequence[int | str]], str] = default_location,
    model: type[BaseModel] | None = None,
) -> str:
    """`field.path: message`; a whole-model check names its own field in its message. An unknown key of `model`
    is answered with the known key closest to it (a typo's likely meaning)."""
    message = one_line(err["msg"].removeprefix("Value error, "))
    if err["type"] == "extra_forbidden" and model is not None and (close := closest_key(model, err["loc"])):
        message += f"; did you mean `{close}`?"
    where = location(err["loc"])
    return f"{where}: {message}" if where else message


# A setting whose value may be a credential: its refused value is not repeated in the message.
_SECRET_WORDS = ("key", "secret", "password", "token")


def settings_problems(exc: ValidationError, model: type[BaseModel], prefix: str) -> list[str]:
    """One line per refused setting of `model`, read from environment variables named `prefix` + field:
    `VISIONCAP_RETENTION_DAYS: Input should be greater than 0 (got '-1')`; where in its value for a nested one."""
    problems = []
    for err in exc.errors():
        name, *inner = err["loc"] or ("",)
        variable = f"{prefix}{name}".upper()
        where = f" at {'.'.join(str(part) for part in inner)}" if inner else ""
        message = one_line(err["msg"].removeprefix("Value error, "))
        shown = err.get("input")
        field = model.model_fields.get(str(name))
        secret = any(word in str(name) for word in _SECRET_WORDS) or "Secret" in repr(field and field.annotation)
        if not secret and isinstance(shown, str | int | float) and not inner and repr(shown) not in message:
            message += f" (got {one_line(repr(shown))[:80]})"
        problems.append(f"{variable}{where}: {message}")
    return problems


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages ("a FIFO (named pipe)")."""
    return _FILE_TYPES.get(stat.S_IFMT(mode), "not a regular file")


def read_config_text(path: Path, what: str) -> str:
    """The text of a config file, or a ConfigError saying why it cannot be used (missing, a folder, binary...)."""
    cannot = f"{path}: cannot read {what}"
    try:
        # stat before open: opening a FIFO would block until some writer appears.
        info = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise ConfigError(f"{cannot}: it is a broken symbolic link (its target does not exist)") from None
        raise ConfigError(f"{cannot}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{cannot}: {one_line(exc.strerror or str(exc))}") from exc
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{cannot}: it is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{cannot}: it is {file_kind(info.st_mode)}, not a regular file")
    too_large = f"{path}: a {what} is at most {MAX_CONFIG_BYTES // 1024} KiB; this file is larger (is it a {what}?)"
    if info.st_size > MAX_CONFIG_BYTES:
        raise ConfigError(too_large)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)  # the size may change between stat and read
    except OSError as exc:
        raise ConfigError(f"{cannot}: {one_line(exc.strerror or str(exc))}") from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(too_large)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(
            f"{path}: a {what} must be UTF-8 text (YAML); byte 0x{data[exc.start]:02x} at line {line}, "
            f"column {column} is not UTF-8 (is it a binary file?)"
        ) from None


class _TreeProblem(Exception):
    def __init__(self, where: Sequence[int | str], problem: str) -> None:
        super().__init__(problem)
        self.where = ".".join(str(part) for part in where)
        self.problem = problem


def _check_tree(root: yaml.Node) -> None:
    """Refuse duplicate keys (YAML keeps the last silently), recursive aliases, alias bombs and deep nesting."""
    sizes: dict[int, int] = {}  # id(node) -> values under it with aliases expanded; a shared node is counted once
    open_nodes: set[int] = set()

    def size(node: yaml.Node, where: tuple[int | str, ...]) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_nodes:
            raise _TreeProblem(where, "a YAML alias refers to a node that contains it (recursive data)")
        if len(where) > MAX_YAML_DEPTH:
            raise _TreeProblem((*where[:3], "..."), f"nested more than {MAX_YAML_DEPTH} levels deep")
        open_nodes.add(id(node))
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child, (*where, index)) for index, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                label: int | str = "<key>"
                if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE_TAG:
                    label = key.value
                    line = key.start_mark.line + 1
                    if (key.tag, key.value) in first_line:
                        raise _TreeProblem(
                            (*where, label),
                            f"key given twice (lines {first_line[key.tag, key.value]} and {line}); "
                            "YAML would silently keep only the last",
                        )
                    first_line[key.tag, key.value] = line
                total += size(key, where) + size(value, (*where, label))
        if total > MAX_YAML_VALUES:
            raise _TreeProblem(where, f"more than {MAX_YAML_VALUES} values once YAML aliases are expanded")
        open_nodes.discard(id(node))
        sizes[id(node)] = total
        return total

    size(root, ())


def parse_yaml(text: str, path: Path) -> object:
    """One YAML document as Python data (safe types only), every YAML problem as a one-line ConfigError."""
    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # checks for unprintable characters right away
        node = loader.get_single_node()
        if node is None:
            return None
        _check_tree(node)
        return loader.construct_document(node)
    except _TreeProblem as exc:
        where = f"{exc.where}: " if exc.where else ""
        raise ConfigError(f"{path}: {where}{exc.problem}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = ", ".join(part for part in (exc.context, exc.problem) if part) or str(exc)
        raise ConfigError(f"{path}: invalid YAML{at}: {one_line(problem)}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ConfigError(
            f"{path}: invalid YAML at line {line}, column {column}: character U+{char:04X} is not allowed"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {one_line(str(exc))}") from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid YAML: nested too deeply") from None
    except (ValueError, TypeError, AttributeError) as exc:
        # Explicit tags with values their constructor cannot take (`!!int abc`, `!!timestamp x`) end up here.
        raise ConfigError(f"{path}: invalid YAML value: {one_line(str(exc)) or type(exc).__name__}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _type_name(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return f"a {type(value).__name__}"


def load_yaml_model(
    path: Path,
    model: type[Model],
    what: str,
    location: Callable[[Sequence[int | str]], str] = default_location,
) -> Model:
    """Parse `path` as YAML and validate it as `model`; `what` names the kind of file in messages."""
    text = read_config_text(path, what)
    raw = parse_yaml(text, path)
    if raw is None:
        raise ConfigError(f"{path}: the {what} is empty (no fields, only blanks or comments)")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a {what} must be a mapping of fields (`field: value` lines), got {_type_name(raw)}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = [describe(err, location, model) for err in exc.errors()]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            problems[MAX_PROBLEMS_SHOWN:] = [f"and {len(problems) - MAX_PROBLEMS_SHOWN} more problems"]
        raise ConfigError(f"{path}: {'; '.join(problems)}") from exc
