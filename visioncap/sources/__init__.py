"""Frame sources: each yields Frames for one camera.

Importing the package imports every kind of source, which registers it with `registry`: see there why.
"""

from visioncap.sources.base import FrameSource
from visioncap.sources.image_folder import ImageFolderSource
from visioncap.sources.registry import open_source, registered_kinds, source_class
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
    "registered_kinds",
    "source_class",
]
