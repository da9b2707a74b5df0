"""Shared test helpers (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from visioncap.bench.common.netns import Host
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.serve import PortTakenError, check_own, free_port
from visioncap.serve.ports import bind_refused
from visioncap.store.schema import MIGRATIONS

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
TINY_MODEL = "visioncap-tiny"
PERSON_DETECTOR = "pkg:fall_detection/models/best.pt"
API_START_S = 120  # a bound on a `visioncap api` that never answers or never stops, never a measurement
PORT_TRIES = 3  # starts on fresh ports when other processes took them (each a collision of two random picks)


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


def invoke_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`visioncap ARGS` in this process: the entry point's Typer app and its one-line error report, without a
    Python start-up and its imports (about a second of CPU each). For what a command does and says;
    what only a process shows (its start-up, log lines on stderr, signals) is tested through `run_cli`. An
    exception the entry point would not report in one line fails the test here (the user would see a traceback)."""
    from typer.testing import CliRunner

    from visioncap.cli import app, report_error
    from visioncap.errors import VisioncapError

    result = CliRunner().invoke(app, list(args), env=env, catch_exceptions=True)
    stderr, code = result.stderr, result.exit_code
    if isinstance(result.exception, VisioncapError):
        reported = io.StringIO()
        with contextlib.redirect_stderr(reported):
            code = report_error(result.exception)
        stderr += reported.getvalue()
    elif result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["visioncap", *args], code, result.stdout, stderr)


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of series `name` (as exposed: `..._total` for a counter) in Prometheus text whose labels
    include `labels`; parsed by prometheus-client's own parser, so a label value with a space or an escaped quote
    cannot fool it."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def scrape_metric(root_url: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples on a server's /metrics whose labels include `labels`."""
    return metric(httpx.get(f"{root_url}/metrics", timeout=10).text, name, **labels)


def wait_for(
    condition: Callable[[], object], timeout: float, what: str | Callable[[], str], poll_s: float = 0.2
) -> None:
    """Poll a condition another process makes true (a database row, a metric); fail after `timeout` s. `what` may
    be a function: called on failure, it can say what the state was then."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {said}")
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


@contextmanager
def serve_cli(args: list[str], env: dict[str, str], *, cwd: Path = REPO, port: int | None = None) -> Iterator[str]:
    """`visioncap ARGS --port PORT` (a free port unless given) in the environment `env` as it is (not added to this
    one), running until the block ends; its base URL once it answers /healthz. Stopped (killed if it will not stop)
    after. A free port another process took before the command bound it (visioncap.serve.ports) is replaced by a new
    one, at most PORT_TRIES times."""
    command = " ".join(args)
    for attempt in range(1, PORT_TRIES + 1):
        chosen = port or free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "visioncap", *args, "--port", str(chosen), "--log-level", "WARNING"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        url = f"http://127.0.0.1:{chosen}"

        try:
            try:
                wait_for(
                    partial(_answers_healthz, process, chosen, command),
                    API_START_S,
                    f"`visioncap {command}` to answer /healthz",
                )
            except PortTakenError:
                if port is not None or attempt == PORT_TRIES:
                    raise
                continue
            yield url
            return
        finally:
            process.terminate()
            try:
                process.wait(timeout=API_START_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _answers_healthz(process: subprocess.Popen[str], port: int, command: str) -> bool:
    """Whether `process` answers /healthz on `port`; PortTakenError where another process holds the port."""
    if process.poll() is not None:
        said = process.communicate()[1]
        taken = bind_refused(port, said)
        if taken is not None:
            raise taken
        raise AssertionError(f"`visioncap {command}` exited: {said}")
    try:
        if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code != 200:
            return False
    except httpx.HTTPError:
        return False
    check_own(process.pid, port)  # not another server's /healthz
    return True


@contextmanager
def serve_api(data_dir: Path, database_url: str, read_key: str, **env: str) -> Iterator[str]:
    """`visioncap api` on `database_url` with one read key (`env` added to its environment) until the block ends;
    its base URL once it answers /healthz."""
    env = {
        **os.environ,
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_DATABASE_URL": database_url,
        "VISIONCAP_API_KEYS": json.dumps([{"name": "reader", "sha256": hash_key(read_key), "scopes": ["read"]}]),
        "VISIONCAP_API_READY_CHECK_VLM": "false",
        **env,
    }
    with serve_cli(["api"], env) as url:
        yield url


def database_at_version(engine: Engine, version: int) -> None:
    """An empty database as visioncap left it at schema `version`: its first migration steps, the version noted."""
    with engine.begin() as conn:
        for step in MIGRATIONS[:version]:
            step(conn)
        conn.execute(text("CREATE TABLE visioncap_schema (version INTEGER NOT NULL)"))
        conn.execute(text("INSERT INTO visioncap_schema VALUES (:version)"), {"version": version})


def on_ci() -> bool:
    """CI sets CI=true (and .ci/run exports it): every dependency of the suite is installed there by `make test`."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(what: str, install: str) -> NoReturn:
    """A test's dependency is not installed: skip on a developer's machine, fail under CI=true.

    On CI a skip would be a test that silently never ran, so the suite would pass without having checked anything
    that needs the dependency; every skip for a missing install goes through here.
    """
    message = f"{what} is not installed or not usable ({install})"
    if on_ci():
        pytest.fail(f"{message}; CI=true, where a missing dependency fails instead of skipping", pytrace=False)
    pytest.skip(message)


def require_module(name: str, install: str) -> ModuleType:
    """`import name`, or `missing()` when it is not installed (pytest.importorskip, but failing under CI=true)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"Python module {name!r}", install)


def chromium() -> str:
    """Debian's Chromium on PATH (the browser tests never use a browser Playwright downloads)."""
    path = shutil.which("chromium")
    if path is None:
        missing("Chromium", "apt-get install -y --no-install-recommends chromium")
    return path


# ENVIRONMENT.md's Chromium flags for this machine (the Playwright page test and the DevTools docs test).
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def http_get_from(host: Host, port: int, path: str) -> tuple[int, str]:
    """GET `path` on `port` of this machine from a process on `host` (another host: a network namespace), at this
    machine's address on their link: (status, body). A connection that fails raises CalledProcessError, with the
    client's error in its stderr."""
    url = f"http://{host.gateway_ip}:{port}{path}"
    probe = (
        "import sys, urllib.error, urllib.request\n"
        "try:\n"
        f"    answer = urllib.request.urlopen({url!r}, timeout=10)\n"
        "except urllib.error.HTTPError as error:\n"
        "    answer = error\n"
        "print(answer.status); print(answer.read().decode())\n"
    )
    done = subprocess.run(host.command([sys.executable, "-c", probe]), capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    status, _, body = done.stdout.partition("\n")
    return int(status), body.removesuffix("\n")


def children_of(pid: int, *, live: bool = False) -> list[int]:
    """The processes whose parent is `pid`, read from /proc; `live`: leave out zombies (exited, not yet reaped)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and not (live and fields[0] in ("Z", "X")):
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
    return found


def read_caption_events(response: httpx.Response, count: int) -> list[dict[str, Any]]:
    """The data of the first `count` `caption` events of a server-sent event stream (comments skipped)."""
    events: list[dict[str, Any]] = []
    event: dict[str, str] = {}
    for line in response.iter_lines():
        if line == "":
            if event.get("event") == "caption":
                events.append(json.loads(event["data"]))
                if len(events) == count:
                    return events
            event = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(": ")
            event[name] = value
    raise AssertionError(f"stream ended after {len(events)} events")


def offline_api_settings(data_dir: Path, database_url: str, key: str, **extra: Any) -> ApiSettings:
    """An API over `database_url` for in-process tests: one key with both scopes, no .env read, and the VLM at
    the discard port (refused at once), which readiness does not check."""
    return ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data_dir,
        database_url=database_url,
        api_keys=[ApiKey(name="tests", sha256=hash_key(key), scopes={"read", "write"})],
        api_ready_check_vlm=False,
        vlm_base_url="http://127.0.0.1:9/v1",
        **extra,
    )
