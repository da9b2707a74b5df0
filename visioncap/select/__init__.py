"""Frame selection: which person frames get a caption."""

from visioncap.select.events import EventSelector

__all__ = ["EventSelector"]
