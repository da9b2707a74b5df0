"""Stream URLs as they may appear in logs."""

from __future__ import annotations

import re

# scheme://authority...; the authority ends at the first "/", "?" or "#" and its user info at the last "@",
# the same split FFmpeg makes, so what is masked here is exactly what FFmpeg sends as credentials.
_URL = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<authority>[^/?#]*)(?P<rest>.*)$", re.DOTALL)


def mask_credentials(url: str) -> str:
    """`url` with its password replaced by `***` (rtsp://user:secret@host/x -> rtsp://user:***@host/x).

    URLs without a password, and anything that is not a URL (a webcam index, a device path), come back unchanged.
    """
    match = _URL.match(url)
    if match is None:
        return url
    user_info, at, host = match["authority"].rpartition("@")
    if not at:
        return url
    user, colon, _password = user_info.partition(":")
    if not colon:
        return url
    return f"{match['scheme']}{user}:***@{host}{match['rest']}"
