"""Several vLLM replicas behind one gateway: where a chat or a frame goes, health checks, retries.

The answering replica is the session's real vLLM; the other is the tap (a real proxy to it that records and can
hold requests), a closed port (a replica that is down), or a scripted socket that dies mid-stream.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from gateway_calls import auth, chat_body, post_chat
from helpers import scrape_metric
from taps import AsgiThread, Tap, serving

from visioncap import __version__
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import VllmServer, free_port

CHAT_KEY = "replicas-chat-key"
FRAMES_KEY = "replicas-frames-key"
TIMEOUT = 120  # seconds; only a bound on a broken test, never a measurement


def config_for(upstreams: list[dict[str, Any]], frames_upstream: str | None = None) -> GatewayConfig:
    frames: dict[str, Any] = {"upstream": frames_upstream} if frames_upstream else {}
    return GatewayConfig.model_validate(
        {
            # No load polls: the choices below rest on what the gateway itself sent.
            "upstreams": [{"metrics_poll_s": 0, **upstream} for upstream in upstreams],
            "keys": [
                {"name": "chat", "sha256": hash_key(CHAT_KEY), "traffic_class": "interactive"},
                {"name": "frames", "sha256": hash_key(FRAMES_KEY), "traffic_class": "background", **frames},
            ],
        }
    )


def metric(gw: GatewayThread, name: str, **labels: str) -> float:
    """Sum of a series' samples whose labels include `labels`."""
    return scrape_metric(gw.root_url, name, **labels)


def wait_until(gw: GatewayThread, name: str, up: bool) -> float:
    """Block until replica `name` is in (`up`) or out; since when, on time.monotonic (the gateway's clock)."""
    replica = gw.gateway.replica(name)
    return gw.call(lambda: replica.wait_until(up, TIMEOUT), timeout=TIMEOUT + 5)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=4) as executor:
        yield executor


@pytest.fixture
def tap(vllm_server: VllmServer) -> Iterator[Tap]:
    with serving(Tap(vllm_server.root_url)) as tap:
        yield tap


def test_a_chat_goes_to_the_replica_with_fewer_requests_ahead(
    vllm_server: VllmServer, tap: Tap, pool: ThreadPoolExecutor
) -> None:
    config = config_for(
        [{"name": "a", "base_url": f"{tap.root_url}/v1"}, {"name": "b", "base_url": vllm_server.base_url}]
    )
    with GatewayThread(config) as gw:
        wait_until(gw, "a", up=True)
        wait_until(gw, "b", up=True)
        release = tap.hold("first")
        first = pool.submit(post_chat, gw, CHAT_KEY, chat_body(max_tokens=4, user="first"))
        tap.wait_for_user("first")  # equal replicas: the first listed got it, and holds it before any token
        second = post_chat(gw, CHAT_KEY, chat_body(max_tokens=4, user="second"))
        assert second.status_code == 200
        assert "second" not in tap.users_seen()  # it went to b, where nothing was ahead of it
        release.set()
        assert first.result(TIMEOUT).status_code == 200
        for name in ("a", "b"):
            assert metric(gw, "visioncap_gateway_upstream_requests_total", upstream=name) == 1, name
        assert metric(gw, "visioncap_gateway_retries_total") == 0


def test_frames_stay_on_their_replica_spill_while_it_is_out_and_return_when_it_is_back(
    vllm_server: VllmServer,
) -> None:
    tap = Tap(vllm_server.root_url)
    served = AsgiThread(tap.app).__enter__()
    tap.root_url = served.root_url
    port = int(served.root_url.rsplit(":", 1)[1])
    try:
        config = config_for(
            [{"name": "a", "base_url": vllm_server.base_url}, {"name": "b", "base_url": f"{tap.root_url}/v1"}],
            frames_upstream="b",
        )
        with GatewayThread(config) as gw:
            wait_until(gw, "a", up=True)
            wait_until(gw, "b", up=True)
            assert httpx.get(f"{gw.root_url}/readyz", timeout=TIMEOUT).json()["upstreams"] == {"a": "in", "b": "in"}
            # Its own replica although the first listed is just as idle.
            assert post_chat(gw, FRAMES_KEY, chat_body(max_tokens=4, user="f1")).status_code == 200
            assert tap.users_seen() == ["f1"]

            stopped_at = time.monotonic()
            served.__exit__(None, None, None)  # the replica dies: nothing listens on its port any more
            assert wait_until(gw, "b", up=False) - stopped_at <= 5
            ready = httpx.get(f"{gw.root_url}/readyz", timeout=TIMEOUT)
            assert ready.status_code == 200 and ready.json()["upstreams"] == {"a": "in", "b": "out"}
            assert metric(gw, "visioncap_gateway_upstream_up", upstream="b") == 0
            assert post_chat(gw, FRAMES_KEY, chat_body(max_tokens=4, user="f2")).status_code == 200  # spilled to a
            assert (
                metric(gw, "visioncap_gateway_upstream_requests_total", upstream="a", traffic_class="background") == 1
            )

            back = Tap(vllm_server.root_url)
            with AsgiThread(back.app, port=port):  # the replica is back where it was
                wait_until(gw, "b", up=True)
                assert metric(gw, "visioncap_gateway_upstream_up", upstream="b") == 1
                assert post_chat(gw, FRAMES_KEY, chat_body(max_tokens=4, user="f3")).status_code == 200
                assert back.users_seen() == ["f3"]
            assert (
                metric(gw, "visioncap_gateway_upstream_requests_total", upstream="b", traffic_class="background") == 2
            )
    finally:
        served.__exit__(None, None, None)


def test_a_chat_refused_by_its_replica_is_retried_on_another(vllm_server: VllmServer) -> None:
    # No health checks on `a`, so it counts as in and, listed first, gets the chat; nothing listens there.
    dead = {"name": "a", "base_url": f"http://127.0.0.1:{free_port()}/v1", "health_interval_s": 0}
    with GatewayThread(config_for([dead, {"name": "b", "base_url": vllm_server.base_url}])) as gw:
        wait_until(gw, "b", up=True)
        answer = post_chat(gw, CHAT_KEY, chat_body(max_tokens=4, user="retried"))
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 4
        assert metric(gw, "visioncap_gateway_retries_total", upstream="a") == 1
        for name in ("a", "b"):
            assert metric(gw, "visioncap_gateway_upstream_requests_total", upstream=name) == 1, name
        assert gw.call_soon(lambda: gw.gateway.replica("a").controller.interactive_in_flight) == 0


@contextmanager
def scripted_replica(
    vllm_server: VllmServer, pool: ThreadPoolExecutor, answer: bytes
) -> Iterator[tuple[GatewayThread, Future[None]]]:
    """A gateway whose replica `a` is a socket that answers one connection (the chat's) with `answer` and hangs up,
    and `b` the real vLLM, in; the gateway and a future done once `a` has answered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(TIMEOUT)  # a broken test's accept gives up instead of holding the pool

        def answer_one() -> None:
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                connection.sendall(answer)

        scripted: dict[str, Any] = {
            "name": "a",
            "base_url": f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
            "health_interval_s": 0,  # it answers one connection: the chat's
        }
        with GatewayThread(config_for([scripted, {"name": "b", "base_url": vllm_server.base_url}])) as gw:
            wait_until(gw, "b", up=True)  # so there is a replica to retry on
            yield gw, pool.submit(answer_one)


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_answered_5xx_before_its_first_byte_is_retried_on_another(
    vllm_server: VllmServer, pool: ThreadPoolExecutor, stream: bool
) -> None:
    body = b'{"error":{"message":"engine overloaded","code":503}}'
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    answer_503 = head + b"content-length: %d\r\n\r\n%s" % (len(body), body)
    with scripted_replica(vllm_server, pool, answer_503) as (gw, served):
        answer = post_chat(gw, CHAT_KEY, chat_body(max_tokens=4, user="overloaded", stream=stream))
        served.result(TIMEOUT)
        assert answer.status_code == 200, answer.text
        if stream:
            assert answer.text.rstrip().endswith("data: [DONE]")
        else:
            assert answer.json()["usage"]["completion_tokens"] == 4
        assert metric(gw, "visioncap_gateway_retries_total", upstream="a") == 1
        for name in ("a", "b"):
            assert metric(gw, "visioncap_gateway_upstream_requests_total", upstream=name) == 1, name


def test_a_chat_is_never_retried_once_its_answer_has_begun(vllm_server: VllmServer, pool: ThreadPoolExecutor) -> None:
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    one_chunk_then_hang_up = head + b"%x\r\n%s\r\n" % (len(event), event)
    with scripted_replica(vllm_server, pool, one_chunk_then_hang_up) as (gw, served):
        url = f"{gw.base_url}/chat/completions"
        headers = auth(CHAT_KEY)
        with httpx.stream(
            "POST", url, json=chat_body(max_tokens=4, user="cut", stream=True), headers=headers, timeout=TIMEOUT
        ) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        served.result(TIMEOUT)
        # It ends with the error, from this replica: the caller learns the answer broke off.
        assert json.loads(lines[-1].removeprefix("data: "))["error"]["code"] == 502 and "data: [DONE]" not in lines
        assert metric(gw, "visioncap_gateway_retries_total") == 0
        assert metric(gw, "visioncap_gateway_upstream_requests_total", upstream="b") == 0


def test_readyz_is_503_while_no_upstream_is_in() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with GatewayThread(config_for([{"name": "dead", "base_url": dead}])) as gw:
        wait_until(gw, "dead", up=False)
        ready = httpx.get(f"{gw.root_url}/readyz", timeout=TIMEOUT)
        assert ready.status_code == 503
        assert ready.json() == {"status": "unavailable", "version": __version__, "upstreams": {"dead": "out"}}
        health = httpx.get(f"{gw.root_url}/healthz", timeout=TIMEOUT).json()
        assert health["ready"] is False and health["upstreams"]["dead"]["up"] is False
        assert health["upstreams"]["dead"]["health_error"] is None  # what went wrong only for a valid key
