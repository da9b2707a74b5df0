"""From `make demo` to the web page: the command the demo prints last serves its database with the key it shows;
`visioncap api` says which database it serves (its password masked); the commands that only read (`api`,
`captions`) refuse a SQLite file that does not exist in one line (exit 2) instead of making an empty one, unless
`api --create` asks for it; `visioncap run`, which writes, still makes its own.

Real processes (`visioncap api` on a free port, `make -n`), real SQLite files.
"""

from __future__ import annotations

import os
import queue
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
from helpers import REPO, invoke_cli, run_cli, serve_cli, wait_for

from visioncap.frames import Caption
from visioncap.serve import free_port
from visioncap.store import CaptionStore, NewCaption, create_db_engine

TIMEOUT = 60  # seconds; a bound on a broken test, never a measurement
CAPTION = "a person in a blue coat waits at the bus stop"


def demo_database(data_dir: Path) -> None:
    """data_dir/demo.db with one captioned row, as `make demo` leaves it."""
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'demo.db'}"))
    store.create_schema()
    row_id = store.add(
        NewCaption(
            pipeline="demo",
            camera="demo-cam",
            source="data/demo.mp4",
            frame_index=1,
            offset_s=0.2,
            captured_at=datetime.now(UTC),
            reason="new-event",
            people=[{"x1": 1.0, "y1": 1.0, "x2": 20.0, "y2": 40.0, "confidence": 0.9, "class_id": 0, "track_id": 1}],
            image_width=64,
            image_height=48,
            model="visioncap-tiny",
            event_key="demo-cam:1",
            event_ids=[1],
            score=0.5,
            frame_width=64,
            frame_height=48,
        )
    )
    assert row_id is not None
    store.mark_captioned(row_id, Caption(CAPTION, "visioncap-tiny", 300, 12, 0.5), attempts=1)
    store.engine.dispose()


def test_make_demo_ends_by_printing_the_page_command() -> None:
    """The demo target's last step (a dry run: nothing is built or run)."""
    # As a user's shell runs it: under `make test-unit` the outer make's flags would add its directory lines.
    env = {key: value for key, value in os.environ.items() if key not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "demo", "APP_VENV=.venv"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert steps[-2].endswith("visioncap captions --limit 50"), steps[-3:]
    assert steps[-1].endswith("python -m visioncap.demo_page data .venv/bin/visioncap"), steps[-3:]


def test_the_printed_command_serves_the_demos_captions_with_the_printed_key(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    demo_database(data_dir)
    visioncap = str(Path(sys.executable).parent / "visioncap")
    printed = subprocess.run(
        [sys.executable, "-m", "visioncap.demo_page", str(data_dir), visioncap],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=True,
    ).stdout.splitlines()
    (command,) = [line.strip() for line in printed if f"{visioncap} api" in line]
    (key_line,) = [line for line in printed if "enter the key" in line]
    key = key_line.split("enter the key ")[1].split()[0]
    assert key.startswith("vca-") and key not in command  # only its hash is in the command
    words = shlex.split(command)
    env = dict(word.split("=", 1) for word in words[: words.index(visioncap)])
    args = words[words.index(visioncap) + 1 :]
    assert args == ["api", "--port", "8090"] and set(env) == {
        "VISIONCAP_DATA_DIR",
        "VISIONCAP_DATABASE_URL",
        "VISIONCAP_API_KEYS",
    }
    # As printed, from another folder, on a free port instead of 8090 (this machine's may be taken).
    with serve_cli(args[:1], {**os.environ, **env}, cwd=tmp_path) as url:
        listed = httpx.get(f"{url}/v1/captions", headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)
        assert listed.status_code == 200, listed.text
        assert [item["caption"] for item in listed.json()["items"]] == [CAPTION]
        page = httpx.get(f"{url}/", timeout=TIMEOUT)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]


def no_dotenv(env: dict[str, str]) -> dict[str, str]:
    """This process's environment without VISIONCAP_ settings, then `env`."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("VISIONCAP_")}, **env}


def test_api_and_captions_refuse_a_sqlite_file_that_does_not_exist(tmp_path: Path) -> None:
    for folder_exists in (False, True):
        folder = tmp_path / ("there" if folder_exists else "nowhere")
        if folder_exists:
            folder.mkdir()
        url = f"sqlite:///{folder / 'visioncap.db'}"
        env = {"VISIONCAP_DATA_DIR": str(tmp_path / "data"), "VISIONCAP_DATABASE_URL": url}
        for command, create_hint in ((["api"], True), (["captions"], False)):
            # `api` in a process of its own, with a time limit: one that does not refuse serves until stopped.
            if command == ["api"]:
                done = run_cli("api", "--port", str(free_port()), env=no_dotenv(env), timeout=TIMEOUT)
            else:
                done = invoke_cli(*command, env=env)
            assert done.returncode == 2, done.stderr
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            assert len(lines) == 1, done.stderr
            line = lines[0]
            assert line.startswith(
                f"error: visioncap {command[0]}: database {url} (VISIONCAP_DATABASE_URL) does not exist"
            )
            assert (f"nor does its folder {folder}" in line) is not folder_exists, line
            assert "`visioncap run` makes it" in line and ("--create" in line) is create_hint, line
        assert not (folder / "visioncap.db").exists() and folder.exists() is folder_exists  # nothing made


def test_the_default_database_is_named_when_it_is_missing(tmp_path: Path) -> None:
    done = invoke_cli("captions", env={"VISIONCAP_DATA_DIR": str(tmp_path / "data"), "VISIONCAP_DATABASE_URL": ""})
    assert done.returncode == 2
    assert (
        f"database sqlite:///{tmp_path / 'data' / 'visioncap.db'} (the default, VISIONCAP_DATA_DIR/visioncap.db)"
        in (done.stderr)
    )


def test_captions_says_which_database_it_read(tmp_path: Path) -> None:
    demo_database(tmp_path)
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    done = invoke_cli("captions", env={"VISIONCAP_DATABASE_URL": url, "VISIONCAP_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert f"database {url} (VISIONCAP_DATABASE_URL)" in done.stderr and CAPTION in done.stdout


@contextmanager
def api_process(args: list[str], env: dict[str, str], cwd: Path) -> Iterator[queue.Queue[str]]:
    """`visioncap api ARGS` on a free port; its stderr lines as they come, until the block ends (then stopped)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "visioncap", "api", *args, "--port", str(free_port()), "--log-level", "WARNING"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**no_dotenv(env), "PYTHONPATH": str(REPO)},
        cwd=cwd,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr or ()], daemon=True)
    reader.start()
    try:
        yield lines
    finally:
        process.terminate()
        process.wait(TIMEOUT)


def first_line_with(lines: queue.Queue[str], text: str) -> str:
    seen = []
    while True:
        line = lines.get(timeout=TIMEOUT)  # queue.Empty: the process said nothing more for that long
        seen.append(line)
        if text in line:
            return line.strip()
        assert len(seen) < 200, seen


def test_api_says_which_database_it_serves_with_its_password_masked(tmp_path: Path) -> None:
    """A PostgreSQL URL with a password (nothing listens there: the API starts anyway and answers 503 until the
    database is up), and --create on a SQLite file that does not exist yet, which it then makes."""
    url = "postgresql+psycopg://visioncap:s3cret-pw@127.0.0.1:9/visioncap"
    with api_process([], {"VISIONCAP_DATABASE_URL": url, "VISIONCAP_DATA_DIR": str(tmp_path)}, tmp_path) as lines:
        line = first_line_with(lines, "visioncap api: database")
    assert "postgresql+psycopg://visioncap:***@127.0.0.1:9/visioncap (VISIONCAP_DATABASE_URL)" in line
    assert "s3cret-pw" not in line and "page http://127.0.0.1:" in line

    made = tmp_path / "new" / "visioncap.db"
    env = {"VISIONCAP_DATABASE_URL": f"sqlite:///{made}", "VISIONCAP_DATA_DIR": str(tmp_path)}
    with api_process(["--create"], env, tmp_path) as lines:
        line = first_line_with(lines, "visioncap api: database")
        assert f"sqlite:///{made} (VISIONCAP_DATABASE_URL)" in line
        wait_for(made.exists, TIMEOUT, f"the API to make {made}")


def test_writers_still_make_their_sqlite_file(tmp_path: Path) -> None:
    """`visioncap run` writes, so its engine makes the folder and file (the check is the reading commands')."""
    from visioncap.store.database import missing_sqlite_file

    url = f"sqlite:///{tmp_path / 'new' / 'visioncap.db'}"
    assert missing_sqlite_file(url) == tmp_path / "new" / "visioncap.db"
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    store.engine.dispose()
    assert missing_sqlite_file(url) is None
    assert missing_sqlite_file("sqlite:///:memory:") is None
    assert missing_sqlite_file("postgresql+psycopg://u:p@127.0.0.1:9/x") is None
