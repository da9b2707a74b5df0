"""Shared test helpers (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
from sqlalchemy import Engine, text

from visioncap.store.schema import MIGRATIONS

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
TINY_MODEL = "visioncap-tiny"
PERSON_DETECTOR = "pkg:fall_detection/models/best.pt"


def pipeline_dict(video: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """The demo pipeline pointed at `video`; keyword sections are merged over it."""
    base: dict[str, Any] = {
        "name": "test",
        "sources": [{"camera": "cam-1", "path": str(video), "analyze_fps": 5}],
        "detector": {"weights": PERSON_DETECTOR, "person_classes": [0, 1], "image_size": 320},
        "selection": {"stable_frames": 2, "best_frame_window_s": 0.6, "recaption_interval_s": 30, "min_interval_s": 1},
        "caption": {"max_tokens": 8, "max_image_tokens": 256},
        "vlm": {"model": TINY_MODEL, "extra_body": {"ignore_eos": True}},
    }
    for key, value in sections.items():
        base[key] = {**base[key], **value} if isinstance(base.get(key), dict) else value
    return base


def write_pipeline(directory: Path, data: dict[str, Any] | str, name: str = "pipeline.yaml") -> Path:
    path = directory / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data), encoding="utf-8")
    return path


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`visioncap ARGS` in a child process, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "visioncap", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=REPO,
        check=False,
    )


def scrape_metric(root_url: str, name: str) -> float:
    """Sum of all samples of a Prometheus metric on a server's /metrics."""
    text = httpx.get(f"{root_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith((name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(condition: Callable[[], object], timeout: float, what: str, poll_s: float = 0.2) -> None:
    """Poll a condition another process makes true (a database row, a metric); fail after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(poll_s)


def start_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """`visioncap ARGS` in the background; the caller waits for it."""
    return subprocess.Popen(
        [sys.executable, "-m", "visioncap", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=REPO,
    )


def database_at_version(engine: Engine, version: int) -> None:
    """An empty database as visioncap left it at schema `version`: its first migration steps, the version noted."""
    with engine.begin() as conn:
        for step in MIGRATIONS[:version]:
            step(conn)
        conn.execute(text("CREATE TABLE visioncap_schema (version INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO visioncap_schema VALUES (:version)"), {"version": version})


# ENVIRONMENT.md's Chromium flags for this machine (the Playwright page test and the DevTools docs test).
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
