"""Request bodies have a limit per route (issue 40, item 8): the API read bodies of any size into memory (four
50 MB bodies took it from 152 to 522 MiB). Beyond the limit it answers 413 in its error shape before reading on:
a declared Content-Length at once, before a byte of the body is sent; a chunked body at the first chunk past it,
before its end is sent. Ask's chat messages have a larger limit of their own; both are settings.

The API runs under uvicorn on a real socket, and the over-limit requests are written byte by byte on a raw one, so
that the test decides what the server has been sent when it answers."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from helpers import offline_api_settings
from taps import AsgiThread

from visioncap.api import create_app
from visioncap.config.api import ApiSettings
from visioncap.store import CaptionStore, create_db_engine

KEY = "body-limit-write-key"
LIMIT = 4096  # VISIONCAP_API_MAX_BODY_BYTES here
ASK_LIMIT = 64 * 1024  # VISIONCAP_ASK_MAX_BODY_BYTES here
TIMEOUT_S = 20  # a bound on a broken test (a server waiting for a body never sent), never a measurement


def settings(tmp_path: Path) -> ApiSettings:
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'visioncap.db'}"
    CaptionStore(create_db_engine(url)).create_schema()
    return offline_api_settings(data_dir, url, KEY, api_max_body_bytes=LIMIT, ask_max_body_bytes=ASK_LIMIT)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[str, int]]:
    with AsgiThread(create_app(settings(tmp_path))) as server:
        host, port = server.root_url.removeprefix("http://").split(":")
        yield host, int(port)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings(tmp_path)), headers={"X-Api-Key": KEY}) as client:
        yield client


def head(path: str, *fields: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: api", f"X-Api-Key: {KEY}", "Content-Type: application/json", *fields]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(sock: socket.socket) -> tuple[int, dict[str, object]]:
    """The status and JSON body of the response on `sock` (the server closes or keeps it; either way)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before a response: {data!r}"
        data += chunk
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed inside the response"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body[:length])


def assert_too_large(status: int, body: dict[str, object], limit: int) -> None:
    assert status == 413, body
    assert body == {
        "error": {
            "message": f"the body is larger than this route's limit of {limit} bytes",
            "type": "invalid_request_error",
            "param": None,
            "code": 413,
        }
    }


@pytest.mark.parametrize(("path", "limit"), [("/v1/cameras", LIMIT), ("/v1/chat/completions", ASK_LIMIT)])
def test_a_declared_length_past_the_limit_is_refused_before_the_body_is_sent(
    api: tuple[str, int], path: str, limit: int
) -> None:
    with socket.create_connection(api, timeout=TIMEOUT_S) as sock:
        sock.sendall(head(path, "Content-Length: 50000000"))  # 50 MB announced, none of it sent
        assert_too_large(*answer(sock), limit)


@pytest.mark.parametrize(("path", "limit"), [("/v1/alerts/rules", LIMIT), ("/v1/chat/completions", ASK_LIMIT)])
def test_a_chunked_body_is_refused_at_the_first_chunk_past_the_limit(
    api: tuple[str, int], path: str, limit: int
) -> None:
    chunk = b'{"pad": "' + b"x" * 1000 + b'"}'
    with socket.create_connection(api, timeout=TIMEOUT_S) as sock:
        sock.sendall(head(path, "Transfer-Encoding: chunked"))
        sent = 0
        while sent <= limit:  # just past the limit, and never the last (empty) chunk that would end the body
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        assert_too_large(*answer(sock), limit)


def test_bodies_within_the_limits_are_read_and_validated(client: TestClient) -> None:
    # Past the default limit, within Ask's: Ask reads it and judges its messages (too long for its 4000 characters).
    long = {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * LIMIT)}]}
    response = client.post("/v1/chat/completions", json=long)
    assert response.status_code == 422 and response.json()["error"]["param"] == "messages.0.content"
    # The same size to another route is refused by its own, smaller limit.
    response = client.post("/v1/alerts/rules", json={"name": "r", "pad": "x" * (2 * LIMIT)})
    assert response.status_code == 413 and response.json()["error"]["code"] == 413
    # Within the limit: read and validated as before.
    response = client.post("/v1/alerts/rules", json={"name": "r", "pad": "x" * 100})
    assert response.status_code == 422 and response.json()["error"]["param"] == "pad"


def test_the_limits_are_documented_on_every_operation_with_a_body(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if "requestBody" in operation:
                assert "413" in operation["responses"], (method, path)
