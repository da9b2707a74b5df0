"""API processes are stateless: several `visioncap api` on one PostgreSQL serve the same captions, and the live
stream from any of them delivers what is stored, whichever process a client reached."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import start_cli, wait_for
from pg import fresh_database
from test_stream_live import KEY, stream, write_captioned

from visioncap.config.keys import hash_key
from visioncap.serve import free_port
from visioncap.store import CaptionStore, create_db_engine

TIMEOUT_S = 120  # a bound on a broken test, never a measurement


@pytest.fixture
def shared_database(postgres: str) -> str:
    return fresh_database(postgres)


def api_process(database_url: str, data_dir: Path) -> Iterator[str]:
    """`visioncap api` on `database_url` until the generator is closed; its base URL once it answers."""
    port = free_port()
    env = {
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_DATABASE_URL": database_url,
        "VISIONCAP_API_KEYS": json.dumps([{"name": "reader", "sha256": hash_key(KEY), "scopes": ["read"]}]),
        "VISIONCAP_API_STREAM_POLL_S": "0.1",
        "VISIONCAP_API_READY_CHECK_VLM": "false",
    }
    process: subprocess.Popen[str] = start_cli("api", "--port", str(port), "--log-level", "WARNING", env=env)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert process.poll() is None, f"visioncap api exited: {process.communicate()[1]}"
        try:
            return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, TIMEOUT_S, "visioncap api to answer /healthz")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=TIMEOUT_S)


def test_two_api_processes_on_one_database_stream_the_same_captions(shared_database: str, tmp_path: Path) -> None:
    store = CaptionStore(create_db_engine(shared_database))
    store.create_schema()
    first_api, second_api = api_process(shared_database, tmp_path / "a"), api_process(shared_database, tmp_path / "b")
    try:
        urls = [next(first_api), next(second_api)]
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
    finally:
        first_api.close()
        second_api.close()
