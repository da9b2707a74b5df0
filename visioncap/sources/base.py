"""The interface every frame source implements."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from visioncap.frames import Frame


class FrameSource(Protocol):
    """Yields the frames of one camera that are due for analysis, in order."""

    camera: str

    def frames(self) -> Iterator[Frame]:
        """Frames to analyse; raises SourceError when the source cannot be opened or decoded."""
        ...
