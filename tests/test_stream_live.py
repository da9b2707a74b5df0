"""GET /v1/stream delivers every caption stored or changed after a client connects exactly once, in order.

The real API on a real socket (uvicorn in a thread) over SQLite and PostgreSQL, rows written through the real
CaptionStore from several threads while a real HTTP client reads the events. Tests wait for what they can see
(an event, an answer), never for a time: the stream's poll interval only decides how soon things happen.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from pg import fresh_database, own_cluster
from sqlalchemy import text

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.frames import Caption
from visioncap.store import CaptionStore, NewCaption, create_db_engine

KEY = "stream-test-key"
WRITE_KEY = "stream-test-write-key"
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
TIMEOUT = 60  # seconds; a bound on a broken test, never a measurement
BURST = 1000


# -- the API, writers and an event-stream reader ------------------------------------------------------


class LiveApi:
    """The app served by uvicorn in a thread; the socket listens before the server starts, so requests sent at
    once wait in its backlog instead of failing."""

    def __init__(self, app: FastAPI) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(256)
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    def __enter__(self) -> LiveApi:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(TIMEOUT)
        self._socket.close()

    def client(self, key: str = KEY) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"X-Api-Key": key}, timeout=TIMEOUT)


def make_app(database_url: str, data_dir: Path, **changes: Any) -> FastAPI:
    values: dict[str, Any] = {
        "database_url": database_url,
        "data_dir": data_dir,
        "vlm_base_url": "http://127.0.0.1:9/v1",  # discard port: nothing answers
        "api_keys": [
            ApiKey(name="reader", sha256=hash_key(KEY), scopes={"read"}),
            ApiKey(name="admin", sha256=hash_key(WRITE_KEY), scopes={"read", "write"}),
        ],
        "api_stream_poll_s": 0.05,
        "api_stream_heartbeat_s": 0.05,  # a comment after every idle poll: lines keep coming, the deadline is seen
    }
    values.update(changes)
    return create_app(ApiSettings(_env_file=None, **values))  # type: ignore[call-arg]


@pytest.fixture
def app(database_url: str, tmp_path: Path) -> FastAPI:
    return make_app(database_url, tmp_path / "data")


def new_caption(index: int, camera: str = "cam-1") -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source=f"/videos/{camera}.mp4",
        frame_index=index,
        offset_s=float(index),
        captured_at=T0 + timedelta(seconds=index),
        reason="new-event",
        people=[{"x1": 10.0, "y1": 10.0, "x2": 50.0, "y2": 90.0, "confidence": 0.9, "class_id": 0, "track_id": 1}],
        image_width=160,
        image_height=120,
        model="tiny",
        event_key=f"{camera}:{index}",
        image_path=f"{camera}/{index}.jpg",  # never read: only lets the row be captioned again
    )


def add_pending(store: CaptionStore, index: int, camera: str = "cam-1") -> int:
    row_id = store.add(new_caption(index, camera))
    assert row_id is not None
    return row_id


def caption(store: CaptionStore, row_id: int, words: str) -> None:
    store.mark_captioned(row_id, Caption(words, "tiny", 300, 12, 0.5), attempts=1)


def write_captioned(store: CaptionStore, indexes: range, camera: str = "cam-1") -> list[int]:
    """What the pipeline does for each selected frame: a pending row, then its caption (two transactions)."""
    ids = []
    for index in indexes:
        row_id = add_pending(store, index, camera)
        caption(store, row_id, f"frame {index}")
        ids.append(row_id)
    return ids


def write_in_threads(
    store: CaptionStore, first: int, count: int, threads: int
) -> tuple[ThreadPoolExecutor, list[Future[list[int]]]]:
    """`count` captioned rows from `threads` concurrent writers, each its own share in index order."""
    share = count // threads
    pool = ThreadPoolExecutor(threads)
    futures = [
        pool.submit(write_captioned, store, range(first + n * share, first + (n + 1) * share), f"cam-{n}")
        for n in range(threads)
    ]
    return pool, futures


@dataclass
class Block:
    """One block of the stream (up to a blank line): its fields as EventSource reads them."""

    event: str = "message"
    data: list[str] = field(default_factory=list)
    id: str | None = None
    comments: list[str] = field(default_factory=list)


@dataclass
class Delivered:
    id: str  # the SSE id (the change position)
    row_id: int
    caption: str | None


class EventReader:
    """text/event-stream parsed as a browser's EventSource does, keeping its last event id."""

    def __init__(self, response: httpx.Response) -> None:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        self._lines = response.iter_lines()
        self.last_event_id = ""
        self.deadline = time.monotonic() + TIMEOUT

    def block(self) -> Block:
        block, seen = Block(), False
        for line in self._lines:
            assert time.monotonic() < self.deadline, "the stream did not deliver in time"
            if line == "":
                if seen:
                    return block
                continue
            seen = True
            if line.startswith(":"):
                block.comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                block.data.append(value)
            elif name == "id" and "\x00" not in value:
                block.id = self.last_event_id = value
            elif name == "event":
                block.event = value
        raise AssertionError("the stream ended")

    def captions_until(self, done: Callable[[list[Delivered]], bool]) -> list[Delivered]:
        """Caption events until `done` holds for those read so far."""
        got: list[Delivered] = []
        while not done(got):
            block = self.block()
            if block.event == "caption":
                assert block.id is not None, "a caption event without an id"
                data = json.loads("\n".join(block.data))
                got.append(Delivered(block.id, data["id"], data["caption"]))
        return got

    def captions(self, count: int) -> list[Delivered]:
        return self.captions_until(lambda got: len(got) >= count)


def position(token: str) -> tuple[int, int]:
    xid, seq = token.split(".")
    return int(xid), int(seq)


def assert_in_position_order(events: list[Delivered]) -> None:
    positions = [position(event.id) for event in events]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), "ids not strictly increasing"


def finish(reader: EventReader, store: CaptionStore, index: int) -> list[Delivered]:
    """Write a last row and read until it arrives: whatever came twice or early has come by then."""
    sentinel = write_captioned(store, range(index, index + 1), "sentinel")[0]
    return reader.captions_until(lambda got: bool(got) and got[-1].row_id == sentinel)


@contextmanager
def stream(http: httpx.Client, last_event_id: str | None = None, **params: Any) -> Iterator[EventReader]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id is not None else {}
    with http.stream("GET", "/v1/stream", params=params, headers=headers) as response:
        reader = EventReader(response)
        reader.block()  # the opening block (its id is the start)
        yield reader


# -- tests ---------------------------------------------------------------------------------------------


def test_a_burst_reaches_a_connected_client_once_each_in_order(app: FastAPI, store: CaptionStore) -> None:
    """1,000 captions from four concurrent writers (2,000 transactions) while a client is connected: every one
    arrives, once, in each writer's order; nothing stored before the client connected does."""
    before = write_captioned(store, range(5))
    with LiveApi(app) as api, api.client() as http, stream(http) as reader:
        pool, futures = write_in_threads(store, 100, BURST, threads=4)
        with pool:
            got = reader.captions(BURST)
            written = [future.result(TIMEOUT) for future in futures]
        got += finish(reader, store, 10_000)
    ids = [event.row_id for event in got[:-1]]
    assert Counter(ids) == Counter(row_id for share in written for row_id in share), "each row exactly once"
    assert not set(before) & set(ids)
    for share in written:  # one writer's rows arrive in the order it wrote them
        assert [row_id for row_id in ids if row_id in set(share)] == share
    assert_in_position_order(got)
    assert all(event.caption == f"frame {store.get(event.row_id).frame_index}" for event in got[:50])  # type: ignore[union-attr]


def test_a_client_that_reconnects_with_last_event_id_gets_what_it_missed(app: FastAPI, store: CaptionStore) -> None:
    """A client that drops mid-burst and comes back with the last id it saw (what EventSource sends) gets the
    rest: the connections together hold every row exactly once. The id of the opening block counts too: a client
    gone before any caption resumes from where it first connected."""
    with LiveApi(app) as api, api.client() as http:
        with stream(http) as first:
            opened = first.last_event_id
        assert opened, "the opening block carries the start's id"
        pool, futures = write_in_threads(store, 100, BURST, threads=2)
        with pool:
            with stream(http, opened) as second:
                early = second.captions(300)
                resume = second.last_event_id
            assert resume == early[-1].id
            with stream(http, resume) as third:
                late = third.captions(BURST - 300)
                written = [future.result(TIMEOUT) for future in futures]
                late += finish(third, store, 10_000)
    ids = [event.row_id for event in early + late[:-1]]
    assert Counter(ids) == Counter(row_id for share in written for row_id in share), "each row exactly once"
    assert_in_position_order(early + late)


def test_last_event_id_is_checked(app: FastAPI, store: CaptionStore) -> None:
    """A malformed id, or one ahead of everything this database wrote, is refused naming the header, never a 500
    and never a stream that silently waits for positions this database will take ages to reach."""
    write_captioned(store, range(3))
    with LiveApi(app) as api, api.client() as http:
        for bad in ("12", "a.b", "1.2.3", "-1.2", "1." + "9" * 30, "x" * 65, "9" * 18 + ".1"):
            with http.stream("GET", "/v1/stream", headers={"Last-Event-ID": bad}) as response:
                assert response.status_code == 422, (bad, response.status_code)
                assert response.read() and response.json()["error"]["param"] == "Last-Event-ID", bad


def test_a_caption_generated_again_comes_again_once(app: FastAPI, store: CaptionStore) -> None:
    """Rows already delivered, put back in the outbox (regenerate) and captioned again, arrive a second time,
    once each, with the new caption; the pending state in between is not an event."""
    with LiveApi(app) as api, api.client() as http, stream(http) as reader:
        ids = write_captioned(store, range(250))
        first = reader.captions(250)
        assert [event.row_id for event in first] == ids
        with api.client(WRITE_KEY) as writer:
            assert writer.post(f"/v1/captions/{ids[0]}/regenerate").status_code == 202
        for row_id in ids[1:]:
            assert store.requeue(row_id)
        for row_id in ids:
            caption(store, row_id, f"again {row_id}")
        second = reader.captions(250)
        second += finish(reader, store, 10_000)
    assert [event.row_id for event in second[:-1]] == ids
    assert all(event.caption == f"again {event.row_id}" for event in second[:-1])
    assert_in_position_order(first + second)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_transaction_that_commits_late_is_not_skipped(app: FastAPI, store: CaptionStore, database_url: str) -> None:
    """PostgreSQL hands out sequence numbers at the write, not the commit: here `a` takes its number before `b`
    but commits after it. A reader that went by the number alone would send `b` and then skip `a` for good.

    Transaction C writes first and commits after B; when C's row arrives, B had committed and A had not. The
    stream holds B back until A ends, then sends A and B in the order their transactions began."""
    # Three cameras: the per-camera count rows the triggers update would otherwise make A wait for C.
    a, b, c = (add_pending(store, 0, camera) for camera in ("cam-a", "cam-b", "cam-c"))
    writer = create_db_engine(database_url)
    mark = text("UPDATE captions SET status = 'captioned', caption = :words WHERE id = :id")
    bounded = text(f"SET LOCAL lock_timeout = '{TIMEOUT}s'")  # a lock the test did not foresee fails, not hangs
    try:
        with LiveApi(app) as api, api.client() as http, stream(http) as reader:
            with writer.connect() as conn_c, writer.connect() as conn_a:
                tx_c = conn_c.begin()
                conn_c.execute(bounded)
                conn_c.execute(mark, {"id": c, "words": "c"})
                tx_a = conn_a.begin()
                conn_a.execute(bounded)
                conn_a.execute(mark, {"id": a, "words": "a"})
                caption(store, b, "b")  # its own transaction, committed here
                tx_c.commit()
                got = reader.captions(1)
                assert [event.row_id for event in got] == [c], "only C's row is final yet"
                tx_a.commit()
            got += reader.captions(2)
            got += finish(reader, store, 10_000)
    finally:
        writer.dispose()
    assert [(event.row_id, event.caption) for event in got[:-1]] == [(c, "c"), (a, "a"), (b, "b")]
    assert_in_position_order(got)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_rows_committed_before_connecting_stay_out_while_an_older_transaction_is_open(
    app: FastAPI, store: CaptionStore, database_url: str
) -> None:
    """A client connects while transaction OLD (which wrote first) is open and NEW (which wrote after it) has
    committed. The stream starts at OLD, which has not committed; NEW's row was there before the client and
    must not come. OLD's row, committed after the client connected, comes once."""
    old, new = (add_pending(store, 0, camera) for camera in ("cam-old", "cam-new"))
    writer = create_db_engine(database_url)
    mark = text("UPDATE captions SET status = 'captioned', caption = :words WHERE id = :id")
    try:
        with writer.connect() as conn_old:
            tx_old = conn_old.begin()
            conn_old.execute(text(f"SET LOCAL lock_timeout = '{TIMEOUT}s'"))
            conn_old.execute(mark, {"id": old, "words": "old"})
            caption(store, new, "new")
            with LiveApi(app) as api, api.client() as http, stream(http) as reader:
                tx_old.commit()
                got = reader.captions(1)
                got += finish(reader, store, 10_000)
    finally:
        writer.dispose()
    assert [(event.row_id, event.caption) for event in got[:-1]] == [(old, "old")]


def test_a_filtered_stream_moves_its_id_past_the_rows_it_leaves_out(app: FastAPI, store: CaptionStore) -> None:
    """Rows of other cameras never come, but the keep-alive comments carry the position past them: a client
    that reconnects with it does not have them walked again, and still gets its own camera's next row."""
    with LiveApi(app) as api, api.client() as http:
        with stream(http, camera="cam-mine") as reader:
            opened = reader.last_event_id
            write_captioned(store, range(300), "cam-other")
            while reader.last_event_id == opened:
                block = reader.block()
                assert block.event != "caption", block.data
            moved = reader.last_event_id
        assert position(moved) > position(opened)
        with stream(http, moved, camera="cam-mine") as resumed:
            mine = write_captioned(store, range(1000, 1001), "cam-mine")
            got = resumed.captions(1)
    assert [event.row_id for event in got] == mine


def test_the_open_stream_cap_holds_for_requests_that_arrive_together(database_url: str, tmp_path: Path) -> None:
    """20 clients connect at once against a cap of 5 while the database is slow to answer (every connection of
    the API's pool is taken): 5 streams open, 15 get 503 with Retry-After. A cap counted only once a stream had
    read the database would let all 20 in. The slots come back when clients go."""
    app = make_app(database_url, tmp_path / "data", api_max_streams=5)
    api_service = app.state.api
    pool = api_service.engine.pool
    answers: queue.Queue[tuple[int, str | None]] = queue.Queue()
    release = threading.Event()

    def connect() -> None:
        with api.client() as http, http.stream("GET", "/v1/stream") as response:
            answers.put((response.status_code, response.headers.get("retry-after")))
            if response.status_code == 200:
                assert release.wait(TIMEOUT)

    with LiveApi(app) as api, api.client() as http, ThreadPoolExecutor(20) as clients:
        # Every connection the pool will hand out (its size plus its overflow): the API's reads wait for one.
        held = [api_service.engine.connect() for _ in range(pool.size() + pool._max_overflow)]
        try:
            futures = [clients.submit(connect) for _ in range(20)]
            refused = [answers.get(timeout=TIMEOUT) for _ in range(15)]
        finally:
            for conn in held:
                conn.close()
        opened = [answers.get(timeout=TIMEOUT) for _ in range(5)]
        release.set()
        for future in futures:
            future.result(TIMEOUT)
        assert refused == [(503, "5")] * 15
        assert [status for status, _ in opened] == [200] * 5
        deadline = time.monotonic() + TIMEOUT
        while api_service.open_streams:  # the server sees the clients go
            assert time.monotonic() < deadline, f"{api_service.open_streams} slots never given back"
            time.sleep(0.02)
        with stream(http):
            assert api_service.open_streams == 1


@pytest.mark.postgres
def test_streams_wait_out_a_database_restart(tmp_path: Path) -> None:
    """The database stops under an open stream: the stream stays open, a client that reconnects with its last id
    gets in (EventSource gives up on anything but 200), a new client gets 503 with Retry-After (there is no
    start without the database). Once it is back, both streams get what is written, once."""
    with own_cluster() as cluster:  # of this test's own: stopping it disturbs no other test
        url = fresh_database(cluster.base_url)
        store = CaptionStore(create_db_engine(url))
        store.create_schema()
        app = make_app(url, tmp_path / "data")
        with LiveApi(app) as api, api.client() as http, stream(http) as reader:
            cluster.stop()
            with stream(http, reader.last_event_id) as resumed:
                with http.stream("GET", "/v1/stream") as refused:
                    assert refused.status_code == 503 and refused.headers["retry-after"]
                cluster.start()
                ids = write_captioned(store, range(3))
                first = finish(reader, store, 10)
                second = resumed.captions_until(lambda got: bool(got) and got[-1].row_id == first[-1].row_id)
    assert [event.row_id for event in first[:-1]] == [event.row_id for event in second[:-1]] == ids
