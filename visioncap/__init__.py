"""visioncap: camera streams in, searchable captions out."""

from importlib.metadata import PackageNotFoundError, version

try:
    # One source of truth: pyproject.toml's version, as installed (`make release` tags it; images label it).
    __version__ = version("visioncap")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
