"""Credentials out of everything shown or stored: camera URLs, error messages, log lines.

Standard library only and free of other visioncap imports: the error classes use it, and they must stay cheap to
import (the CLI reports a bad config file before loading OpenCV, torch or SQLAlchemy).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote

MASK = "***"

# scheme://authority...; the authority ends at the first "/", "?" or "#" and its user info at the last "@",
# the same split FFmpeg makes, so what is masked here is exactly what FFmpeg sends as credentials.
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#]*)(?P<rest>.*)$", re.DOTALL)

# Query parameters IP cameras (and the services in front of them) take credentials in, compared after
# normalising the name (see _is_secret). Exact names only: `monkey` or `keyframe` are not secrets.
SECRET_PARAMETERS = frozenset(
    {"pass", "pwd", "password", "passwd", "token", "auth", "key", "apikey", "secret", "signature", "sig"}
)

# name=value in the query after "?" or "&", and after ";" (the older separator many camera CGIs still take) or
# "#" (single-page viewers put the query in the fragment). A value runs to the next separator; ";" pieces without
# "=" belong to it, because a raw ";" inside a password is far more likely than a bare flag after one, and masking
# too much can never leak.
_PARAMETER = re.compile(
    r"(?P<lead>[?&;#])(?P<name>[^=?&;#]*)=(?P<value>[^&;#]*(?:;[^&;#=]*(?=[&;#]|\Z))*)",
    re.DOTALL,
)
# RFC 3986 path parameters (/live;token=abc/main): the same after ";", ending at the segment's "/".
_PATH_PARAMETER = re.compile(r"(?P<lead>;)(?P<name>[^=;/]*)=(?P<value>[^;/]*(?:;[^;/=]*(?=[;/]|\Z))*)", re.DOTALL)
_QUERY_OR_FRAGMENT = re.compile(r"[?#]")

# A URL inside free text (an exception message, a log line); it ends at white space. The scheme's length is
# bounded so that a long run of letters and digits (a hex dump in a message) costs a bounded look per position.
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]{0,31}://\S+")
# What quotes or ends a URL in prose or in a repr() rather than belonging to it: kept out of the masking, so a
# value masked at the end of a quoted URL keeps its closing quote.
_TRAILING = "'\"`()[]{}<>,.:;!?"


def _is_secret(name: str) -> bool:
    # Servers decode %-escapes before reading a name (p%77d is pwd); `_` and `-` only spell the same name
    # differently (api_key, API-KEY).
    normal = unquote(name).strip().lower().replace("_", "").replace("-", "")
    return normal in SECRET_PARAMETERS


def _mask_parameter(match: re.Match[str]) -> str:
    if not _is_secret(match["name"]):
        return match[0]
    return f"{match['lead']}{match['name']}={MASK}"


def mask_credentials(url: str) -> str:
    """`url` with its credentials replaced by `***`: the user info password (rtsp://user:secret@host/x ->
    rtsp://user:***@host/x) and the values of credential parameters in the query, path parameters or fragment
    (http://cam/video.cgi?user=admin&pwd=secret -> http://cam/video.cgi?user=admin&pwd=***).

    Names are kept, as are every other part and their order, so the result still says which camera it is and how
    it is reached. An empty password is masked too: that a camera has none is itself worth keeping from a log.
    URLs without credentials, and anything that is not a URL (a webcam index, a device path), come back unchanged;
    masking a masked URL changes nothing.
    """
    if "://" not in url:
        return url
    match = _URL.match(url)
    if match is None:
        return url
    authority = match["authority"]
    user_info, at, host = authority.rpartition("@")
    if at:
        user, colon, _password = user_info.partition(":")
        if colon:
            authority = f"{user}:{MASK}@{host}"
    rest = match["rest"]
    end = _QUERY_OR_FRAGMENT.search(rest)
    cut = end.start() if end else len(rest)
    rest = _PATH_PARAMETER.sub(_mask_parameter, rest[:cut]) + _PARAMETER.sub(_mask_parameter, rest[cut:])
    if "://" in rest:
        # A URL inside this one (a relay's ?src=rtsp://user:pw@cam/..., or its path) has credentials of its own.
        rest = mask_urls(rest)
    return f"{match['scheme']}{authority}{rest}"


def secret_values(url: str) -> list[str]:
    """The raw values `mask_credentials` would mask in `url` (user-info password, credential parameters), in order
    of appearance; for refusing URLs that carry a secret inline."""
    match = _URL.match(url) if "://" in url else None
    if match is None:
        return []
    values: list[str] = []
    user_info, at, _host = match["authority"].rpartition("@")
    if at and ":" in user_info:
        values.append(user_info.partition(":")[2])
    rest = match["rest"]
    end = _QUERY_OR_FRAGMENT.search(rest)
    cut = end.start() if end else len(rest)
    for pattern, text in ((_PATH_PARAMETER, rest[:cut]), (_PARAMETER, rest[cut:])):
        values += [found["value"] for found in pattern.finditer(text) if _is_secret(found["name"])]
    for inner in _URL_IN_TEXT.findall(rest) if "://" in rest else ():
        values += secret_values(inner.rstrip(_TRAILING))
    return values


def _mask_url_in_text(match: re.Match[str]) -> str:
    token = match[0]
    url = token.rstrip(_TRAILING)
    return mask_credentials(url) + token[len(url) :]


def mask_urls(text: str) -> str:
    """`text` with every URL in it passed through `mask_credentials`; for messages that may quote a URL."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(_mask_url_in_text, text)


class MaskingFormatter(logging.Formatter):
    """A log formatter whose lines never carry a URL's credentials, wherever in the line the URL is: the message,
    its arguments, or the text of an exception and its traceback, which no logging call site controls."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_urls(super().format(record))
