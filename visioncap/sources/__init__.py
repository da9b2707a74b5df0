"""Frame sources: each yields Frames for one camera."""

from visioncap.sources.base import FrameSource
from visioncap.sources.factory import open_source
from visioncap.sources.image_folder import ImageFolderSource
from visioncap.sources.state import StateListener
from visioncap.sources.stream import StreamSource
from visioncap.sources.video_file import VideoFileSource

__all__ = [
    "FrameSource",
    "ImageFolderSource",
    "StateListener",
    "StreamSource",
    "VideoFileSource",
    "open_source",
]
