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

# A parameter is a credential when its name, normalised (see _normal_name), contains one of these words: services
# spell one credential many ways (access_token, accessToken, X-Auth-Token, sessionid, client_secret, passwd,
# apiKey), so a list of exact names always misses one. The asymmetry decides the rule: masking a harmless value
# costs a less readable log line, missing a credential leaks it. (`sessid`: PHPSESSID and its kind.)
CREDENTIAL_WORDS = ("token", "secret", "pass", "key", "auth", "sig", "session", "sessid", "credential")

# Credential names that hold none of those words, compared whole.
SECRET_PARAMETERS = frozenset({"pwd", "pw"})

# Harmless words that contain a credential word and are common in stream and player URLs (a keyframe interval,
# FFmpeg's keyint, passive or passthrough modes, a signal's name, an author); `monkey` is the test of the rule.
# They are taken out of a name before the words are looked for, not allowed as whole names, so `keyframe_token`
# is still a credential. None may begin a credential's name: `author` is harmless, `authorization` is not.
_HARMLESS_WORDS = re.compile(r"keyframe|keyint|monkey|passive|passthrough|signal|author(?!i[sz])")

# How many rounds of %-decoding a name or user info gets: servers decode once, but a relay in front of the camera
# may decode again, and decoding more can only mask more.
_DECODE_ROUNDS = 3

# The ":" that ends the user name in the user info, raw or %-escaped (user%3Asecret@host is user "user" with
# password "secret" once decoded, as FFmpeg and HTTP clients decode it; %253A after a second decoding).
_USER_INFO_COLON = re.compile(r":|%(?:25)*3a", re.IGNORECASE)

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


def _decoded(text: str) -> str:
    for _ in range(_DECODE_ROUNDS):
        decoded = unquote(text)
        if decoded == text:
            break
        text = decoded
    return text


def _normal_name(name: str) -> str:
    # Servers decode %-escapes before reading a name (p%77d is pwd); `_`, `-`, `.` and case only spell the same
    # name differently (api_key, API-KEY, apiKey).
    return re.sub(r"[\s_.-]", "", _decoded(name).lower())


def is_credential_name(name: str) -> bool:
    """Whether a query or path parameter named `name` holds a credential (see CREDENTIAL_WORDS)."""
    normal = _normal_name(name)
    if normal in SECRET_PARAMETERS:
        return True
    words = _HARMLESS_WORDS.sub(" ", normal)
    return any(word in words for word in CREDENTIAL_WORDS)


def _split_user_info(user_info: str) -> tuple[str, str, str] | None:
    """(user, separator, password) of raw user info, the separator as written (":" or an escape of it); None when
    it names a user only."""
    colon = _USER_INFO_COLON.search(user_info)
    if colon is None:
        return None
    return user_info[: colon.start()], colon[0], user_info[colon.end() :]


def _mask_parameter(match: re.Match[str]) -> str:
    if not is_credential_name(match["name"]):
        return match[0]
    return f"{match['lead']}{match['name']}={MASK}"


def mask_credentials(url: str) -> str:
    """`url` with its credentials replaced by `***`: the user info password (rtsp://user:secret@host/x ->
    rtsp://user:***@host/x, also when the ":" is %-escaped) and the values of credential parameters in the query,
    path parameters or fragment (http://cam/video.cgi?user=admin&pwd=secret -> http://cam/video.cgi?user=admin&pwd=***;
    which names are credentials: `is_credential_name`).

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
    if at and (parts := _split_user_info(user_info)) is not None:
        user, colon, _password = parts
        authority = f"{user}{colon}{MASK}@{host}"
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
    of appearance; for refusing URLs that carry a secret inline, and for where a `${NAME}` reference to the
    worker's environment may stand (visioncap.config.secret_references)."""
    match = _URL.match(url) if "://" in url else None
    if match is None:
        return []
    values: list[str] = []
    user_info, at, _host = match["authority"].rpartition("@")
    if at and (parts := _split_user_info(user_info)) is not None:
        values.append(parts[2])
    rest = match["rest"]
    end = _QUERY_OR_FRAGMENT.search(rest)
    cut = end.start() if end else len(rest)
    for pattern, text in ((_PATH_PARAMETER, rest[:cut]), (_PARAMETER, rest[cut:])):
        values += [found["value"] for found in pattern.finditer(text) if is_credential_name(found["name"])]
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
