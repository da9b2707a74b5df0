"""How stream sources report the health of a live camera to their listener."""

from __future__ import annotations

from collections.abc import Callable

from visioncap.store.records import CameraState

StateListener = Callable[[str, CameraState], None]
"""Called with (camera id, new state) on every state change, from the source's reader threads: return quickly."""
