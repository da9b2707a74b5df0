"""A request refused before its body is read still gets its answer, and the gateway does not wait on it for ever.

Real `visioncap gateway` processes and raw sockets: the client sends its body in paced pieces and reads only once
it has sent everything, as httpx does; the pacing is the scenario (a slow camera uplink), not synchronisation.
"""

from __future__ import annotations

import inspect
import json
import socket
import time
from pathlib import Path

import pytest
import uvicorn

from visioncap.bench.common.gateway_proc import GatewayProcess
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key

KEY = "refused-upload-camera-key"
MIB = 1024 * 1024
BUDGET = 1 * MIB  # below the declared body: refused 429 body_budget_full before a byte is read
LIMIT = 16 * MIB
DECLARED = 4 * MIB
PIECE = 256 * 1024
# uvicorn closes an idle keep-alive connection after this many seconds: a refused upload that pauses longer
# than that must still get its answer.
KEEP_ALIVE_S = inspect.signature(uvicorn.Config).parameters["timeout_keep_alive"].default
PATIENT_DRAIN_S = 30.0
STRICT_DRAIN_S = 1.5


def gateway(upstream: str, tmp_path: Path, drain_s: float) -> GatewayProcess:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "silent", "base_url": upstream, "metrics_poll_s": 0, "health_interval_s": 0}],
            "keys": [{"name": "cams", "sha256": hash_key(KEY), "traffic_class": "background"}],
            "limits": {
                "max_background_body_bytes": LIMIT,
                "max_waiting_body_bytes": BUDGET,
                "refused_body_drain_s": drain_s,
            },
        }
    )
    return GatewayProcess(config, tmp_path, name=f"gateway-drain-{drain_s:g}")


def head(port: int, key: str, length: int) -> bytes:
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


def read_answer(sock: socket.socket, timeout_s: float, to_end: bool = False) -> bytes:
    """The gateway's answer, complete by its Content-Length (`to_end`: and all it sends until it closes); a reset or
    a timeout fails the test with what came before."""
    sock.settimeout(timeout_s)
    received = b""
    while to_end or not complete(received):
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError) as exc:
            raise AssertionError(f"{type(exc).__name__} after {len(received)} bytes: {received[:300]!r}") from exc
        if not chunk:
            break
        received += chunk
    return received


def complete(received: bytes) -> bool:
    head_bytes, found, body = received.partition(b"\r\n\r\n")
    return bool(found) and len(body) >= int(parse_head(head_bytes)[1]["content-length"])


def parse_head(head_bytes: bytes) -> tuple[int, dict[str, str]]:
    status_line, *lines = head_bytes.decode().split("\r\n")
    headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers


def parse(answer: bytes) -> tuple[int, dict[str, str], dict[str, object]]:
    head_bytes, _, body = answer.partition(b"\r\n\r\n")
    status, headers = parse_head(head_bytes)
    assert len(body) == int(headers["content-length"]), answer[:300]
    return status, headers, json.loads(body)


@pytest.mark.parametrize(
    ("key", "status", "error_type"),
    [(KEY, 429, "body_budget_full"), ("not-a-key", 401, "authentication_error")],
    ids=["body_budget_full", "unauthorized"],
)
def test_a_slow_upload_refused_early_reads_its_whole_answer(
    silent_vlm: str, tmp_path: Path, key: str, status: int, error_type: str
) -> None:
    with (
        gateway(silent_vlm, tmp_path, PATIENT_DRAIN_S) as gw,
        socket.create_connection(("127.0.0.1", gw.port)) as sock,
    ):
        # One small first piece, read with the head: the answer goes out, and then nothing arrives for a while.
        sock.sendall(head(gw.port, key, DECLARED) + b" " * 1024)
        time.sleep(KEEP_ALIVE_S + 1)  # the slow uplink: a pause longer than uvicorn's keep-alive timeout
        # The gateway still reads: every write goes through (one that fails is where a client like asyncio's
        # transports drops the connection, answer unread).
        for sent in range(1024, DECLARED, PIECE):
            sock.sendall(b" " * min(PIECE, DECLARED - sent))
        answer = read_answer(sock, timeout_s=30)
    code, headers, body = parse(answer)
    assert code == status
    assert body["error"]["type"] == error_type  # type: ignore[index]
    assert headers["connection"] == "close"
    if status == 429:
        assert int(headers["retry-after"]) >= 1


def test_a_refused_upload_that_stalls_is_closed_within_the_drain_time(silent_vlm: str, tmp_path: Path) -> None:
    with (
        gateway(silent_vlm, tmp_path, STRICT_DRAIN_S) as gw,
        socket.create_connection(("127.0.0.1", gw.port)) as sock,
    ):
        sock.sendall(head(gw.port, KEY, DECLARED) + b" " * PIECE)
        sock.settimeout(30)
        first = sock.recv(65536)  # the answer comes before the body is in
        assert first.startswith(b"HTTP/1.1 429 "), first[:300]
        sock.sendall(b" " * PIECE)  # then one more piece, and the caller never sends again
        answered = time.monotonic()
        rest = read_answer(sock, timeout_s=STRICT_DRAIN_S + 30, to_end=True)
        closed_after_s = time.monotonic() - answered
    code, headers, _ = parse(first + rest)
    assert code == 429 and int(headers["retry-after"]) >= 1
    assert closed_after_s < STRICT_DRAIN_S + 5, f"open {closed_after_s:.1f} s after the answer"


def test_a_refused_upload_is_read_no_further_than_the_body_limit(silent_vlm: str, tmp_path: Path) -> None:
    """A caller that keeps sending past the route's body limit is cut off long before the drain time is up."""
    declared = 8 * LIMIT
    with (
        gateway(silent_vlm, tmp_path, PATIENT_DRAIN_S) as gw,
        socket.create_connection(("127.0.0.1", gw.port)) as sock,
    ):
        sock.sendall(head(gw.port, KEY, declared))
        sock.settimeout(30)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 429 "), first[:300]
        started = time.monotonic()
        sent = 0
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            while sent < declared:
                sent += sock.send(b" " * MIB)
        cut_after_s = time.monotonic() - started
    assert LIMIT <= sent < declared
    assert cut_after_s < PATIENT_DRAIN_S / 2, f"cut after {cut_after_s:.1f} s"
