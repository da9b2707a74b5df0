"""Errors that the CLI turns into one clear line and an exit code instead of a traceback."""

from __future__ import annotations


class VisioncapError(Exception):
    """An error with a message meant for the user; `exit_code` is what the CLI exits with."""

    exit_code = 1


class ConfigError(VisioncapError):
    """A configuration file or setting is invalid; exits 2 like other usage errors."""

    exit_code = 2


class SourceError(VisioncapError):
    """A camera or video source cannot be opened or read."""


class VlmUnavailableError(VisioncapError):
    """The VLM endpoint cannot be reached or refuses requests."""
