"""`visioncap api` started while its PostgreSQL is stopped: it stays up, answers 503 with Retry-After (the JSON
error shape) on data routes and /readyz, and serves once the database is started again (a real cluster of the
test's own, stopped before the start and started after)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers import serve_api, wait_for
from pg import fresh_database, own_cluster

from visioncap.bench.common.pgcluster import PostgresCluster

pytestmark = pytest.mark.postgres

KEY = "test-read-key-0123456789"
BACK_S = 60  # a bound on an API that never notices the database's return, never a measurement


@pytest.fixture
def cluster() -> Iterator[PostgresCluster]:
    """A PostgreSQL cluster of this test's own, so that stopping it disturbs no other test."""
    with own_cluster() as cluster:
        yield cluster


def test_api_started_during_an_outage_answers_503_then_serves_when_the_database_returns(
    cluster: PostgresCluster, tmp_path: Path
) -> None:
    url = fresh_database(cluster.base_url)  # never prepared: the schema is made once the database is back
    cluster.stop()
    headers = {"Authorization": f"Bearer {KEY}"}
    with serve_api(tmp_path, url, KEY) as root:
        for path in ("/v1/captions", "/v1/cameras", "/readyz"):
            answer = httpx.get(f"{root}{path}", headers=headers, timeout=10)
            assert answer.status_code == 503, (path, answer.text)
            assert int(answer.headers["Retry-After"]) > 0, path
            error = answer.json()["error"]
            assert error["code"] == 503 and error["type"] == "unavailable" and "unavailable" in error["message"]
        # No key still means 401, not a 503 that tells a stranger about the database.
        assert httpx.get(f"{root}/v1/captions", timeout=10).status_code == 401
        assert httpx.get(f"{root}/healthz", timeout=10).status_code == 200
        cluster.start()
        wait_for(
            lambda: httpx.get(f"{root}/v1/captions", headers=headers, timeout=10).status_code == 200,
            BACK_S,
            "the API to serve once the database is back",
        )
        assert httpx.get(f"{root}/v1/captions", headers=headers, timeout=10).json()["items"] == []
        assert httpx.get(f"{root}/readyz", headers=headers, timeout=10).status_code == 200
