"""A throwaway PostgreSQL cluster for tests (Debian's `postgresql` package); the `postgres` fixture in
conftest.py starts one per session, `fresh_database` gives each test its own database in it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import missing
from sqlalchemy import create_engine

from visioncap.bench.common.pgcluster import PostgresCluster, postgres_bin


@contextmanager
def postgres_cluster(bin_dir: Path) -> Iterator[str]:
    """A cluster for the duration of the block; its base URL (no database name)."""
    cluster = PostgresCluster(bin_dir)
    cluster.start()
    try:
        yield cluster.base_url
    finally:
        cluster.remove()


@contextmanager
def own_cluster() -> Iterator[PostgresCluster]:
    """A cluster of the calling test's own, so that stopping it disturbs no other test; removed after."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        missing("PostgreSQL", "apt-get install -y postgresql")
    cluster = PostgresCluster(bin_dir)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


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
