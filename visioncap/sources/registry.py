"""Which frame source class reads each config `kind`, and opening a source from its config.

Each source module registers its class with `@register_source(ItsConfig)`, for every kind that config model
accepts; `open_source` looks the kind up. Adding a kind is a config model in `visioncap.config.sources` (its
`description`, and its entry in the `SourceConfig` union) plus one module here that registers its class and is
imported by the package's `__init__`.

The registry is filled by those imports in `visioncap/sources/__init__.py`, not by callers: Python runs a
package's `__init__` before any of its modules, so whoever reaches this module (or any source) has already
loaded every kind, and no caller can look a kind up in a half-filled registry. The list is explicit rather than
discovered (pkgutil over the package) so that what gets loaded can be read in one place and works the same from
a zipped or frozen install; a kind whose module is missing from it fails the registry test, which checks that
every kind a config accepts has a class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from visioncap.config.sources import SourceConfig, SourceConfigBase, config_kinds
from visioncap.errors import ConfigError
from visioncap.sources.base import FrameSource

if TYPE_CHECKING:
    from visioncap.sources.state import StateListener

SourceT = TypeVar("SourceT", bound=type[FrameSource])

_SOURCES: dict[str, type[FrameSource]] = {}


def register_source(config: type[SourceConfigBase]) -> Callable[[SourceT], SourceT]:
    """Class decorator: the decorated source reads every kind that `config` accepts."""

    def register(source: SourceT) -> SourceT:
        for kind in config_kinds(config):
            if kind in _SOURCES:
                raise ValueError(
                    f"source kind {kind!r} is registered twice: {_SOURCES[kind].__name__}, {source.__name__}"
                )
            _SOURCES[kind] = source
        return source

    return register


def registered_kinds() -> tuple[str, ...]:
    """Every kind a source class is registered for."""
    return tuple(_SOURCES)


def source_class(kind: str) -> type[FrameSource]:
    """The class that reads sources of `kind`; ConfigError when there is none."""
    try:
        return _SOURCES[kind]
    except KeyError:
        known = ", ".join(sorted(_SOURCES)) or "none"
        raise ConfigError(f"kind {kind!r}: no frame source reads it (kinds that have one: {known})") from None


def open_source(config: SourceConfig, on_state: StateListener | None = None) -> FrameSource:
    """The source for `config`, not yet reading; `on_state` hears the states of sources that watch a connection."""
    return source_class(config.kind)(config, on_state)
