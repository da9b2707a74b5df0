"""Shared base for configuration models: unknown keys are errors, not silently ignored."""

from __future__ import annotations

import difflib
import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """A config section: every field described, extra keys refused, immutable once loaded."""

    # allow_inf_nan: `.inf` or "nan" for a timeout or rate is a typo that would fail only deep inside a run.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _known_zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown time zone {value!r}") from exc
    return value


# An IANA time zone name, checked when the file loads (a typo would otherwise surface at the first local time).
TimeZoneName = Annotated[str, AfterValidator(_known_zone)]

# Control characters (tab and line breaks aside) and lone surrogates: PostgreSQL refuses a NUL in a text column.
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def _plain(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("must not contain control characters (NUL and the like)")
    return value


# The document's pattern (regex escapes, read alike by Python, ECMA-262 and the Rust regex of JSON Schema tools),
# so that clients and the schema fuzzer know the rule; the validator above says it in words. Lone surrogates are
# left out of it (no Rust regex can name them; JSON text rarely carries one) and refused by the validator alone.
PLAIN_TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"

# Text a key holder writes that later reaches stored rows (a watch rule's question goes into each decision row):
# refused at submission, where it is a clear 422, rather than failing every later write that carries it.
PlainText = Annotated[str, AfterValidator(_plain), Field(json_schema_extra={"pattern": PLAIN_TEXT_PATTERN})]


def _keys(model: type[BaseModel]) -> list[str]:
    return [key for name, field in model.model_fields.items() for key in (name, field.alias) if key]


def _models_at(annotation: Any, loc: Sequence[int | str]) -> list[type[BaseModel]]:
    """The models a pydantic error location `loc` can end in, starting from a field's type: through lists and
    mappings (an index or key in `loc`) and unions (whose member pydantic may name in `loc`: a tag or a class)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _models_at(get_args(annotation)[0], loc)
    if origin in (Union, types.UnionType):
        members = get_args(annotation)
        found = [model for member in members for model in _models_at(member, loc)]
        if loc:  # the member's name in the location, before its own fields
            found += [model for member in members for model in _models_at(member, loc[1:])]
        return list(dict.fromkeys(found))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not loc:
            return [annotation]
        field = annotation.model_fields.get(str(loc[0]))
        return _models_at(field.annotation, loc[1:]) if field is not None else []
    if not loc or origin is None:
        return []
    args = get_args(annotation)
    if isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
        return _models_at(args[1], loc[1:])
    if isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset) and args:
        return _models_at(args[0], loc[1:])
    return []


def closest_key(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """For an unknown key at `loc` (an `extra_forbidden` error's location in `model`), the known key of the same
    section it most likely means (`analyse_fps` -> `analyze_fps`), or None when none is close."""
    if not loc:
        return None
    known = [key for found in _models_at(model, loc[:-1]) for key in _keys(found)]
    close = difflib.get_close_matches(str(loc[-1]), list(dict.fromkeys(known)), n=1)
    return close[0] if close else None
