"""`run_mixed`: every set-up of `bench mixed` (`run`), then its results files (`report`)."""

from __future__ import annotations

from typing import Any

from visioncap.bench.mixed.report import write_outputs
from visioncap.bench.mixed.run import MixedOptions, measure


def run_mixed(options: MixedOptions) -> dict[str, Any]:
    """Run every set-up, write `<out_dir>/<name>.json`, `.md`, `.png` (and `-raw.json`); return the results."""
    results, run, options = measure(options)
    write_outputs(results, run, options)
    return results
