"""A real, small tmpfs as a data dir: the tests of a full disk mount one (root is needed, as the tests run here and
in CI; elsewhere they skip, and on CI a missing mount fails instead of hiding behind a skip)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

TIMEOUT = 30  # seconds; a bound on a broken mount or unmount, never a measurement


@contextmanager
def mounted_tmpfs(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """`mount_point` (created here) as a tmpfs of `size_bytes`, unmounted on the way out."""
    mount_point.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        problem = None if mounted.returncode == 0 else (mounted.stderr.strip() or f"exit {mounted.returncode}")
    except FileNotFoundError as exc:
        problem = str(exc)
    if problem is not None:
        message = f"cannot mount a tmpfs as a small data dir ({problem}); run the tests as root"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield mount_point
    finally:
        # Lazily when a failed test left a file open on it (a connection of its SQLite): it goes once closed.
        if subprocess.run(["umount", str(mount_point)], timeout=TIMEOUT).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True, timeout=TIMEOUT)
