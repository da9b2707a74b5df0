"""Where the offline benchmarks' results go (`benchmarks/results/` of the repository) and the command they record.

The code lives in `visioncap/bench/`; what it measured lives under `benchmarks/`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visioncap.bench.machine import REPO

RESULTS_DIR = REPO / "benchmarks" / "results"
# The offline Ultralytics settings the detector benchmarks default to (visioncap.bench.detection), as recorded.
YOLO_ENV = "YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False YOLO_CONFIG_DIR=data/ultralytics"


def write_results(name: str, data: dict[str, Any], markdown: str, directory: Path = RESULTS_DIR) -> tuple[Path, Path]:
    """DIRECTORY/NAME.json (everything) and DIRECTORY/NAME.md (the table and the exact command)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{name}.json"
    md_path = directory / f"{name}.md"
    json_path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    md_path.write_text(markdown, encoding="utf-8")
    return json_path, md_path


def command_line(module: str, argv: Sequence[str]) -> str:
    """The command that reruns `python -m MODULE ARGV` from the repository root, as a results file records it."""
    return " ".join([YOLO_ENV, ".venv/bin/python", "-m", module, *argv])
