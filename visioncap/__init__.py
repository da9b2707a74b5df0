"""visioncap: camera streams in, searchable captions out."""

__version__ = "0.1.0"
