"""Schema creation and migration: numbered, idempotent steps recorded in `visioncap_schema`.

`ensure_schema(engine)` brings any database (new, or made by an older visioncap) to the current version in
one transaction per step: tables from the models, then the columns and indexes added since, then full-text
search (SQLite: an FTS5 table kept in sync by triggers; PostgreSQL: a stored tsvector column with a GIN
index). Each step checks what exists before changing it, so a step interrupted by a crash is simply run again.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Column, Connection, Engine, Integer, MetaData, Table, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError

from visioncap.errors import VisioncapError
from visioncap.store.records import Base, CameraRecord, CaptionRecord

# The text-search configuration of PostgreSQL.
PG_TS_CONFIG = "english"
PG_TSVECTOR = f"to_tsvector('{PG_TS_CONFIG}'::regconfig, coalesce(caption, ''::text))"
# Since step 7 the tsvector is a stored column that search.py matches against (and the GIN index covers).
PG_TSVECTOR_COLUMN = "caption_tsv"

_version_table = Table("visioncap_schema", MetaData(), Column("version", Integer, nullable=False))


def _create_tables(conn: Connection) -> None:
    Base.metadata.create_all(conn)


def _add_geometry_columns(conn: Connection) -> None:
    present = {column["name"] for column in inspect(conn).get_columns("captions")}
    json_type = "JSON" if conn.dialect.name == "postgresql" else "TEXT"
    for name, sql_type in (("frame_width", "INTEGER"), ("frame_height", "INTEGER"), ("image_region", json_type)):
        if name not in present:
            conn.execute(text(f"ALTER TABLE captions ADD COLUMN {name} {sql_type}"))


def _add_query_indexes(conn: Connection) -> None:
    for index in CaptionRecord.__table__.indexes:
        index.create(conn, checkfirst=True)


_SQLITE_FTS = (
    "CREATE VIRTUAL TABLE IF NOT EXISTS captions_fts USING fts5("
    "caption, content='captions', content_rowid='id', tokenize='porter unicode61')",
    "CREATE TRIGGER IF NOT EXISTS captions_fts_insert AFTER INSERT ON captions BEGIN "
    "INSERT INTO captions_fts(rowid, caption) VALUES (new.id, coalesce(new.caption, '')); END",
    "CREATE TRIGGER IF NOT EXISTS captions_fts_delete AFTER DELETE ON captions BEGIN "
    "INSERT INTO captions_fts(captions_fts, rowid, caption) VALUES ('delete', old.id, coalesce(old.caption, '')); "
    "END",
    "CREATE TRIGGER IF NOT EXISTS captions_fts_update AFTER UPDATE OF caption ON captions BEGIN "
    "INSERT INTO captions_fts(captions_fts, rowid, caption) VALUES ('delete', old.id, coalesce(old.caption, '')); "
    "INSERT INTO captions_fts(rowid, caption) VALUES (new.id, coalesce(new.caption, '')); END",
    # Rows written before the triggers existed.
    "INSERT INTO captions_fts(captions_fts) VALUES ('rebuild')",
)


def _full_text_search(conn: Connection) -> None:
    if conn.dialect.name == "sqlite":
        for statement in _SQLITE_FTS:
            conn.execute(text(statement))
    elif conn.dialect.name == "postgresql" and not _has_column(conn, PG_TSVECTOR_COLUMN):  # step 7 replaces it
        conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_captions_caption_fts ON captions USING gin ({PG_TSVECTOR})"))
    # Other backends: the API falls back to a LIKE search (see search.py).


def _cameras_table(conn: Connection) -> None:
    # What the pipeline reports of each camera (state, newest frame) for GET /v1/cameras.
    CameraRecord.__table__.create(conn, checkfirst=True)


# FTS5 prefix indexes for prefixes of 2-8 characters (of the stemmed word). The API makes the last word of every
# search a prefix; without an index FTS5 merges the lists of all words starting with it before returning anything
# (0.1 s for a word in a third of a million captions), with one it reads a single list lazily, newest rowid first.
_SQLITE_FTS_PREFIX = "prefix='2 3 4 5 6 7 8'"


def _full_text_prefix_index(conn: Connection) -> None:
    if conn.dialect.name != "sqlite":
        return
    created = conn.scalar(text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'captions_fts'"))
    if created is not None and _SQLITE_FTS_PREFIX in created:
        return
    # The triggers name the table, so they keep working once it is back; 'rebuild' indexes every row again.
    conn.execute(text("DROP TABLE IF EXISTS captions_fts"))
    conn.execute(text(_SQLITE_FTS[0].replace("tokenize=", f"{_SQLITE_FTS_PREFIX}, tokenize=")))
    conn.execute(text(_SQLITE_FTS[-1]))


def _has_column(conn: Connection, name: str) -> bool:
    return name in {column["name"] for column in inspect(conn).get_columns("captions")}


def _stored_tsvector(conn: Connection) -> None:
    """PostgreSQL: the tsvector as a stored generated column with its own GIN index, instead of the expression index.

    With only the expression index, every row a search looks at outside the index (the rows of a newest-first
    walk, the rechecks of a bitmap scan) computed to_tsvector again: 0.3-0.5 s for a two-word or prefix search on
    a million rows. Adding the column rewrites the table once (a lock for the length of the rewrite).
    """
    if conn.dialect.name != "postgresql":
        return
    if not _has_column(conn, PG_TSVECTOR_COLUMN):
        conn.execute(
            text(
                f"ALTER TABLE captions ADD COLUMN {PG_TSVECTOR_COLUMN} tsvector "
                f"GENERATED ALWAYS AS ({PG_TSVECTOR}) STORED"
            )
        )
    conn.execute(text("DROP INDEX IF EXISTS ix_captions_caption_fts"))
    conn.execute(
        text(f"CREATE INDEX IF NOT EXISTS ix_captions_caption_tsv ON captions USING gin ({PG_TSVECTOR_COLUMN})")
    )


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _create_tables,  # 1
    _add_geometry_columns,  # 2
    _add_query_indexes,  # 3
    _full_text_search,  # 4
    _cameras_table,  # 5
    _full_text_prefix_index,  # 6
    _stored_tsvector,  # 7
)
SCHEMA_VERSION = len(MIGRATIONS)


# Any constant: the key of the advisory lock PostgreSQL holds while one process migrates.
_PG_MIGRATION_LOCK = 0x76697363


def _lock_migrations(conn: Connection) -> None:
    """Hold, until this step's transaction ends, the lock that makes concurrent migrators take turns."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
    else:  # SQLite: a write takes the database's write lock (others wait up to the busy timeout)
        conn.execute(_version_table.update().values(version=_version_table.c.version))


def schema_version(engine: Engine) -> int:
    """The version recorded in the database; 0 for a database visioncap never migrated."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(_version_table.name):
            return 0
        return int(conn.scalar(select(_version_table.c.version)) or 0)


def ensure_schema(engine: Engine) -> int:
    """Run the steps this database has not had yet; returns the version it is at afterwards."""
    try:
        with engine.begin() as conn:
            _version_table.create(conn, checkfirst=True)
            if conn.scalar(select(_version_table.c.version)) is None:
                conn.execute(_version_table.insert().values(version=0))
        current = schema_version(engine)
        if current > SCHEMA_VERSION:
            raise VisioncapError(
                f"the database at {engine.url!r} has schema version {current}, newer than this visioncap "
                f"({SCHEMA_VERSION}): upgrade visioncap"
            )
        for number in range(current + 1, SCHEMA_VERSION + 1):
            with engine.begin() as conn:
                # The pipeline and the API may start together: one runs the step, the other waits for it and
                # then sees the new version (some steps, like adding a column, cannot simply run twice).
                _lock_migrations(conn)
                if int(conn.scalar(select(_version_table.c.version)) or 0) >= number:
                    continue
                MIGRATIONS[number - 1](conn)
                conn.execute(_version_table.update().values(version=number))
        return SCHEMA_VERSION
    except SQLAlchemyError as exc:
        raise VisioncapError(f"cannot prepare the database at {engine.url!r}: {exc}") from exc
