"""Health of a live camera, as reported by stream sources to logs and listeners."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum


class CameraState(StrEnum):
    """Where a live camera stands; the values are what logs and stored records show."""

    STARTING = "starting"
    """Opening the stream for the first time."""
    ONLINE = "online"
    """Frames are arriving."""
    RECONNECTING = "reconnecting"
    """The stream failed to open or was lost; it is being reopened with growing waits."""
    OFFLINE = "offline"
    """Still failing after the wait between attempts has grown to its maximum; retries go on at that pace."""
    FINISHED = "finished"
    """Stopped on request; no more frames will come."""


StateListener = Callable[[str, CameraState], None]
"""Called with (camera id, new state) on every state change, from the source's reader threads: return quickly."""
