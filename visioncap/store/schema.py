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
from visioncap.store.records import (
    AlertCursorRecord,
    AlertDeliveryRecord,
    AlertRecord,
    AlertRuleRecord,
    Base,
    CameraConfigRecord,
    CameraLeaseRecord,
    CameraRecord,
    CaptionCountRecord,
    CaptionEventCountRecord,
    CaptionEventRecord,
    CaptionRecord,
    CaptionZoneRecord,
    PipelineSeedRecord,
    WorkerRecord,
    table_of,
)

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
    for index in table_of(CaptionRecord).indexes:
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
    table_of(CameraRecord).create(conn, checkfirst=True)


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
    # The planner chooses between walking the capture-time index and reading the GIN index by how many rows it
    # expects a word to match. With the default statistics a rare word (or prefix) missing from the sampled
    # common elements was guessed at ~0.15 % of the rows, and a newest-first walk through a million rows (0.3 s)
    # chosen; sampling 300,000 rows keeps ten thousand words' frequencies and puts unknown ones below 0.01 %.
    conn.execute(text(f"ALTER TABLE captions ALTER COLUMN {PG_TSVECTOR_COLUMN} SET STATISTICS 1000"))
    conn.execute(text("DROP INDEX IF EXISTS ix_captions_caption_fts"))
    conn.execute(
        text(f"CREATE INDEX IF NOT EXISTS ix_captions_caption_tsv ON captions USING gin ({PG_TSVECTOR_COLUMN})")
    )


# Counts per camera for GET /v1/cameras and /metrics, kept by triggers in the writer's transaction: counting a
# million rows took 4 s (PostgreSQL) to 15 s (SQLite) per request. `status` and `event_key` changes move a row
# between counts (a pending row becoming captioned); deletes (retention) take it out.
# What a row adds to the counts (`new`) and takes from them (`old`); an update does both.
_SQLITE_COUNT_IN = (
    "INSERT INTO caption_counts(camera, status, row_count) VALUES (new.camera, new.status, 1) "
    "ON CONFLICT(camera, status) DO UPDATE SET row_count = row_count + 1; "
    "INSERT INTO caption_events(camera, event_key, row_count) VALUES (new.camera, new.event_key, 1) "
    "ON CONFLICT(camera, event_key) DO UPDATE SET row_count = row_count + 1; "
)
_SQLITE_COUNT_OUT = (
    "UPDATE caption_counts SET row_count = row_count - 1 WHERE camera = old.camera AND status = old.status; "
    "UPDATE caption_events SET row_count = row_count - 1 WHERE camera = old.camera AND event_key = old.event_key; "
    "DELETE FROM caption_events WHERE camera = old.camera AND event_key = old.event_key AND row_count <= 0; "
)
_SQLITE_COUNT_TRIGGERS = (
    f"CREATE TRIGGER IF NOT EXISTS captions_counts_insert AFTER INSERT ON captions BEGIN {_SQLITE_COUNT_IN}END",
    f"CREATE TRIGGER IF NOT EXISTS captions_counts_delete AFTER DELETE ON captions BEGIN {_SQLITE_COUNT_OUT}END",
    "CREATE TRIGGER IF NOT EXISTS captions_counts_update AFTER UPDATE OF camera, status, event_key ON captions "
    "WHEN old.camera IS NOT new.camera OR old.status IS NOT new.status OR old.event_key IS NOT new.event_key "
    f"BEGIN {_SQLITE_COUNT_OUT}{_SQLITE_COUNT_IN}END",
)
_PG_COUNT_FUNCTION = """CREATE OR REPLACE FUNCTION visioncap_caption_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('DELETE', 'UPDATE') THEN
        UPDATE caption_counts SET row_count = row_count - 1 WHERE camera = OLD.camera AND status = OLD.status;
        UPDATE caption_events SET row_count = row_count - 1
            WHERE camera = OLD.camera AND event_key = OLD.event_key;
        DELETE FROM caption_events WHERE camera = OLD.camera AND event_key = OLD.event_key AND row_count <= 0;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        INSERT INTO caption_counts AS c (camera, status, row_count) VALUES (NEW.camera, NEW.status, 1)
            ON CONFLICT (camera, status) DO UPDATE SET row_count = c.row_count + 1;
        INSERT INTO caption_events AS e (camera, event_key, row_count) VALUES (NEW.camera, NEW.event_key, 1)
            ON CONFLICT (camera, event_key) DO UPDATE SET row_count = e.row_count + 1;
    END IF;
    RETURN NULL;
END $$"""
PG_COUNT_TRIGGER = "captions_counts_insert_delete"
_PG_COUNT_TRIGGERS = (
    f"CREATE TRIGGER {PG_COUNT_TRIGGER} AFTER INSERT OR DELETE ON captions "
    "FOR EACH ROW EXECUTE FUNCTION visioncap_caption_counts()",
    "CREATE TRIGGER captions_counts_update AFTER UPDATE OF camera, status, event_key ON captions FOR EACH ROW "
    "WHEN (OLD.camera IS DISTINCT FROM NEW.camera OR OLD.status IS DISTINCT FROM NEW.status "
    "OR OLD.event_key IS DISTINCT FROM NEW.event_key) EXECUTE FUNCTION visioncap_caption_counts()",
)


_SQLITE_EVENT_TRIGGERS = (
    "CREATE TRIGGER IF NOT EXISTS caption_events_insert AFTER INSERT ON caption_events WHEN new.event_key != '' "
    "BEGIN INSERT INTO caption_event_counts(camera, event_count) VALUES (new.camera, 1) "
    "ON CONFLICT(camera) DO UPDATE SET event_count = event_count + 1; END",
    "CREATE TRIGGER IF NOT EXISTS caption_events_delete AFTER DELETE ON caption_events WHEN old.event_key != '' "
    "BEGIN UPDATE caption_event_counts SET event_count = event_count - 1 WHERE camera = old.camera; END",
)
_PG_EVENT_FUNCTION = """CREATE OR REPLACE FUNCTION visioncap_event_counts() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO caption_event_counts AS c (camera, event_count) VALUES (NEW.camera, 1)
            ON CONFLICT (camera) DO UPDATE SET event_count = c.event_count + 1;
    ELSE
        UPDATE caption_event_counts SET event_count = event_count - 1 WHERE camera = OLD.camera;
    END IF;
    RETURN NULL;
END $$"""
_PG_EVENT_TRIGGERS = (
    "CREATE TRIGGER caption_events_insert AFTER INSERT ON caption_events FOR EACH ROW "
    "WHEN (NEW.event_key <> '') EXECUTE FUNCTION visioncap_event_counts()",
    "CREATE TRIGGER caption_events_delete AFTER DELETE ON caption_events FOR EACH ROW "
    "WHEN (OLD.event_key <> '') EXECUTE FUNCTION visioncap_event_counts()",
)
_COUNT_TRIGGER_NAMES = (
    ("captions", "captions_counts_insert"),
    ("captions", "captions_counts_delete"),
    ("captions", PG_COUNT_TRIGGER),
    ("captions", "captions_counts_update"),
    ("caption_events", "caption_events_insert"),
    ("caption_events", "caption_events_delete"),
)
_COUNT_BACKFILL = (
    "DELETE FROM caption_counts",
    "INSERT INTO caption_counts (camera, status, row_count) "
    "SELECT camera, status, count(*) FROM captions GROUP BY camera, status",
    "DELETE FROM caption_events",
    "INSERT INTO caption_events (camera, event_key, row_count) "
    "SELECT camera, event_key, count(*) FROM captions GROUP BY camera, event_key",
    "DELETE FROM caption_event_counts",
    "INSERT INTO caption_event_counts (camera, event_count) "
    "SELECT camera, count(*) FROM caption_events WHERE event_key != '' GROUP BY camera",
)


def recount(conn: Connection) -> None:
    """The counts made again from the rows (after a bulk load with the counts' trigger off: the search benchmark)."""
    _counts_tables(conn)


def _counts_tables(conn: Connection) -> None:
    """Tables of counts and the triggers that keep them, filled from the rows already there.

    Also run again after a bulk load that dropped the triggers (the benchmark does): the counts are made again
    from the rows, with the triggers off meanwhile and, on PostgreSQL, writers locked out until the step commits.
    """
    for record in (CaptionCountRecord, CaptionEventRecord, CaptionEventCountRecord):
        table_of(record).create(conn, checkfirst=True)
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.execute(text("LOCK TABLE captions IN SHARE ROW EXCLUSIVE MODE"))
    if dialect in ("sqlite", "postgresql"):
        for table, trigger in _COUNT_TRIGGER_NAMES:
            conn.execute(text(f"DROP TRIGGER IF EXISTS {trigger}" + (f" ON {table}" if dialect != "sqlite" else "")))
    for statement in _COUNT_BACKFILL:
        conn.execute(text(statement))
    if dialect == "sqlite":
        for statement in (*_SQLITE_COUNT_TRIGGERS, *_SQLITE_EVENT_TRIGGERS):
            conn.execute(text(statement))
    elif dialect == "postgresql":
        conn.execute(text(_PG_COUNT_FUNCTION))
        conn.execute(text(_PG_EVENT_FUNCTION))
        for statement in (*_PG_COUNT_TRIGGERS, *_PG_EVENT_TRIGGERS):
            conn.execute(text(statement))


# The live stream's change positions (step 9). Every insert or update of a caption row stamps it, in the writer's
# own transaction, with where it stands in commit order; /v1/stream reads rows after a client's position (a keyset
# on (change_xid, change_seq), see changes.py), so it misses nothing and repeats nothing however many rows a burst
# writes. Triggers rather than the store's code, so that every writer (pipeline, requeue, an operator's SQL) is in.
CHANGE_XID_COLUMN = "change_xid"
CHANGE_SEQ_COLUMN = "change_seq"
CHANGE_INDEX = "ix_captions_change"
# SQLite: one writer at a time, holding the write lock from its first write to its commit, so a counter bumped
# inside the write is in commit order. A counter row rather than max(change_seq) + 1: retention may delete the
# newest row, and a number used again would sit at a position a client has already passed.
SQLITE_CHANGE_COUNTER = "caption_change_counter"
_SQLITE_CHANGE_STAMP = (
    f"UPDATE {SQLITE_CHANGE_COUNTER} SET seq = seq + 1 WHERE id = 1; "
    f"UPDATE captions SET {CHANGE_SEQ_COLUMN} = (SELECT seq FROM {SQLITE_CHANGE_COUNTER} WHERE id = 1) "
    "WHERE id = new.id; "
)
_SQLITE_CHANGE_TRIGGERS = (
    f"CREATE TRIGGER IF NOT EXISTS captions_change_insert AFTER INSERT ON captions BEGIN {_SQLITE_CHANGE_STAMP}END",
    # The stamp is itself an update of the row: the WHEN leaves it alone (it changed change_seq; nothing else does),
    # whatever recursive_triggers says. The count and full-text triggers name their columns, so it fires none.
    "CREATE TRIGGER IF NOT EXISTS captions_change_update AFTER UPDATE ON captions "
    f"WHEN new.{CHANGE_SEQ_COLUMN} IS old.{CHANGE_SEQ_COLUMN} BEGIN {_SQLITE_CHANGE_STAMP}END",
)
# PostgreSQL: writers run concurrently and a sequence hands out numbers at the write, not at the commit (a
# transaction holding 9 may commit after the one holding 10). The row also gets its writer's transaction id;
# readers take only rows of transactions older than their snapshot's xmin (all of them ended, and every one still
# running or yet to start has an id at or above it), in (change_xid, change_seq) order. A BEFORE trigger sets the
# columns of the row being written: no second write, nothing to recurse.
PG_CHANGE_SEQUENCE = "captions_change_seq"
_PG_CHANGE_FUNCTION = f"""CREATE OR REPLACE FUNCTION visioncap_caption_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.{CHANGE_XID_COLUMN} := pg_current_xact_id()::text::bigint;
    NEW.{CHANGE_SEQ_COLUMN} := nextval('{PG_CHANGE_SEQUENCE}');
    RETURN NEW;
END $$"""
_PG_CHANGE_TRIGGER = (
    "CREATE TRIGGER captions_change BEFORE INSERT OR UPDATE ON captions FOR EACH ROW "
    "EXECUTE FUNCTION visioncap_caption_change()"
)


_CHANGE_BACKFILL = (
    f"UPDATE captions SET {CHANGE_SEQ_COLUMN} = numbered.seq FROM ("
    f"SELECT id, (SELECT coalesce(max({CHANGE_SEQ_COLUMN}), 0) FROM captions) "
    "+ row_number() OVER (ORDER BY updated_at, id) AS seq "
    f"FROM captions WHERE {CHANGE_SEQ_COLUMN} IS NULL) AS numbered WHERE captions.id = numbered.id"
)
_SQLITE_CHANGE_COUNTER_TABLE = (
    f"CREATE TABLE IF NOT EXISTS {SQLITE_CHANGE_COUNTER} (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL)"
)
# Never backwards: a number handed out before must not be handed out again.
_SQLITE_CHANGE_COUNTER_START = (
    f"INSERT INTO {SQLITE_CHANGE_COUNTER} (id, seq) SELECT 1, coalesce(max({CHANGE_SEQ_COLUMN}), 0) FROM captions "
    "WHERE true ON CONFLICT (id) DO UPDATE SET seq = max(seq, excluded.seq)"
)
_PG_CHANGE_SEQUENCE_START = (
    f"SELECT setval('{PG_CHANGE_SEQUENCE}', greatest(coalesce(max({CHANGE_SEQ_COLUMN}), 0) + 1, "
    f"(SELECT CASE WHEN is_called THEN last_value + 1 ELSE last_value END FROM {PG_CHANGE_SEQUENCE})), false) "
    "FROM captions"
)


def _change_positions(conn: Connection) -> None:
    """Change positions: the columns and their index, the rows already there numbered in (updated_at, id) order
    (all of them before any stream can start), then the triggers. Other backends get the columns but no
    triggers: their stream sees no changes."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        # Writers wait until the step commits: no row is written between the numbering and the trigger.
        conn.execute(text("LOCK TABLE captions IN SHARE ROW EXCLUSIVE MODE"))
        conn.execute(text("DROP TRIGGER IF EXISTS captions_change ON captions"))  # it would renumber the backfill
    if not _has_column(conn, CHANGE_XID_COLUMN):
        conn.execute(text(f"ALTER TABLE captions ADD COLUMN {CHANGE_XID_COLUMN} BIGINT NOT NULL DEFAULT 0"))
    if not _has_column(conn, CHANGE_SEQ_COLUMN):
        conn.execute(text(f"ALTER TABLE captions ADD COLUMN {CHANGE_SEQ_COLUMN} BIGINT"))
    if dialect not in ("sqlite", "postgresql"):
        return
    conn.execute(text(_CHANGE_BACKFILL))  # UPDATE ... FROM: SQLite 3.33 or later
    conn.execute(
        text(f"CREATE INDEX IF NOT EXISTS {CHANGE_INDEX} ON captions ({CHANGE_XID_COLUMN}, {CHANGE_SEQ_COLUMN})")
    )
    if dialect == "sqlite":
        conn.execute(text(_SQLITE_CHANGE_COUNTER_TABLE))
        conn.execute(text(_SQLITE_CHANGE_COUNTER_START))
        for statement in _SQLITE_CHANGE_TRIGGERS:
            conn.execute(text(statement))
    else:
        conn.execute(text(f"CREATE SEQUENCE IF NOT EXISTS {PG_CHANGE_SEQUENCE} AS BIGINT"))
        conn.execute(text(_PG_CHANGE_SEQUENCE_START))
        conn.execute(text(_PG_CHANGE_FUNCTION))
        conn.execute(text(_PG_CHANGE_TRIGGER))


def _alerts_tables(conn: Connection) -> None:
    # Rules made through the API, the alerts engine's cursor, what fired and every delivery of it.
    for record in (AlertRuleRecord, AlertCursorRecord, AlertRecord, AlertDeliveryRecord):
        table_of(record).create(conn, checkfirst=True)


# Caption vectors for semantic search (step 11): one row per captioned row, written after the caption by the
# background embedder (store/vectors.py), never by the caption writer. A side table keyed by the caption id, so
# the captions table and its writers are unchanged. The vector goes with its caption: deleted with the row
# (retention) and when the caption text changes (regenerate), so the embedder writes it again.
VECTORS_TABLE = "caption_vectors"
_SQLITE_VECTOR_TRIGGERS = (
    f"CREATE TRIGGER IF NOT EXISTS captions_vectors_delete AFTER DELETE ON captions "
    f"BEGIN DELETE FROM {VECTORS_TABLE} WHERE caption_id = old.id; END",
    f"CREATE TRIGGER IF NOT EXISTS captions_vectors_recaption AFTER UPDATE OF caption ON captions "
    f"WHEN old.caption IS NOT new.caption BEGIN DELETE FROM {VECTORS_TABLE} WHERE caption_id = old.id; END",
)
_PG_VECTOR_FUNCTION = f"""CREATE OR REPLACE FUNCTION visioncap_caption_recaption() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {VECTORS_TABLE} WHERE caption_id = OLD.id;
    RETURN NULL;
END $$"""
_PG_VECTOR_TRIGGER = (
    "CREATE TRIGGER captions_vectors_recaption AFTER UPDATE OF caption ON captions FOR EACH ROW "
    "WHEN (OLD.caption IS DISTINCT FROM NEW.caption) EXECUTE FUNCTION visioncap_caption_recaption()"
)


def _caption_vectors(conn: Connection) -> None:
    """The vectors' side table; float32 little-endian bytes (sqlite-vec's own format), 384 per row."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text(
                f"CREATE TABLE IF NOT EXISTS {VECTORS_TABLE} (caption_id INTEGER PRIMARY KEY "
                "REFERENCES captions(id) ON DELETE CASCADE, embedding BYTEA NOT NULL)"
            )
        )
        conn.execute(text(_PG_VECTOR_FUNCTION))
        conn.execute(text("DROP TRIGGER IF EXISTS captions_vectors_recaption ON captions"))
        conn.execute(text(_PG_VECTOR_TRIGGER))
        return
    conn.execute(
        text(f"CREATE TABLE IF NOT EXISTS {VECTORS_TABLE} (caption_id INTEGER PRIMARY KEY, embedding BLOB NOT NULL)")
    )
    if conn.dialect.name == "sqlite":
        for statement in _SQLITE_VECTOR_TRIGGERS:
            conn.execute(text(statement))


def _camera_configs_table(conn: Connection) -> None:
    # What workers run (cameras as data): written by the API, the CLI and pipeline-file seeds.
    table_of(CameraConfigRecord).create(conn, checkfirst=True)


def _worker_leases_tables(conn: Connection) -> None:
    # Several workers share the cameras by leases (PostgreSQL); made on SQLite too, where they stay empty.
    table_of(WorkerRecord).create(conn, checkfirst=True)
    table_of(CameraLeaseRecord).create(conn, checkfirst=True)


def _pipeline_seeds_table(conn: Connection) -> None:
    # Which versions of a pipeline file seeded its cameras, so that an older one never reverts a newer one.
    table_of(PipelineSeedRecord).create(conn, checkfirst=True)


def _alert_delivery_claims(conn: Connection) -> None:
    """Who sends a delivery now and until when: a delivery process claims the rows it is about to send (with
    `FOR UPDATE SKIP LOCKED` on PostgreSQL), so that two `visioncap alerts` never send one twice."""
    present = {column["name"] for column in inspect(conn).get_columns(AlertDeliveryRecord.__tablename__)}
    for name in ("claimed_by", "claimed_until"):
        if name not in present:
            sql_type = AlertDeliveryRecord.__table__.c[name].type.compile(dialect=conn.dialect)
            conn.execute(text(f"ALTER TABLE {AlertDeliveryRecord.__tablename__} ADD COLUMN {name} {sql_type}"))


def _alert_decisions_table(conn: Connection) -> None:
    # The watch rules' decisions (the VLM's answers), listed by GET /v1/alerts/decisions.
    from visioncap.alerts.decisions import create_table

    create_table(conn)


def _caption_zones(conn: Connection) -> None:
    """The zones of each caption: JSON columns for reading (the stays) and drawing (the camera's polygons then), a
    side table (and its index) for filtering."""
    present = {column["name"] for column in inspect(conn).get_columns("captions")}
    json_type = "JSON" if conn.dialect.name == "postgresql" else "TEXT"
    for name in ("zones", "zone_shapes"):
        if name not in present:
            conn.execute(text(f"ALTER TABLE captions ADD COLUMN {name} {json_type}"))
    table_of(CaptionZoneRecord).create(conn, checkfirst=True)


def vector_clock(dialect: str) -> str:
    """SQL for the database's own clock in seconds since the epoch: when a vector was written, on one clock for
    every writer (the API replicas' embedders), so that the index reads it however its id compares to others."""
    if dialect == "postgresql":
        # clock_timestamp(), not now(): now() is the transaction's start, earlier than its commit.
        return "EXTRACT(EPOCH FROM clock_timestamp())::double precision"
    return "((julianday('now') - 2440587.5) * 86400.0)"


def _vector_write_times(conn: Connection) -> None:
    """When each vector was written (`vector_clock`): the index reads vectors written since its last look
    whatever their caption's id, so a caption captioned late (an outbox retry, a regenerate) is found too."""
    present = {column["name"] for column in inspect(conn).get_columns(VECTORS_TABLE)}
    if "written_at" not in present:
        kind = "DOUBLE PRECISION" if conn.dialect.name == "postgresql" else "REAL"
        conn.execute(text(f"ALTER TABLE {VECTORS_TABLE} ADD COLUMN written_at {kind}"))
    conn.execute(text(f"CREATE INDEX IF NOT EXISTS ix_{VECTORS_TABLE}_written_at ON {VECTORS_TABLE} (written_at)"))


def _description_frames(conn: Connection) -> None:
    """The frames an event description was written from (a JSON list of several images, one of them the row's
    `image_path`)."""
    present = {column["name"] for column in inspect(conn).get_columns("captions")}
    if "frames" not in present:
        json_type = "JSON" if conn.dialect.name == "postgresql" else "TEXT"
        conn.execute(text(f"ALTER TABLE captions ADD COLUMN frames {json_type}"))


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (
    _create_tables,  # 1
    _add_geometry_columns,  # 2
    _add_query_indexes,  # 3
    _full_text_search,  # 4
    _cameras_table,  # 5
    _full_text_prefix_index,  # 6
    _stored_tsvector,  # 7
    _counts_tables,  # 8
    _change_positions,  # 9
    _alerts_tables,  # 10
    _caption_vectors,  # 11
    _camera_configs_table,  # 12
    _worker_leases_tables,  # 13
    _pipeline_seeds_table,  # 14
    _alert_delivery_claims,  # 15
    _alert_decisions_table,  # 16
    _caption_zones,  # 17
    _vector_write_times,  # 18
    _description_frames,  # 19
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
