"""The interface every frame source implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING

from visioncap.config.sources import SourceConfigBase
from visioncap.frames import Frame

if TYPE_CHECKING:
    from visioncap.sources.state import StateListener


class FrameSource(ABC):
    """Yields the frames of one camera that are due for analysis, in order, and says what the pipeline needs to
    know about them.

    An abstract class rather than a Protocol: a Protocol let sources leave members out, and callers then probed
    for them with getattr; here a source that misses one cannot be created, and the state every source keeps
    (camera, config, listener, frame count) lives in one place. Sources are made by `open_source` from their
    config, so every subclass takes `(config, on_state)`, with its own config model (and declares `_config` as
    that model).

    `camera` is the camera id, `frames_read` the number of frames decoded so far (due for analysis or not).
    """

    def __init__(self, config: SourceConfigBase, on_state: StateListener | None = None) -> None:
        self.camera = config.camera
        self.frames_read = 0
        self._config = config
        # Called on every state change by sources that watch a connection; sources that have none report nothing.
        self._on_state = on_state

    @abstractmethod
    def frames(self) -> Iterator[Frame]:
        """Frames to analyse; raises SourceError when the source cannot be opened or decoded."""

    @abstractmethod
    def stop(self) -> None:
        """Ends `frames()` early, from any thread; what was yielded stays valid."""

    @property
    @abstractmethod
    def description(self) -> str:
        """Where the frames come from, as logs, stored rows and API answers may show it: credentials masked."""

    @abstractmethod
    def time_anchor(self) -> datetime:
        """The wall-clock time of offset 0, for turning `Frame.offset_s` into capture times.

        Called for every analysed frame, so a source that has to look it up does so once.
        """

    def analyse_rate(self) -> float:
        """Frames per second the detector sees from this source (for the tracker's memory in frames)."""
        if self._config.analyze_fps is not None:
            return self._config.analyze_fps
        return self._full_rate()

    @abstractmethod
    def _full_rate(self) -> float:
        """The analysis rate when every frame is analysed (no `analyze_fps`)."""
