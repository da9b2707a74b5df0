"""A throwaway PostgreSQL cluster for tests (Debian's `postgresql` package); the `postgres` fixture in
conftest.py starts one per session, `fresh_database` gives each test its own database in it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest
from sqlalchemy import create_engine


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


@contextmanager
def postgres_cluster(bin_dir: Path) -> Iterator[str]:
    """A cluster on a free loopback port for the duration of the block; its base URL (no database name)."""
    # Not under pytest's tmp dir: the server user must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="visioncap-pg-"))
    cluster, sock = root / "cluster", root / "sock"
    sock.mkdir()
    # initdb refuses root: run the server as the package's `postgres` user when we are root.
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if prefix:
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = partial(subprocess.run, check=True, capture_output=True, timeout=120)
    run([*prefix, str(bin_dir / "initdb"), "-D", str(cluster), "-U", "visioncap", "--auth=trust", "-E", "UTF8"])
    options = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(cluster), "-o", options, "-w", "-l", str(root / "log"), "start"])
    try:
        yield f"postgresql+psycopg://visioncap@127.0.0.1:{port}"
    finally:
        run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(cluster), "-m", "immediate", "stop"])
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(base_url: str) -> str:
    """A new, empty database on the cluster at `base_url`; its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(f"{base_url}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    admin.dispose()
    return f"{base_url}/{name}"


def database_url_for(request: pytest.FixtureRequest, folder: Path) -> str:
    """For a fixture parametrized over "sqlite"/"postgresql": a SQLite file in `folder`, or a fresh database on
    the session's `postgres` cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{folder / 'visioncap.db'}"
    return fresh_database(request.getfixturevalue("postgres"))
