"""REST API latency on a million captions, SQLite and PostgreSQL, idle and under concurrent load.

Seeds N captions (default 1,000,000: 20 cameras over 60 days, caption text drawn from a vocabulary with common
and rare words, people counts, all four statuses) into a real SQLite file and a real PostgreSQL (a throwaway
cluster from Debian's `postgresql` package, as the tests start it), with the schema and full-text search the
project's own migrations make. Then `visioncap api` runs as a subprocess and this process measures, over HTTP
with keep-alive, the latency of: the newest page (default page size), a camera + one-day time range, and text
searches (a rare word, a common word, two words, a typed prefix). Each is measured idle and while a second
process (`load`, below) applies concurrent load: a writer inserting and captioning rows through `CaptionStore`
as the pipeline does, readers hitting the same API, and open live streams (`/v1/stream`, as the web page keeps).

Goal: p99 < 50 ms for each query on each database. The query plans of the searches (as `search.py` builds them)
are recorded beside the figures.

Run: `.venv/bin/python -m visioncap.bench.search.api [--quick] [--rows N] [--databases sqlite,postgresql]`
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine, create_engine, event, text

from visioncap.bench.common.machine import REPO, machine_facts
from visioncap.bench.common.outputs import RESULTS_DIR, command_line, machine_line, write_results
from visioncap.bench.common.stats import percentile
from visioncap.config.api import ApiSettings
from visioncap.config.keys import hash_key
from visioncap.frames import Caption, SelectionReason
from visioncap.serve.ports import check_own, free_port
from visioncap.store import CaptionStatus, CaptionStore, NewCaption, create_db_engine
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import MIGRATIONS, ensure_schema
from visioncap.store.search import CaptionFilter, camera_summaries, search_captions

GOAL_P99_MS = 50.0
KEY = "bench-read-key"
CAMERAS = [f"cam-{n:02d}" for n in range(1, 21)]
SPAN = timedelta(days=60)
DATA_DIR = REPO / "data" / "benchmarks" / "api_search"

# -- the corpus -------------------------------------------------------------------------------------------------

# Each slot's words are drawn with Zipf-like weights (the first the most often), so the text has very common
# words ("man", "walking") and rare ones (the tail of EXTRAS) for selective searches.
SUBJECTS = [
    "a man",
    "a woman",
    "two people",
    "a group of people",
    "a courier",
    "a security guard",
    "a delivery driver",
    "a child",
    "an older man",
    "a cyclist",
    "a worker",
    "a cleaner",
    "a visitor",
    "a technician",
    "a postman",
]
COLOURS = ["black", "blue", "grey", "white", "red", "green", "dark", "yellow", "orange", "brown", "purple", "beige"]
CLOTHES = ["jacket", "coat", "hoodie", "shirt", "uniform", "dress", "sweater", "raincoat", "vest", "overalls"]
ACTIVITIES = [
    "walking",
    "standing",
    "talking on a phone",
    "carrying a box",
    "waiting",
    "pushing a trolley",
    "opening the door",
    "looking around",
    "running",
    "sitting on a bench",
    "unloading a van",
    "smoking",
    "checking a clipboard",
    "riding a bicycle",
    "sweeping the floor",
    "scanning a badge",
]
PLACES = [
    "the entrance",
    "the corridor",
    "the parking lot",
    "the loading dock",
    "the gate",
    "the lobby",
    "the stairs",
    "the bus stop",
    "the reception desk",
    "the warehouse aisle",
    "the fence",
    "the side door",
    "the car park barrier",
    "the elevator",
]
EXTRAS = [
    "with a backpack",
    "with a dog",
    "wearing a cap",
    "holding a cup",
    "with a suitcase",
    "wearing a helmet",
    "holding an umbrella",
    "carrying a ladder",
    "next to a forklift",
    "pushing a pram",
    "with a toolbox",
    "holding flowers",
    "wearing sunglasses",
    "carrying a guitar",
    "with a skateboard",
    "holding a torch",
    "wearing a mask",
    "carrying a rolled carpet",
    "next to a fire extinguisher",
    "with a wheelchair",
]
EXTRA_SHARE = 0.3
RARE = "carrying a tripod"  # in about 1 caption of 5,000: a truly selective search
RARE_SHARE = 0.0002

# What the benchmark searches for (the web page's search box sends `q`); the share of rows matching each is
# counted while seeding and recorded.
TEXT_QUERIES = {
    "text_rare": "tripod",
    "text_medium": "forklift",
    "text_common": "walking",
    "text_two_words": "red jacket",
    "text_prefix": "load",
}
# Filters no index serves (issue #13, item 5): checked row by row on the newest-first walk, which examines at most
# VISIONCAP_API_SEARCH_SCAN_ROWS rows per request. The first two match nothing, the last 0.02 % of the rows: their
# pages come back partial (maybe empty) with a cursor. Matching rows are counted while seeding, as for text.
FILTER_QUERIES: dict[str, dict[str, Any]] = {
    "people_none": {"min_people": 9999},
    "text_people_none": {"q": "walking", "min_people": 9999},
    "status_pending": {"status": "pending"},
    "status_rare": {"status": "failed", "min_people": 8},
}


def _zipf(words: Sequence[str], s: float = 1.1) -> tuple[Sequence[str], list[float]]:
    weights = [1.0 / (rank + 1) ** s for rank in range(len(words))]
    cumulative, total = [], 0.0
    for weight in weights:
        total += weight
        cumulative.append(total)
    return words, cumulative


_SLOTS = {name: _zipf(words) for name, words in (("s", SUBJECTS), ("c", COLOURS), ("k", CLOTHES))}
_SLOTS |= {name: _zipf(words) for name, words in (("a", ACTIVITIES), ("p", PLACES), ("x", EXTRAS))}


def _pick(rng: random.Random, slot: str) -> str:
    words, cumulative = _SLOTS[slot]
    return rng.choices(words, cum_weights=cumulative)[0]


def caption_text(rng: random.Random) -> str:
    words = f"{_pick(rng, 's')} in a {_pick(rng, 'c')} {_pick(rng, 'k')} {_pick(rng, 'a')} near {_pick(rng, 'p')}"
    if rng.random() < EXTRA_SHARE:
        words += " " + _pick(rng, "x")
    if rng.random() < RARE_SHARE:
        words += " " + RARE
    return words


@dataclass
class Corpus:
    """Deterministic rows, oldest first, ending shortly before `end`."""

    rows: int
    end: datetime
    seed: int = 7
    matches: Counter[str] = field(default_factory=Counter)  # query name -> rows whose text matches it
    by_status: Counter[str] = field(default_factory=Counter)
    _values: list[tuple[Any, ...]] | None = field(default=None, repr=False)

    @property
    def start(self) -> datetime:
        return self.end - SPAN

    def values(self) -> list[tuple[Any, ...]]:
        """All rows as tuples in COLUMNS order, generated once: both databases get the same rows."""
        if self._values is None:
            self._values = [tuple(row[name] for name in COLUMNS) for row in self.generate()]
        return self._values

    def generate(self) -> Iterator[dict[str, Any]]:
        rng = random.Random(self.seed)
        self.matches.clear()
        self.by_status.clear()
        step = SPAN / self.rows
        frame_index = Counter[str]()
        # Boxes come from a pool: their values are never searched, and drawing them per row doubles the seed time.
        boxes = [_people(rng, count) for count in (1, 2, 3, 4, 5, 6, 8) for _ in range(50)]
        by_count = {count: [b for b in boxes if len(b) == count] for count in (1, 2, 3, 4, 5, 6, 8)}
        for number in range(self.rows):
            camera = rng.choice(CAMERAS)
            # Strictly increasing instants: a camera never has two rows for one instant (the unique constraint).
            captured_at = self.start + step * (number + rng.random() * 0.9)
            status = _status(rng.random())
            self.by_status[status.value] += 1
            people_count = rng.choices((1, 2, 3, 4, 5, 6, 8), weights=(50, 25, 12, 6, 4, 2, 1))[0]
            people = rng.choice(by_count[people_count])
            frame_index[camera] += 25
            caption, error = _outcome(rng, status)
            self._count_matches(status, people_count, caption)
            yield _row(rng, number, camera, frame_index[camera], captured_at, status, people, caption, error)

    def _count_matches(self, status: CaptionStatus, people_count: int, caption: str | None) -> None:
        """Count the row for every text query its caption matches and every filter query it passes."""
        if caption is not None:
            lowered = caption.lower()
            for name in TEXT_QUERIES:
                if _matches(lowered, name):
                    self.matches[name] += 1
        for name, params in FILTER_QUERIES.items():
            if _filter_matches(params, status.value, people_count, caption):
                self.matches[name] += 1


def _status(draw: float) -> CaptionStatus:
    """92 % captioned, 5 % skipped, 2 % failed, 1 % pending."""
    if draw < 0.92:
        return CaptionStatus.CAPTIONED
    if draw < 0.97:
        return CaptionStatus.SKIPPED
    return CaptionStatus.FAILED if draw < 0.99 else CaptionStatus.PENDING


def _outcome(rng: random.Random, status: CaptionStatus) -> tuple[str | None, str | None]:
    """The row's caption (captioned rows) or error (failed and skipped ones)."""
    if status == CaptionStatus.CAPTIONED:
        return caption_text(rng), None
    if status == CaptionStatus.FAILED:
        return None, "VLM refused the request (HTTP 400)"
    if status == CaptionStatus.SKIPPED:
        return None, "coalesced: a better frame of the event was already waiting"
    return None, None


def _row(
    rng: random.Random,
    number: int,
    camera: str,
    frame_index: int,
    captured_at: datetime,
    status: CaptionStatus,
    people: list[dict[str, Any]],
    caption: str | None,
    error: str | None,
) -> dict[str, Any]:
    """One captions row as the pipeline would have stored it."""
    captioned = status == CaptionStatus.CAPTIONED
    latency_ms = round(rng.uniform(300, 2500), 1) if captioned else None
    day = captured_at.date().isoformat()
    return {
        "pipeline": "site",
        "camera": camera,
        "source": f"rtsp://10.0.0.{CAMERAS.index(camera) + 10}/stream1",
        "frame_index": frame_index,
        "offset_s": frame_index / 25,
        "captured_at": captured_at,
        "reason": rng.choice(("new-event", "new-event", "recaption", "movement", "people-left")),
        "event_key": f"{camera}:{number // 7}",
        "event_ids": [box["track_id"] for box in people],
        "score": round(rng.random(), 4),
        "people": people,
        "people_count": len(people),
        "image_path": None if status == CaptionStatus.SKIPPED else f"frames/{camera}/{day}/{number}.jpg",
        "image_width": 644,
        "image_height": 364,
        "image_tokens": 299,
        "status": status.value,
        "attempts": 1 if status != CaptionStatus.SKIPPED else 0,
        "caption": caption,
        "structured": None,
        "error": error,
        "model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "prompt_tokens": 341 if captioned else None,
        "completion_tokens": rng.randint(12, 60) if captioned else None,
        "latency_ms": latency_ms,
        "created_at": captured_at,
        "updated_at": captured_at + timedelta(milliseconds=latency_ms or 5),
        "frame_width": 1280,
        "frame_height": 720,
        "image_region": None,
        "zones": None,
        "zone_shapes": None,
        "frames": None,
    }


def _people(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [
        {
            "x1": round(rng.uniform(0, 1100), 1),
            "y1": round(rng.uniform(0, 500), 1),
            "x2": round(rng.uniform(1100, 1280), 1),
            "y2": round(rng.uniform(500, 720), 1),
            "confidence": round(rng.uniform(0.4, 0.95), 3),
            "class_id": 0,
            "track_id": rng.randint(1, 5000),
        }
        for _ in range(count)
    ]


_QUERY_PATTERNS = {
    name: [re.compile(rf"\b{re.escape(term)}") for term in query.lower().split()]
    for name, query in TEXT_QUERIES.items()
}


def _matches(lowered: str, name: str) -> bool:
    """Every word of the query starts a word of the text (prefix semantics like the API's, without stemming)."""
    return all(pattern.search(lowered) for pattern in _QUERY_PATTERNS[name])


_FILTER_PATTERNS = {
    params["q"]: [re.compile(rf"\b{re.escape(term)}") for term in params["q"].lower().split()]
    for params in FILTER_QUERIES.values()
    if "q" in params
}


def _filter_matches(params: dict[str, Any], status: str, people_count: int, caption: str | None) -> bool:
    """Whether a row passes the request parameters of one of FILTER_QUERIES."""
    if people_count < params.get("min_people", 0) or params.get("status", status) != status:
        return False
    if "q" not in params:
        return True
    return caption is not None and all(pattern.search(caption.lower()) for pattern in _FILTER_PATTERNS[params["q"]])


COLUMNS = [column.name for column in CaptionRecord.__table__.columns if column.name != "id"]


# -- seeding ----------------------------------------------------------------------------------------------------


def _secondary_objects(engine: Engine) -> list[str]:
    """DROP statements for what slows a bulk load: the indexes (but the primary key and unique constraint) and
    the triggers (SQLite's full-text ones, the per-camera counts). Running the migrations again afterwards
    recreates them (every step checks what exists); SQLite's FTS step ends with a 'rebuild' that indexes the rows
    loaded meanwhile, and the counts step counts them."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            found = conn.execute(
                text(
                    "SELECT type, name FROM sqlite_master WHERE tbl_name = 'captions' AND type IN ('index', 'trigger') "
                    "AND sql IS NOT NULL"
                )
            )
            return [f"DROP {kind.upper()} {name}" for kind, name in found]
        found = conn.execute(
            text(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'captions' AND indexname NOT IN "
                "(SELECT conname FROM pg_constraint WHERE conrelid = 'captions'::regclass)"
            )
        )
        triggers = conn.execute(
            text("SELECT tgname FROM pg_trigger WHERE tgrelid = 'captions'::regclass AND NOT tgisinternal")
        )
        return [f"DROP INDEX {name}" for (name,) in found] + [
            f"DROP TRIGGER {name} ON captions" for (name,) in triggers
        ]


def seed(engine: Engine, corpus: Corpus) -> dict[str, Any]:
    """The corpus into an empty database with the project's schema; timings in seconds."""
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    ensure_schema(engine)
    drops = _secondary_objects(engine)
    with engine.begin() as conn:
        for statement in drops:
            conn.execute(text(statement))
    t1 = time.perf_counter()
    if engine.dialect.name == "sqlite":
        _load_sqlite(engine, corpus)
    else:
        _load_postgresql(engine, corpus)
    t2 = time.perf_counter()
    for step in MIGRATIONS:  # idempotent: recreates the indexes, triggers and full-text index dropped above
        with engine.begin() as conn:
            step(conn)
    t3 = time.perf_counter()
    if engine.dialect.name == "postgresql":
        # What autovacuum does after a large load (statistics, visibility map), done now rather than mid-run.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE captions"))
    else:
        with engine.connect() as conn:
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    t4 = time.perf_counter()
    timings.update(
        load_s=round(t2 - t1, 1), index_s=round(t3 - t2, 1), vacuum_s=round(t4 - t3, 1), total_s=round(t4 - t0, 1)
    )
    _check_seed(engine, corpus)
    return timings


def _load_sqlite(engine: Engine, corpus: Corpus) -> None:
    # The same values SQLAlchemy binds (its UtcDateTime and JSON processors), through sqlite3's executemany.
    table = CaptionRecord.__table__
    processors = [(i, table.c[name].type.bind_processor(engine.dialect)) for i, name in enumerate(COLUMNS)]
    processors = [(i, process) for i, process in processors if process is not None]
    sql = f"INSERT INTO captions ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
    rows = corpus.values()
    raw = engine.raw_connection()
    try:
        cursor = raw.cursor()
        for first in range(0, len(rows), 50_000):
            batch = []
            for row in rows[first : first + 50_000]:
                values = list(row)
                for i, process in processors:
                    values[i] = process(values[i])
                batch.append(values)
            cursor.executemany(sql, batch)
            raw.commit()
    finally:
        raw.close()


def _load_postgresql(engine: Engine, corpus: Corpus) -> None:
    json_names = {"event_ids", "people", "structured", "image_region", "zones", "zone_shapes", "frames"}
    json_columns = [i for i, name in enumerate(COLUMNS) if name in json_names]
    raw = engine.raw_connection()
    try:
        cursor = raw.driver_connection.cursor()  # type: ignore[union-attr]
        with cursor.copy(f"COPY captions ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in corpus.values():
                values = list(row)
                for i in json_columns:
                    if values[i] is not None:
                        values[i] = json.dumps(values[i])
                copy.write_row(values)
        raw.commit()
    finally:
        raw.close()


def _check_seed(engine: Engine, corpus: Corpus) -> None:
    """Every row loaded, and the full-text index answers for them (not only for rows written later)."""
    with engine.connect() as conn:
        count = conn.scalar(text("SELECT count(*) FROM captions"))
    if count != corpus.rows:
        raise RuntimeError(f"seeded {count} rows, expected {corpus.rows}")
    rows, _ = search_captions(engine, CaptionFilter(text=TEXT_QUERIES["text_rare"]), 1000)
    expected = min(1000, corpus.matches["text_rare"])
    if len(rows) != expected:
        raise RuntimeError(f"full-text search found {len(rows)} rows for the rare word, expected {expected}")


# -- PostgreSQL cluster -----------------------------------------------------------------------------------------


class PostgresCluster:
    """A throwaway cluster (Debian's `postgresql` package) on a free loopback port, as tests/test_api.py starts."""

    def __init__(self) -> None:
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not found:
            raise SystemExit("PostgreSQL is not installed (apt-get install -y postgresql), or pass --databases sqlite")
        self.bin = found[-1].parent
        self.root = Path(tempfile.mkdtemp(prefix="visioncap-bench-pg-"))
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.port = free_port()
        self.version = ""

    def start(self) -> str:
        cluster, sock = self.root / "cluster", self.root / "sock"
        sock.mkdir()
        if self.prefix:
            shutil.chown(self.root, "postgres")
            shutil.chown(sock, "postgres")
        run = partial(subprocess.run, check=True, capture_output=True, timeout=300)
        run(
            [
                *self.prefix,
                str(self.bin / "initdb"),
                "-D",
                str(cluster),
                "-U",
                "visioncap",
                "--auth=trust",
                "-E",
                "UTF8",
            ]
        )
        # fsync off as in the tests (a throwaway cluster); the rest are Debian's defaults.
        options = f"-p {self.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(
            [
                *self.prefix,
                str(self.bin / "pg_ctl"),
                "-D",
                str(cluster),
                "-o",
                options,
                "-w",
                "-l",
                str(self.root / "log"),
                "start",
            ]
        )
        self.version = run([str(self.bin / "postgres"), "--version"], text=True).stdout.strip()
        admin = create_engine(
            f"postgresql+psycopg://visioncap@127.0.0.1:{self.port}/postgres", isolation_level="AUTOCOMMIT"
        )
        with admin.connect() as conn:
            conn.execute(text("CREATE DATABASE bench"))
        admin.dispose()
        return f"postgresql+psycopg://visioncap@127.0.0.1:{self.port}/bench"

    def postmaster_pid(self) -> int:
        return int((self.root / "cluster" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        subprocess.run(
            [*self.prefix, str(self.bin / "pg_ctl"), "-D", str(self.root / "cluster"), "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)


# -- the API and the load ---------------------------------------------------------------------------------------


def api_env(database_url: str, data_dir: Path) -> dict[str, str]:
    keys = [{"name": "bench", "sha256": hash_key(KEY), "scopes": ["read"]}]
    return {
        **os.environ,
        "VISIONCAP_DATABASE_URL": database_url,
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_API_KEYS": json.dumps(keys),
        "VISIONCAP_API_READY_CHECK_VLM": "false",
    }


class ApiProcess:
    """`visioncap api` as a user starts it (access log off: WARNING), until stopped."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, "-m", "visioncap", "api", "--port", str(self.port), "--log-level", "WARNING"]
        self.log = (data_dir / "api.log").open("w")
        self.process = subprocess.Popen(
            command, env=api_env(database_url, data_dir), cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"visioncap api exited with {self.process.returncode}; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/readyz", headers=auth(), timeout=5).status_code == 200:
                    check_own(self.process.pid, self.port)  # not another process's API on a port both picked
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"visioncap api not ready after 60 s; see {self.log.name}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


class LoadProcess:
    """`python -m visioncap.bench.search.api load ...` in a second process; its counts come back in a JSON file."""

    def __init__(self, api_url: str, database_url: str, data_dir: Path, args: argparse.Namespace) -> None:
        self.report = data_dir / "load.json"
        self.report.unlink(missing_ok=True)
        self.ready = data_dir / "load.ready"
        self.ready.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "visioncap.bench.search.api",
            "load",
            "--api-url",
            api_url,
            "--database-url",
            database_url,
            "--report",
            str(self.report),
            "--ready",
            str(self.ready),
            "--write-rate",
            str(args.write_rate),
            "--read-rate",
            str(args.read_rate),
            "--streams",
            str(args.streams),
        ]
        self.process = subprocess.Popen(command, cwd=REPO, env=api_env(database_url, data_dir))
        deadline = time.monotonic() + 60
        while not self.ready.exists():  # its writer has stored a row, its streams are connected
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the load process did not start")
            time.sleep(0.1)

    def stop(self) -> dict[str, Any]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)
        report: dict[str, Any] = json.loads(self.report.read_text())
        return report


def run_load(argv: Sequence[str]) -> int:
    """The second process: a pipeline-like writer, API readers and live streams, until SIGTERM."""
    parser = argparse.ArgumentParser(prog="api_search load")
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--write-rate", type=float, required=True)
    parser.add_argument("--read-rate", type=float, required=True)
    parser.add_argument("--streams", type=int, required=True)
    args = parser.parse_args(argv)
    load = _Load(args)
    signal.signal(signal.SIGTERM, lambda *_: load.stop.set())
    started = time.monotonic()
    load.run()
    seconds = time.monotonic() - started
    report = {"seconds": round(seconds, 1), "counts": dict(load.counts)}
    report["writes_per_s"] = round(load.counts["writes"] / seconds, 2)
    args.report.write_text(json.dumps(report))
    return 0


class _Load:
    """The load process's threads, each counting what happened to its requests, until `stop` is set."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def run(self) -> None:
        """The streams, the writer and the reader, until `stop`; the writer and reader are waited for."""
        threads = [threading.Thread(target=self.streamer, daemon=True) for _ in range(self.args.streams)]
        threads += [threading.Thread(target=self.writer), threading.Thread(target=self.reader)]
        for thread in threads:
            thread.start()
        self.stop.wait()
        for thread in threads:
            if not thread.daemon:
                thread.join(timeout=30)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def paced(self, rate: float) -> Iterator[None]:
        # Open loop: the schedule does not slip when a request is slow, as with independent clients.
        next_at = time.monotonic()
        while not self.stop.is_set():
            yield
            next_at += 1 / rate
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def writer(self) -> None:
        # What the pipeline does per selected frame: a pending row (the outbox), then the caption.
        store = CaptionStore(create_db_engine(self.args.database_url))
        rng = random.Random(1)
        for number, _ in enumerate(self.paced(self.args.write_rate)):
            new = _live_caption(number)
            try:
                row_id = store.add(new)
                if row_id is not None:
                    store.mark_captioned(row_id, Caption(caption_text(rng), new.model, 341, 30, 0.8), attempts=1)
                    self.count("writes")
                    if number == 0:
                        self.args.ready.touch()  # tell the measuring process only once the writer is writing
            except Exception as exc:  # counted and reported: a "database is locked" here is a finding
                self.count(f"write_error:{type(exc).__name__}")

    def reader(self) -> None:
        rng = random.Random(2)
        queries = list(request_params(rng, None).items())
        with httpx.Client(base_url=self.args.api_url, headers=auth(), timeout=30) as client:
            for number, _ in enumerate(self.paced(self.args.read_rate)):
                name, params = queries[number % len(queries)]
                try:
                    status = client.get(path_of(name), params=params()).status_code
                    self.count(f"reads_http_{status}")
                except httpx.HTTPError as exc:
                    self.count(f"read_error:{type(exc).__name__}")

    def streamer(self) -> None:
        timeout = httpx.Timeout(30, read=None)
        with (
            httpx.Client(base_url=self.args.api_url, headers=auth(), timeout=timeout) as client,
            client.stream("GET", "/v1/stream") as response,
        ):
            self.count(f"stream_http_{response.status_code}")
            for line in response.iter_lines():
                if line.startswith("event: caption"):
                    self.count("stream_events")
                if self.stop.is_set():
                    return


def _live_caption(number: int) -> NewCaption:
    """The writer's `number`th frame, as the pipeline would store it."""
    camera = CAMERAS[number % len(CAMERAS)]
    people = [{"x1": 10.0, "y1": 20.0, "x2": 200.0, "y2": 400.0, "confidence": 0.8, "class_id": 0}]
    return NewCaption(
        pipeline="site",
        camera=camera,
        source="rtsp://10.0.0.1/stream1",
        frame_index=number,
        offset_s=number / 25,
        captured_at=datetime.now(UTC),
        reason=SelectionReason.NEW_EVENT,
        people=people,
        image_width=644,
        image_height=364,
        model="Qwen/Qwen2.5-VL-7B-Instruct",
        event_key=f"{camera}:live{number}",
        image_path=f"frames/{camera}/live/{number}.jpg",
        frame_width=1280,
        frame_height=720,
    )


# -- measuring --------------------------------------------------------------------------------------------------


def request_params(rng: random.Random, corpus: Corpus | None) -> dict[str, Any]:
    """Query name -> a function giving the next request's parameters (camera and day vary per request)."""
    end = corpus.end if corpus is not None else datetime.now(UTC)

    def camera_range() -> dict[str, Any]:
        day = end - timedelta(days=rng.randint(1, SPAN.days - 1))
        since = day.replace(hour=0, minute=0, second=0, microsecond=0)
        return {
            "camera": rng.choice(CAMERAS),
            "since": since.isoformat(),
            "until": (since + timedelta(days=1)).isoformat(),
        }

    queries: dict[str, Any] = {"newest": dict, "camera_range": camera_range}
    for name, q in TEXT_QUERIES.items():
        queries[name] = partial(dict, q=q)
    for name, filters in FILTER_QUERIES.items():
        queries[name] = partial(dict, filters)
    queries[CAMERAS_QUERY] = dict  # the camera list with counts, which the web page loads beside the captions
    return queries


CAMERAS_QUERY = "cameras"


def path_of(name: str) -> str:
    return "/v1/cameras" if name == CAMERAS_QUERY else "/v1/captions"


def _cpu_by_pid(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds (user + system) each process has used so far; processes gone meanwhile are left out."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _children(parent: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@dataclass
class CpuMeter:
    """CPU used by the API process and the database server (PostgreSQL: the postmaster and its backends) per
    request, from /proc: what a request costs whatever else runs on the machine (clock-tick resolution, so only
    sums over many requests mean anything)."""

    api_pid: int
    postmaster_pid: int | None = None

    def snapshot(self) -> tuple[dict[int, float], dict[int, float]]:
        database: list[int] = []
        if self.postmaster_pid is not None:
            database = [self.postmaster_pid, *_children(self.postmaster_pid)]
        return _cpu_by_pid([self.api_pid]), _cpu_by_pid(database)

    @staticmethod
    def used(before: dict[int, float], after: dict[int, float]) -> float:
        return sum(value - before.get(pid, 0.0) for pid, value in after.items())


def measure(api_url: str, corpus: Corpus, samples: int, cpu: CpuMeter, budget_s: float) -> dict[str, Any]:
    """Each query `samples` times, round robin (so drifts in machine load hit all alike); ms per request. A query
    that has taken `budget_s` in all stops early (it misses the goal by far; its figures say so). A search the API
    stopped at its time limit (503 search_timeout) is a bounded answer: counted, and timed like the others."""
    rng = random.Random(3)
    queries = request_params(rng, corpus)
    latencies: dict[str, list[float]] = {name: [] for name in queries}
    sizes: dict[str, list[int]] = {name: [] for name in queries}
    partial_pages = Counter[str]()
    timeouts = Counter[str]()
    cpu_s: dict[str, list[float]] = {name: [0.0, 0.0] for name in queries}  # api, database
    with httpx.Client(base_url=api_url, headers=auth(), timeout=60) as client:
        for name, params in queries.items():  # warm-up: connections, caches, the server's first imports
            for _ in range(3):
                warm = client.get(path_of(name), params=params())
                if warm.status_code != 503:
                    warm.raise_for_status()
        for _ in range(samples):
            for name, params in queries.items():
                if sum(latencies[name]) > budget_s * 1000:
                    continue
                request = params()
                api_before, db_before = cpu.snapshot()
                t0 = time.perf_counter()
                response = client.get(path_of(name), params=request)
                body = response.content
                elapsed = time.perf_counter() - t0
                api_after, db_after = cpu.snapshot()
                latencies[name].append(elapsed * 1000)
                if response.status_code == 503 and json.loads(body)["error"]["type"] == "search_timeout":
                    timeouts[name] += 1
                    sizes[name].append(0)
                    continue
                if response.status_code != 200:
                    raise RuntimeError(f"{name} {request}: HTTP {response.status_code} {body[:200]!r}")
                page = json.loads(body)
                sizes[name].append(len(page["items"]))
                partial_pages[name] += bool(page.get("partial"))
                cpu_s[name][0] += cpu.used(api_before, api_after)
                cpu_s[name][1] += cpu.used(db_before, db_after)
    return {
        name: {
            "p50_ms": round(percentile(values, 50) or 0.0, 2),
            "p99_ms": round(percentile(values, 99) or 0.0, 2),
            "max_ms": round(max(values), 2),
            "samples": len(values),
            "items_median": percentile(sizes[name], 50),
            "partial_share": round(partial_pages[name] / len(values), 3),
            "search_timeouts": timeouts[name],
            "api_cpu_ms_mean": round(1000 * cpu_s[name][0] / len(values), 2),
            "database_cpu_ms_mean": round(1000 * cpu_s[name][1] / len(values), 2),
        }
        for name, values in latencies.items()
    }


def to_filter(params: dict[str, Any]) -> CaptionFilter:
    """The CaptionFilter the API builds from these request parameters."""
    return CaptionFilter(
        cameras=[params["camera"]] if "camera" in params else [],
        since=datetime.fromisoformat(params["since"]) if "since" in params else None,
        until=datetime.fromisoformat(params["until"]) if "until" in params else None,
        text=params.get("q"),
        min_people=params.get("min_people"),
        statuses=[params["status"]] if "status" in params else [],
    )


def measure_queries(engine: Engine, corpus: Corpus, samples: int, budget_s: float) -> dict[str, Any]:
    """`search_captions` (or `camera_summaries`) alone in this process (database and SQLAlchemy, no HTTP/JSON): ms."""
    queries = request_params(random.Random(3), corpus)
    latencies: dict[str, list[float]] = {name: [] for name in queries}
    for _ in range(samples):
        for name, params in queries.items():
            if sum(latencies[name]) > budget_s * 1000:
                continue
            query = to_filter(params())
            t0 = time.perf_counter()
            if name == CAMERAS_QUERY:
                camera_summaries(engine)
            else:
                search_captions(engine, query, 50)
            latencies[name].append((time.perf_counter() - t0) * 1000)
    return {
        name: {
            "p50_ms": round(percentile(values, 50) or 0.0, 2),
            "p99_ms": round(percentile(values, 99) or 0.0, 2),
            "samples": len(values),
        }
        for name, values in latencies.items()
    }


def _captured_sql(engine: Engine, query: CaptionFilter) -> tuple[str, Any]:
    captured: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        captured.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        search_captions(engine, query, 50)
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    return captured[-1]


def query_plans(engine: Engine, corpus: Corpus) -> dict[str, str]:
    """The plan of each query as search.py builds it (the SQL captured from a real call, then EXPLAINed)."""
    plans: dict[str, str] = {}
    for name, params in request_params(random.Random(4), corpus).items():
        if name == CAMERAS_QUERY:
            continue
        statement, parameters = _captured_sql(engine, to_filter(params()))
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            if engine.dialect.name == "sqlite":
                cursor.execute("EXPLAIN QUERY PLAN " + statement, parameters)
                plans[name] = "\n".join(str(row[-1]) for row in cursor.fetchall())
            else:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + statement, parameters)
                plans[name] = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            raw.close()
    return plans


def bench_database(kind: str, args: argparse.Namespace, corpus: Corpus, results: dict[str, Any]) -> None:
    data_dir = args.data_dir / kind
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    cluster = None
    entry: dict[str, Any] = {}
    try:
        if kind == "sqlite":
            url = f"sqlite:///{data_dir / 'visioncap.db'}"
            entry["version"] = f"SQLite {sqlite3.sqlite_version}"
        else:
            cluster = PostgresCluster()
            url = cluster.start()
            entry["version"] = cluster.version
        engine = create_db_engine(url)
        print(f"{kind}: seeding {corpus.rows:,} captions ...", flush=True)
        entry["seed"] = seed(engine, corpus)
        print(f"  seeded in {entry['seed']['total_s']} s ({entry['seed']})", flush=True)
        if kind == "sqlite":
            entry["database_bytes"] = (data_dir / "visioncap.db").stat().st_size
        else:
            with engine.connect() as conn:
                entry["database_bytes"] = conn.scalar(text("SELECT pg_database_size('bench')"))
        entry["plans"] = query_plans(engine, corpus)
        entry["queries_in_process"] = measure_queries(engine, corpus, max(20, args.samples // 4), args.query_budget_s)
        print("  search_captions in process (idle):", flush=True)
        print_phase(entry["queries_in_process"])
        engine.dispose()
        api = ApiProcess(url, data_dir)
        cpu = CpuMeter(api.process.pid, cluster.postmaster_pid() if cluster is not None else None)
        try:
            print(f"  idle: {args.samples} requests per query ...", flush=True)
            entry["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
            entry["idle"] = measure(api.url, corpus, args.samples, cpu, args.query_budget_s)
            print_phase(entry["idle"])
            load = LoadProcess(api.url, url, data_dir, args)
            try:
                print(f"  under load: {args.samples} requests per query ...", flush=True)
                entry["load"] = measure(api.url, corpus, args.samples, cpu, args.query_budget_s)
            finally:
                entry["load_process"] = load.stop()
            print_phase(entry["load"])
            print(f"  load process: {entry['load_process']}", flush=True)
            entry["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            api.stop()
    finally:
        if cluster is not None:
            cluster.stop()
        if not args.keep:
            shutil.rmtree(data_dir, ignore_errors=True)
    entry["meets_goal"] = all(v["p99_ms"] < GOAL_P99_MS for phase in ("idle", "load") for v in entry[phase].values())
    results["databases"][kind] = entry


def print_phase(phase: dict[str, Any]) -> None:
    for name, value in phase.items():
        items = f"  ({value['items_median']:g} items)" if "items_median" in value else ""
        if "api_cpu_ms_mean" in value:
            items += f"  CPU/request: API {value['api_cpu_ms_mean']} ms, database {value['database_cpu_ms_mean']} ms"
        print(f"    {name:15} p50 {value['p50_ms']:7.2f} ms  p99 {value['p99_ms']:7.2f} ms{items}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["load"]:
        return run_load(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100,000 rows and fewer samples: ~3 minutes")
    parser.add_argument("--rows", type=int, help="captions to seed (default 1,000,000; --quick 100,000)")
    parser.add_argument("--samples", type=int, help="requests per query and phase (default 400; --quick 100)")
    parser.add_argument("--databases", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    parser.add_argument("--write-rate", type=float, default=10, help="load: captions stored per second (default 10)")
    parser.add_argument("--read-rate", type=float, default=10, help="load: API searches per second (default 10)")
    parser.add_argument("--streams", type=int, default=2, help="load: open /v1/stream connections (default 2)")
    parser.add_argument(
        "--query-budget-s",
        type=float,
        default=60,
        help="stop sampling a query after this many seconds of its requests in a phase (default 60)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the seeded SQLite file (in --data-dir)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help=f"work folder (default {DATA_DIR})")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help=f"where to write (default {RESULTS_DIR})")
    parser.add_argument("--tag", help="write results/api_search-TAG.* instead of the default files")
    args = parser.parse_args(argv)
    args.rows = args.rows or (100_000 if args.quick else 1_000_000)
    args.samples = args.samples or (100 if args.quick else 400)
    databases = [d.strip() for d in args.databases.split(",") if d.strip()]
    if unknown := set(databases) - {"sqlite", "postgresql"}:
        raise SystemExit(f"unknown database {sorted(unknown)}")
    corpus = Corpus(args.rows, end=datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1))
    results: dict[str, Any] = {
        "benchmark": "api_search",
        "command": command_line("visioncap.bench.search.api", argv),
        "machine": machine_facts(),
        "goal": f"p99 < {GOAL_P99_MS:g} ms for each query, idle and under load, on each database",
        "rows": args.rows,
        "samples": args.samples,
        "load": {"write_rate": args.write_rate, "read_rate": args.read_rate, "streams": args.streams},
        "text_queries": TEXT_QUERIES,
        "filter_queries": FILTER_QUERIES,
        "scan_rows": ApiSettings.model_fields["api_search_scan_rows"].default,
        "databases": {},
    }
    for kind in databases:
        bench_database(kind, args, corpus, results)
    results["text_query_matches"] = {
        name: {"rows": corpus.matches[name], "share": round(corpus.matches[name] / args.rows, 4)}
        for name in TEXT_QUERIES
    }
    results["filter_query_matches"] = {
        name: {"rows": corpus.matches[name], "share": round(corpus.matches[name] / args.rows, 6)}
        for name in FILTER_QUERIES
    }
    results["by_status"] = dict(corpus.by_status)
    write_results("api_search" + (f"-{args.tag}" if args.tag else ""), results, _markdown, args.results_dir)
    return 0


def _markdown(r: dict[str, Any]) -> str:
    """The results as markdown: method, latency per database and query, the queries, the databases, notes, plans."""
    lines = [*_method_and_latency(r), *_queries(r), *_databases(r), *_notes(r), *_plans(r)]
    return "\n".join(lines)


def _method_and_latency(r: dict[str, Any]) -> list[str]:
    """What was measured and how, then each database's latency per query, idle and under load."""
    m = r["machine"]
    lines = [
        "# REST API search latency on a million captions",
        "",
        f"Command: `{r['command']}`",
        "",
        machine_line(m, f"Python {m['python']}"),
        "",
        f"{r['rows']:,} captions ({', '.join(f'{k} {v:,}' for k, v in r['by_status'].items())}), 20 cameras over 60 "
        f"days. Client: one keep-alive HTTP connection to `visioncap api` (uvicorn, access log off), requests one "
        f"after another, round robin over the queries, {r['samples']} per query and phase; latency = request sent to "
        f"body read. Load (a second process): {r['load']['write_rate']:g} captions/s stored through `CaptionStore` "
        f"(a pending row, then its caption, as the pipeline writes), {r['load']['read_rate']:g} searches/s through "
        f"the API, {r['load']['streams']} open `/v1/stream` connections. Goal: {r['goal']}.",
        "",
        "| database | query | idle p50 / p99 ms | **under load p50 / p99 ms** | items (samples idle, load) "
        "| partial pages / 503, under load | search_captions alone, "
        "idle p50 / p99 ms | CPU per request, idle: API / database ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind, entry in r["databases"].items():
        for name, idle in entry["idle"].items():
            load, alone = entry["load"][name], entry["queries_in_process"][name]
            mark = "" if load["p99_ms"] < GOAL_P99_MS and idle["p99_ms"] < GOAL_P99_MS else " (misses goal)"
            bounded = f"{100 * load.get('partial_share', 0):.0f} % / {load.get('search_timeouts', 0)}"
            lines.append(
                f"| {kind} | {name} | {idle['p50_ms']} / {idle['p99_ms']} | **{load['p50_ms']} / {load['p99_ms']}**"
                f"{mark} | {load['items_median']:g} ({idle['samples']}, {load['samples']}) | {bounded} "
                f"| {alone['p50_ms']} / {alone['p99_ms']} "
                f"| {idle['api_cpu_ms_mean']} / {idle['database_cpu_ms_mean']} |"
            )
    return lines


def _queries(r: dict[str, Any]) -> list[str]:
    """What each query asks for and how many rows it matches."""
    lines = ["", "Queries (first page, newest first, default page size 50):", ""]
    lines.append("- `newest`: no filter.")
    lines.append("- `camera_range`: one camera (varies) and one day (varies) of the 60: `camera`, `since`, `until`.")
    for name, q in r["text_queries"].items():
        match = r["text_query_matches"][name]
        lines.append(f"- `{name}`: `q={q}` ({match['rows']:,} rows match, {100 * match['share']:.2f} %).")
    for name, filters in r.get("filter_queries", {}).items():
        match = r["filter_query_matches"][name]
        request = "&".join(f"{key}={value}" for key, value in filters.items())
        lines.append(
            f"- `{name}`: `{request}` ({match['rows']:,} rows match, {100 * match['share']:.2f} %); no index serves "
            f"it, so each request examines at most {r['scan_rows']:,} rows of the newest-first walk and a page not "
            "full by then is partial (fewer items, maybe none) with a cursor."
        )
    lines.append(
        f"- `{CAMERAS_QUERY}`: `GET /v1/cameras`, the 20 cameras with state, newest frame and counts by status and "
        "events (the web page loads it beside the captions); items = cameras."
    )
    return lines


def _databases(r: dict[str, Any]) -> list[str]:
    """Each database's version, seeding time, size and what the load process did."""
    lines = ["", "| database | version | seed total s (load / indexes / vacuum) | size MB | load process |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for kind, entry in r["databases"].items():
        s, lp = entry["seed"], entry["load_process"]
        lines.append(
            f"| {kind} | {entry['version']} | {s['total_s']} ({s['load_s']} / {s['index_s']} / {s['vacuum_s']}) "
            f"| {entry['database_bytes'] / 1e6:.0f} | {lp['writes_per_s']} writes/s over {lp['seconds']} s; "
            f"{lp['counts']} |"
        )
    return lines


def _notes(r: dict[str, Any]) -> list[str]:
    """How the databases were seeded and how busy the machine was; then the query plans' heading."""
    return [
        "",
        "Seeding: the project's migrations create the schema; the secondary indexes (and SQLite's full-text "
        "triggers) are dropped for the bulk load (SQLite: `executemany` of the values SQLAlchemy binds; "
        "PostgreSQL: `COPY`), then every migration step runs again, which recreates them and rebuilds the "
        "full-text index; PostgreSQL then gets the `VACUUM ANALYZE` autovacuum would do. A rare-word search is "
        "checked against the seeded count before measuring.",
        "",
        "Absolute figures depend on a shared 2-core machine: the client, the API server, the database, the "
        "load process and whatever else runs there share its cores. Load average (1, 5, 15 min) when each "
        "database's measurement began and ended: "
        + "; ".join(
            f"{kind} {entry.get('load_average_before')} -> {entry.get('load_average_after')}"
            for kind, entry in r["databases"].items()
        )
        + ". The CPU column is what a request costs the API process and the database server (PostgreSQL's "
        "backends; SQLite runs inside the API process), read from /proc around each request while idle and "
        "averaged: unlike latency, it does not grow when other processes take the cores.",
        "",
        "## Query plans",
        "",
    ]


def _plans(r: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for kind, entry in r["databases"].items():
        for name, plan in entry["plans"].items():
            lines += [f"{kind}, `{name}`:", "", "```", plan, "```", ""]
    return lines


if __name__ == "__main__":
    sys.exit(main())
