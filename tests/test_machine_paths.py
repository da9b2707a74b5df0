"""No tracked file names a path of one developer's machine: results files, generated READMEs and code cite
repository-relative paths, so that a clone elsewhere reads the same and nothing points at someone's disk."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from visioncap.bench.common.machine import REPO, portable

# Where checkouts and home folders live on developers' machines (and on this project's own), never in a clone's
# files. `/root/` stays allowed: container images run as root and name their own paths (HF_HOME in compose).
MACHINE_PATH = re.compile(r"(?<![\w.])(?:/work/(?:main|shared)\b|/home/[a-z_][\w-]*/|/Users/[\w-]+/)")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout.split(
        b"\0"
    )
    return [REPO / name.decode() for name in names if name]


def test_no_tracked_file_names_a_developer_machine_path() -> None:
    checkout = str(REPO)
    found = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary (a PNG, a video), or deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            # This checkout's own path catches any machine's layout, whatever its root is called.
            if MACHINE_PATH.search(line) or (checkout != "/" and f"{checkout}/" in line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:160]}")
    assert not found, "absolute paths of a machine in tracked files:\n" + "\n".join(found)


def test_results_records_are_made_relative_before_they_are_written() -> None:
    record = {
        "profile_file": str(REPO / "models" / "tiny.yaml"),
        "argv": ["--out", str(REPO / "benchmarks" / "soak"), "--minutes", 3],
        "tree": str(REPO),
        "cache": str(Path.home() / ".cache" / "x"),
        "rate": 1.5,
    }
    assert portable(record) == {
        "profile_file": "models/tiny.yaml",
        "argv": ["--out", "benchmarks/soak", "--minutes", 3],
        "tree": ".",
        "cache": "~/.cache/x" if str(Path.home()) != "/" else str(Path.home() / ".cache" / "x"),
        "rate": 1.5,
    }
