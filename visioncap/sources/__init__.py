"""Frame sources: each yields Frames for one camera."""

from visioncap.sources.base import FrameSource
from visioncap.sources.video_file import VideoFileSource

__all__ = ["FrameSource", "VideoFileSource"]
