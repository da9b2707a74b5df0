"""Where the offline benchmarks' results go (`benchmarks/results/` of the repository) and the command they record.

The code lives in `visioncap/bench/`; what it measured lives under `benchmarks/`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from visioncap.bench.common.machine import REPO, portable

RESULTS_DIR = REPO / "benchmarks" / "results"
# The offline Ultralytics settings the detector benchmarks default to (visioncap.bench.detection.shared), as recorded.
YOLO_ENV = "YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False YOLO_CONFIG_DIR=data/ultralytics"


def write_results(
    name: str, data: dict[str, Any], render: Callable[[dict[str, Any]], str], directory: Path = RESULTS_DIR
) -> tuple[Path, Path]:
    """DIRECTORY/NAME.json (everything) and DIRECTORY/NAME.md (`render(data)`: the table and the exact command),
    with the load average at the end in `data["machine"]` (on a shared machine it explains a run's spread)."""
    if isinstance(data.get("machine"), dict):
        data["machine"]["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{name}.json"
    md_path = directory / f"{name}.md"
    json_path.write_text(json.dumps(portable(data), indent=2) + "\n", encoding="utf-8")
    md_path.write_text(render(data), encoding="utf-8")
    print(f"wrote {json_path} and {md_path}")
    return json_path, md_path


def machine_line(machine: dict[str, Any], software: str) -> str:
    """The results page's line on what was measured: date, CPU, load at start and end, `software`, commit."""
    m = machine
    return (
        f"Date: {m['date']}; machine: {m['cpu']}, {m['cpu_count']} cores, load average {m['load_average']} at "
        f"start, {m.get('load_average_end')} at end; {software}; commit {m['git_commit']}"
        + (" with uncommitted changes under visioncap/" if m["visioncap_uncommitted_changes"] else "")
    )


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command that reruns `python -m MODULE ARGV` from the repository root, as a results file records it."""
    return " ".join([YOLO_ENV, ".venv/bin/python", "-m", module, *argv])
