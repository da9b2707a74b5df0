"""Frame selection: which person frames get a caption."""

from visioncap.select.person_runs import PersonRunSelector

__all__ = ["PersonRunSelector"]
