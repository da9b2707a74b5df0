"""Errors that the CLI turns into one clear line and an exit code instead of a traceback."""

from __future__ import annotations

from visioncap.redact import mask_urls


class VisioncapError(Exception):
    """An error with a message meant for the user; `exit_code` is what the CLI exits with.

    A URL in the message has its credentials masked: messages quote what the user wrote (a key of a config file,
    a path that was meant as a camera URL) and end up in terminals, logs and the database.
    """

    exit_code = 1

    def __init__(self, *args: object) -> None:
        # Masked once, here, rather than in __str__: repr(), pickling and `args` then carry no credential either.
        super().__init__(*(mask_urls(arg) if isinstance(arg, str) else arg for arg in args))


class ConfigError(VisioncapError):
    """A configuration file or setting is invalid; exits 2 like other usage errors."""

    exit_code = 2


class SourceError(VisioncapError):
    """A camera or video source cannot be opened or read."""


class VlmUnavailableError(VisioncapError):
    """The VLM endpoint cannot be reached or refuses requests."""
