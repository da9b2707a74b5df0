"""A throwaway PostgreSQL cluster (Debian's `postgresql` package), for the tests (tests/pg.py, the `postgres`
fixture) and the benchmarks that need a database of their own (bench fleet): never for a deployment."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import create_engine


def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


class PostgresCluster:
    """A throwaway cluster on a free loopback port; `stop()` and `start()` take it down and back on the same port
    (what a database restart or outage looks like to its clients)."""

    def __init__(
        self, bin_dir: Path, listen: str = "127.0.0.1", trusted: tuple[str, ...] = (), max_connections: int = 100
    ) -> None:
        """`listen`: PostgreSQL's listen_addresses ("*" also takes addresses made later, such as a network
        namespace's link); `trusted`: further subnets whose clients may connect (loopback always may)."""
        self.bin_dir = bin_dir
        # Not under pytest's tmp dir: the server user must be able to reach it.
        self.root = Path(tempfile.mkdtemp(prefix="visioncap-pg-"))
        self.cluster, sock = self.root / "cluster", self.root / "sock"
        sock.mkdir()
        # initdb refuses root: run the server as the package's `postgres` user when we are root.
        self._prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._prefix:
            shutil.chown(self.root, "postgres")
            shutil.chown(sock, "postgres")
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._options = (
            f"-p {self.port} -k {sock} -c listen_addresses='{listen}' -c fsync=off -c max_connections={max_connections}"
        )
        self._run(str(bin_dir / "initdb"), "-D", str(self.cluster), "-U", "visioncap", "--auth=trust", "-E", "UTF8")
        if trusted:
            hba = self.cluster / "pg_hba.conf"
            lines = "".join(f"host all all {subnet} trust\n" for subnet in trusted)
            subprocess.run(
                [*self._prefix, "tee", "-a", str(hba)], input=lines.encode(), check=True, capture_output=True
            )
        self.base_url = f"postgresql+psycopg://visioncap@127.0.0.1:{self.port}"

    def _run(self, *args: str) -> None:
        subprocess.run([*self._prefix, *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        """Returns once the server accepts connections (`pg_ctl -w`)."""
        pg_ctl = str(self.bin_dir / "pg_ctl")
        self._run(pg_ctl, "-D", str(self.cluster), "-o", self._options, "-w", "-l", str(self.root / "log"), "start")

    def stop(self) -> None:
        """An immediate stop: open connections break as they would when the server dies."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.cluster), "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def new_database(self, prefix: str = "t") -> str:
        """A new, empty database; its name."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        admin = create_engine(f"{self.base_url}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {name}")
        admin.dispose()
        return name

    def url_for(self, database: str, host: str = "127.0.0.1") -> str:
        """The URL of `database` for a client that reaches this machine at `host` (a namespace's gateway_ip)."""
        return f"postgresql+psycopg://visioncap@{host}:{self.port}/{database}"
