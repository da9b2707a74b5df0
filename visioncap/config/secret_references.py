"""`${NAME}` references to camera secrets in a camera URL: where one may stand, which variables it may name, and
resolving them when the worker opens the camera.

A reference is replaced by a variable of the worker's environment, and the URL is then sent to the camera's host:
anywhere else than a credential, or to any other variable, it would send that variable (the database password,
the VLM key) to whichever host the URL names. So a reference must be the whole password of the user info or the
whole value of a credential parameter (`redact.secret_values`: what is masked wherever the URL is shown), and it
may name only variables made for camera secrets (VISIONCAP_CAMERA_SECRET_*). The rule is checked where a URL comes
in (the API, `visioncap cameras`, a pipeline file) and again when the worker resolves it, for rows written by
versions that did not check it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from visioncap.errors import ConfigError
from visioncap.redact import secret_values

CAMERA_SECRET_PREFIX = "VISIONCAP_CAMERA_SECRET_"
REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
EXAMPLE = f"user:${{{CAMERA_SECRET_PREFIX}DOOR}}@ in place of user:password@"

# Stands in for each reference while its place is looked up: letters only, so it changes no split of the URL.
_PLACEHOLDER = "vcreference{}x"


def is_camera_secret(name: str) -> bool:
    """Whether `name` is a variable a camera URL may reference (VISIONCAP_CAMERA_SECRET_ and at least one more
    character)."""
    return name.startswith(CAMERA_SECRET_PREFIX) and len(name) > len(CAMERA_SECRET_PREFIX)


def reference_problem(url: str) -> str | None:
    """Why the `${NAME}` references in `url` are not allowed, or None (also when it has none).

    Messages name the variable, never the URL: it may hold a password.
    """
    if "${" not in url:
        return None
    references = list(REFERENCE.finditer(url))
    if url.count("${") != len(references):
        return "contains `${` that is not a reference ${NAME} (a name of letters, digits and `_`, in braces)"
    for found in references:
        if not is_camera_secret(found[1]):
            return (
                f"references ${{{found[1]}}}: a camera URL may reference only environment variables named "
                f"{CAMERA_SECRET_PREFIX}* (the value is sent to the camera's host), as in {EXAMPLE}"
            )
    placeholders = [_PLACEHOLDER.format(index) for index in range(len(references))]
    marked, end = [], 0
    for found, placeholder in zip(references, placeholders, strict=True):
        marked += [url[end : found.start()], placeholder]
        end = found.end()
    credentials = set(secret_values("".join([*marked, url[end:]])))
    for found, placeholder in zip(references, placeholders, strict=True):
        if placeholder not in credentials:
            return (
                f"references ${{{found[1]}}} outside a credential: a reference must be the whole password "
                f"(user:${{NAME}}@) or the whole value of a credential parameter (password=, token=, key=, ...), "
                "not in the host, the path, another parameter or part of a value"
            )
    return None


def resolve_references(url: str, environ: Mapping[str, str] | None = None) -> str:
    """`url` with each `${NAME}` replaced by that environment variable; ConfigError when a reference breaks the
    rule (a row written by an older version) or names a variable that is not set."""
    if problem := reference_problem(url):
        raise ConfigError(f"camera URL {problem}")
    env = os.environ if environ is None else environ

    def value(match: re.Match[str]) -> str:
        name = match[1]
        if name not in env:
            raise ConfigError(f"environment variable {name} (referenced by the camera URL) is not set")
        return env[name]

    return REFERENCE.sub(value, url)
