"""Engine creation with the per-backend settings that concurrent readers and writers need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlean
import sqlite_vec
from pydantic_core import from_json
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from visioncap.errors import ConfigError

CONNECT_TIMEOUT_S = 5
# libpq's: data unacknowledged this long (ms) breaks the connection; an idle one is probed after 10 s, every 5 s,
# and dropped after 3 unanswered probes.
TCP_OPTIONS = {"tcp_user_timeout": 10_000, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
               "keepalives_count": 3}  # fmt: skip


# The server's side of the same (settable per session): a client cut off for good is noticed and its session
# ended within ~25 s, instead of after the kernel's two hours, so it stops holding a connection slot.
SERVER_TCP_OPTIONS = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 3}


def create_db_engine(url: str, *, idle_transaction_s: float | None = None) -> Engine:
    """An engine for `url`; SQLite gets WAL so readers never block the pipeline's writes.

    `idle_transaction_s` (PostgreSQL): the server ends a session whose transaction waits longer than this for
    its client's next statement, and with it the locks it holds. A worker's fenced writes lock their camera's
    lease row; one cut off from the database in the middle of such a write would otherwise keep the lock, and
    with it the camera from every other worker (their claims skip locked rows), until the server's keepalives
    end the session. For processes whose transactions are statements in a row, never work in between.
    """
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"database URL {url!r} is not valid: {exc}") from exc
    # JSON columns (boxes, track ids) are decoded on every read of a page: pydantic-core's parser is several
    # times faster than the json module's, and it is already installed.
    json_options: dict[str, Any] = {"json_deserializer": from_json}
    if parsed.get_backend_name() == "postgresql":
        # libpq waits for the operating system's TCP timeout (minutes) on a host that does not answer, and a query
        # on a connection whose path was cut waits for TCP's retransmissions to give up (~15 min): the pipeline
        # must learn within seconds that its database is away (keeping its frames on local disk meanwhile) and a
        # worker cut off must get its connections back within seconds of the network's return, not after TCP's
        # backoff. Options given in the URL win.
        server = {**SERVER_TCP_OPTIONS}
        if idle_transaction_s is not None:
            server["idle_in_transaction_session_timeout"] = max(1, round(idle_transaction_s * 1000))
        options = " ".join(f"-c {name}={value}" for name, value in server.items())
        defaults = {"connect_timeout": CONNECT_TIMEOUT_S, **TCP_OPTIONS, "options": options}
        json_options["connect_args"] = {k: v for k, v in defaults.items() if k not in parsed.query}
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **json_options)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # Caption workers write from several threads; each checks out its own connection. sqlean is the standard
    # library's sqlite3 with extension loading (this Python's sqlite3 has none), so sqlite-vec can load.
    engine = create_engine(url, module=sqlean, connect_args={"check_same_thread": False, "timeout": 30}, **json_options)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()
        # sqlite-vec's distance functions rank caption vectors (store/semantic.py).
        dbapi_connection.enable_load_extension(True)
        sqlite_vec.load(dbapi_connection)
        dbapi_connection.enable_load_extension(False)

    return engine


def masked_url(url: str) -> str:
    """`url` as it may be shown: its password, if any, as ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy reads: create_db_engine says so; show nothing of it meanwhile
        return "(not a database URL)"


def missing_sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names when it does not exist; None when it exists, and for in-memory SQLite and every
    other database. For the commands that only read (`api`, `captions`): connecting would create an empty file,
    and a mistyped path would look like a database with nothing stored."""
    try:
        parsed = make_url(url)
    except Exception:
        return None  # create_db_engine says what is wrong with it
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    if parsed.database.startswith("file:") or parsed.query.get("mode") == "memory":
        return None  # SQLite URI filenames: their own rules
    path = Path(parsed.database)
    return None if path.exists() else path.resolve()
