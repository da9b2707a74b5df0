"""API processes are stateless: several `visioncap api` on one PostgreSQL serve the same captions, and the live
stream from any of them delivers what is stored, whichever process a client reached."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helpers import serve_api
from pg import fresh_database
from test_stream_live import KEY, stream, write_captioned

from visioncap.store import CaptionStore, create_db_engine

TIMEOUT_S = 120  # a bound on a broken test, never a measurement


@pytest.fixture
def shared_database(postgres: str) -> str:
    return fresh_database(postgres)


def test_two_api_processes_on_one_database_stream_the_same_captions(shared_database: str, tmp_path: Path) -> None:
    store = CaptionStore(create_db_engine(shared_database))
    store.create_schema()
    with (
        serve_api(tmp_path / "a", shared_database, KEY, VISIONCAP_API_STREAM_POLL_S="0.1") as first_url,
        serve_api(tmp_path / "b", shared_database, KEY, VISIONCAP_API_STREAM_POLL_S="0.1") as second_url,
    ):
        urls = [first_url, second_url]
        clients = [httpx.Client(base_url=url, headers={"X-Api-Key": KEY}, timeout=TIMEOUT_S) for url in urls]
        with stream(clients[0]) as one, stream(clients[1]) as other:
            ids = write_captioned(store, range(3), "door")
            for reader in (one, other):
                assert [event.row_id for event in reader.captions(3)] == ids
        # And what one process lists, the other lists too: nothing of a caption lives in a process.
        listed = [sorted(row["id"] for row in client.get("/v1/captions").json()["items"]) for client in clients]
        assert listed[0] == listed[1] == sorted(ids)
        for client in clients:
            client.close()
