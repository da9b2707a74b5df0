"""The priority gateway end to end: real sockets, the real vLLM server, the real `openai` client.

Gateways run in-process (uvicorn in a thread, `GatewayThread`). Where a test needs to see or stall what the
gateway sends, a recording hop (`Tap`) sits between the gateway and vLLM: it records every request body
and holds the requests a test names until the test lets them go; everything it forwards is answered by vLLM.
Every wait below waits on a state (the scheduler's queue, the tap's arrivals), never on time.
"""

from __future__ import annotations

import base64
import io
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from gateway_calls import auth, chat_body, post_chat
from helpers import REPO, TINY_MODEL, metric
from PIL import Image
from taps import Tap, serving

from visioncap.alerts.verify import Verifier
from visioncap.bench.common.load import background_held, probe_value, upstream_states
from visioncap.config.gateway import GatewayConfig, TrafficClassConfig
from visioncap.config.keys import hash_key
from visioncap.config.verify import VerifySpec, VlmEndpoint
from visioncap.gateway.images import data_uri_size, image_tokens
from visioncap.gateway.in_thread import GatewayThread
from visioncap.gateway.scheduler import SchedulerState
from visioncap.gateway.sse import StreamObserver
from visioncap.serve import VllmServer, check_own, free_port

INTERACTIVE_KEY = "test-interactive-key"
BACKGROUND_KEY = "test-background-key"
TIMEOUT = 120  # seconds; only a bound on a broken test, never a measurement


def config_for(
    base_url: str,
    interactive_key: dict[str, Any] | None = None,
    upstream: dict[str, Any] | None = None,
    **sections: Any,
) -> GatewayConfig:
    """A gateway in front of `base_url` (vLLM's /v1, `upstream` overriding its settings) with one interactive
    and one background key."""
    raw: dict[str, Any] = {
        "upstreams": [{"name": "vllm", "base_url": base_url, "metrics_poll_s": 0.5, **(upstream or {})}],
        "keys": [
            {
                "name": "chat",
                "sha256": hash_key(INTERACTIVE_KEY),
                "traffic_class": "interactive",
                **(interactive_key or {}),
            },
            {"name": "captions", "sha256": hash_key(BACKGROUND_KEY), "traffic_class": "background"},
        ],
    }
    for name, section in sections.items():
        raw[name] = {**raw.get(name, {}), **section}
    return GatewayConfig.model_validate(raw)


def jpeg_data_uri(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (90, 120, 150)).save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def image_chat_body(url: str, **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "who is there"}, {"type": "image_url", "image_url": {"url": url}}]
    return {**chat_body(max_tokens=4), "messages": [{"role": "user", "content": content}], **extra}


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of a server-sent-event stream, in order ("[DONE]" kept as a string)."""
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# -- fixtures ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[GatewayThread]:
    """A gateway with default caps straight in front of the real vLLM server."""
    with GatewayThread(config_for(vllm_server.base_url)) as gw:
        yield gw


@pytest.fixture
def tap(vllm_server: VllmServer) -> Iterator[Tap]:
    with serving(Tap(vllm_server.root_url)) as tap:
        yield tap


@pytest.fixture
def tapped_gateway(tap: Tap) -> Iterator[Callable[..., GatewayThread]]:
    """Factory: a gateway in front of the tap, with config sections overridden per test."""
    started: list[GatewayThread] = []

    def make(**sections: dict[str, Any]) -> GatewayThread:
        gw = GatewayThread(config_for(tap.root_url + "/v1", **sections))
        gw.start()
        started.append(gw)
        return gw

    yield make
    for gw in started:
        for gate in tap.held.values():
            gate.set()
        gw.stop()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def wait_queue(gw: GatewayThread, predicate: Callable[[SchedulerState], bool]) -> SchedulerState:
    """Block until the gateway's background scheduler reaches a state (checked on every change)."""
    return gw.call(lambda: gw.gateway.replicas[0].scheduler.wait_until(predicate, timeout=TIMEOUT), timeout=TIMEOUT + 5)


# -- run_gateway(): what `visioncap gateway` runs ----------------------------------------------------------------------


def test_serve_runs_a_gateway_from_a_file_until_sigterm(vllm_server: VllmServer, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(config_for(vllm_server.base_url).model_dump(mode="json", exclude_defaults=True)),
        encoding="utf-8",
    )
    port = free_port()
    program = (
        "import sys; from pathlib import Path; from visioncap.config.gateway import load_gateway_config; "
        "from visioncap.gateway import run_gateway; "
        "run_gateway(load_gateway_config(Path(sys.argv[1])), port=int(sys.argv[2]))"
    )
    process = subprocess.Popen([sys.executable, "-c", program, str(path), str(port)], cwd=REPO)
    try:
        root = f"http://127.0.0.1:{port}"
        give_up = time.monotonic() + TIMEOUT
        while True:  # another process: poll its health endpoint until it answers
            assert process.poll() is None, "gateway exited"
            try:
                if httpx.get(f"{root}/healthz", timeout=5).status_code == 200:
                    check_own(process.pid, port)  # not another test's gateway on a port both picked
                    break
            except httpx.HTTPError:
                assert time.monotonic() < give_up, "gateway never answered"
                time.sleep(0.1)
        answer = httpx.post(
            f"{root}/v1/chat/completions", json=chat_body(max_tokens=3), headers=auth(INTERACTIVE_KEY), timeout=TIMEOUT
        )
        assert answer.json()["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(TIMEOUT)
    assert code in (0, -signal.SIGTERM)  # uvicorn ends gracefully, then re-raises the signal it caught


# -- passthrough ---------------------------------------------------------------------------------------------


def stream_summary(events: list[Any]) -> dict[str, Any]:
    """What a stream delivered: its token ids and text in order, finish reasons and usage.

    Chunk boundaries are not compared: vLLM itself merges tokens into one chunk when its output loop falls
    behind (a busy machine), directly or not.
    """
    token_ids: list[int] = []
    text: list[str] = []
    finish = []
    usage = None
    for event in events:
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or usage
        for choice in event.get("choices") or ():
            token_ids += choice.get("token_ids") or []
            text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            if choice.get("finish_reason"):
                finish.append(choice["finish_reason"])
    return {"token_ids": token_ids, "text": "".join(text), "finish": finish, "usage": usage}


@pytest.mark.parametrize("path", ["/chat/completions", "/completions"])
def test_stream_passes_through_intact(gateway: GatewayThread, vllm_server: VllmServer, path: str) -> None:
    common = {
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if path == "/chat/completions":
        body = {**chat_body(), **common}
    else:
        body = {"model": TINY_MODEL, "prompt": "a person at the door", **common}
    summaries = []
    for base, headers in ((vllm_server.base_url, {}), (gateway.base_url, auth(INTERACTIVE_KEY))):
        with httpx.stream("POST", base + path, json=body, headers=headers, timeout=TIMEOUT) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = sse_events(response)
        assert events[-1] == "[DONE]"
        summaries.append(stream_summary(events))
    direct, through = summaries
    assert len(direct["token_ids"]) == 24
    assert through == direct  # same tokens, same text, same finish reason, same usage


def test_non_streaming_answer_matches_direct(gateway: GatewayThread, vllm_server: VllmServer) -> None:
    body = chat_body(max_tokens=12)
    direct = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=TIMEOUT).json()
    through = post_chat(gateway, INTERACTIVE_KEY, body).json()
    assert through["choices"] == direct["choices"]
    assert through["usage"] == direct["usage"]


@pytest.mark.parametrize(
    "body",
    [
        {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]},
        {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3},
        {"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
    ],
    ids=["unknown-model", "negative-max-tokens", "wrong-type"],
)
def test_vllm_errors_reach_the_caller_unchanged(
    gateway: GatewayThread, vllm_server: VllmServer, body: dict[str, Any]
) -> None:
    direct = httpx.post(f"{vllm_server.base_url}/chat/completions", json=body, timeout=TIMEOUT)
    through = post_chat(gateway, BACKGROUND_KEY, body)
    assert direct.status_code >= 400
    assert through.status_code == direct.status_code
    assert through.json() == direct.json()


def test_models_and_health(gateway: GatewayThread, vllm_server: VllmServer) -> None:
    models = httpx.get(f"{gateway.base_url}/models", headers=auth(BACKGROUND_KEY), timeout=TIMEOUT)
    assert models.status_code == 200
    assert [entry["id"] for entry in models.json()["data"]] == [TINY_MODEL]
    health = httpx.get(f"{gateway.root_url}/healthz", timeout=TIMEOUT)
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    # Without a key: whether it is up and how busy, not where vLLM is or what went wrong there.
    assert health.json()["upstreams"]["vllm"]["base_url"] is None
    assert vllm_server.base_url not in health.text and "127.0.0.1" not in health.text
    trusted = httpx.get(f"{gateway.root_url}/healthz", headers=auth(BACKGROUND_KEY), timeout=TIMEOUT).json()
    assert trusted["upstreams"]["vllm"]["base_url"] == vllm_server.base_url
    # vLLM's load is read from its filtered /metrics/ page (two gauges, not the whole 54 KB page).
    poller = gateway.gateway.replicas[0].poller
    assert poller is not None
    load = gateway.call(poller.poll_once)
    assert load is not None and load.waiting >= 0 and load.running >= 0
    assert poller.reads_filtered, poller.last_error
    trusted = httpx.get(f"{gateway.root_url}/healthz", headers=auth(BACKGROUND_KEY), timeout=TIMEOUT).json()
    metrics = trusted["upstreams"]["vllm"]["metrics"]
    assert metrics["ok"] is True and metrics["age_s"] >= 0


# -- the real openai client -----------------------------------------------------------------------------------


def test_openai_client_streaming_and_not(gateway: GatewayThread) -> None:
    client = openai.OpenAI(base_url=gateway.base_url, api_key=INTERACTIVE_KEY, max_retries=0, timeout=TIMEOUT)
    messages = [{"role": "user", "content": "what is on the street"}]
    extra = {"ignore_eos": True}
    whole = client.chat.completions.create(
        model=TINY_MODEL, messages=messages, max_tokens=10, temperature=0, extra_body=extra
    )
    assert whole.usage is not None and whole.usage.completion_tokens == 10
    pieces = []
    for chunk in client.chat.completions.create(
        model=TINY_MODEL, messages=messages, max_tokens=10, temperature=0, extra_body=extra, stream=True
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert "".join(pieces) == whole.choices[0].message.content
    completion = client.completions.create(
        model=TINY_MODEL, prompt="a car parks", max_tokens=5, temperature=0, extra_body=extra
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    streamed = list(
        client.completions.create(
            model=TINY_MODEL, prompt="a car parks", max_tokens=5, temperature=0, extra_body=extra, stream=True
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == completion.choices[0].text
    assert [m.id for m in client.models.list()] == [TINY_MODEL]


def test_openai_client_sees_refusals_as_typed_errors(gateway: GatewayThread) -> None:
    stranger = openai.OpenAI(base_url=gateway.base_url, api_key="not-a-key", max_retries=0, timeout=TIMEOUT)
    with pytest.raises(openai.AuthenticationError) as refused:
        stranger.chat.completions.create(model=TINY_MODEL, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401
    client = openai.OpenAI(base_url=gateway.base_url, api_key=BACKGROUND_KEY, max_retries=0, timeout=TIMEOUT)
    with pytest.raises(openai.NotFoundError, match="no-such-model"):  # vLLM's own error, unchanged
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_caption_client_works_through_the_gateway_with_a_background_key(gateway: GatewayThread) -> None:
    """The pipeline's captioner needs only a base URL and a key to go through the gateway."""
    import numpy as np

    from visioncap.caption.client import VlmCaptioner
    from visioncap.caption.encode import encode_jpeg
    from visioncap.config import CaptionConfig, VlmConfig

    vlm = VlmConfig(model=TINY_MODEL, base_url=gateway.base_url, extra_body={"ignore_eos": True})
    captioner = VlmCaptioner(vlm, CaptionConfig(max_tokens=6), gateway.base_url, BACKGROUND_KEY)
    captioner.check_ready()
    before = metric(
        httpx.get(f"{gateway.root_url}/metrics").text,
        "visioncap_gateway_requests_total",
        traffic_class="background",
        endpoint="chat",
        status="200",
    )
    caption = captioner.caption(encode_jpeg(np.full((480, 640, 3), 127, np.uint8), max_tokens=64).jpeg)
    assert caption.completion_tokens == 6
    after = metric(
        httpx.get(f"{gateway.root_url}/metrics").text,
        "visioncap_gateway_requests_total",
        traffic_class="background",
        endpoint="chat",
        status="200",
    )
    assert after == before + 1


def test_an_event_is_described_from_several_frames_in_one_request_counted_alike_by_the_gateway_and_vllm(
    gateway: GatewayThread,
) -> None:
    """Several frames of one event (of different shapes) shrunk to share one image-token budget and sent as images
    of one request (the tiny profile takes up to six a prompt): the gateway counts each image's tokens exactly as
    vLLM's processor makes them, so its admission and pacing see the event's whole cost."""
    import numpy as np

    from visioncap.caption.client import VlmCaptioner
    from visioncap.caption.encode import encode_frames
    from visioncap.config import CaptionConfig, VlmConfig

    vlm = VlmConfig(model=TINY_MODEL, base_url=gateway.base_url, extra_body={"ignore_eos": True})
    captioner = VlmCaptioner(vlm, CaptionConfig(), gateway.base_url, BACKGROUND_KEY)
    rng = np.random.default_rng(45)
    frames = [rng.integers(0, 255, (h, w, 3), np.uint8) for h, w in ((720, 1280), (640, 360), (500, 500))]
    budget = 600
    encoded = encode_frames(frames, budget)
    assert all(image.image_tokens <= budget // 3 for image in encoded)

    def counted() -> float:
        text = httpx.get(f"{gateway.root_url}/metrics").text
        return metric(text, "visioncap_gateway_image_tokens_total", traffic_class="background")

    before = counted()
    one = captioner.describe([encoded[0].jpeg], max_tokens=4)
    three = captioner.describe([image.jpeg for image in encoded], max_tokens=4)
    assert counted() - before == encoded[0].image_tokens + sum(image.image_tokens for image in encoded)
    # vLLM: each further image adds its tokens and its vision start / end markers.
    assert three.prompt_tokens - one.prompt_tokens == sum(image.image_tokens + 2 for image in encoded[1:])
    assert three.completion_tokens == 4


# -- classes and priorities -------------------------------------------------------------------------------------


def test_class_priority_reaches_vllm(vllm_server: VllmServer) -> None:
    """A class priority vLLM refuses (outside int64; the config loader would refuse it too) fails at vLLM."""
    config = config_for(vllm_server.base_url)
    out_of_range = TrafficClassConfig.model_construct(role="interactive", priority=2**63)
    config = config.model_copy(update={"classes": {**config.classes, "interactive": out_of_range}})
    with GatewayThread(config) as gw:
        refused = post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2))
        accepted = post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2))
    assert refused.status_code == 400
    assert "priority" in refused.text
    assert accepted.status_code == 200


def test_each_class_sends_its_own_priority_whatever_the_caller_asks(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    gw = tapped_gateway(
        classes={
            "interactive": {"role": "interactive", "priority": -7},
            "background": {"role": "background", "priority": 42},
        }
    )
    assert post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2, user="i1")).status_code == 200
    assert post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="b1", priority=-100)).status_code == 200
    completion = {"model": TINY_MODEL, "prompt": "x", "max_tokens": 2, "user": "b2"}
    response = httpx.post(f"{gw.base_url}/completions", json=completion, headers=auth(BACKGROUND_KEY), timeout=TIMEOUT)
    assert response.status_code == 200
    by_user = {body.get("user"): body for body in tap.bodies}
    assert by_user["i1"]["priority"] == -7
    assert by_user["b1"]["priority"] == 42  # the caller's -100 is replaced: the key decides
    assert by_user["b2"]["priority"] == 42


# -- background admission ---------------------------------------------------------------------------------------


def test_background_waits_while_the_cap_is_reached_and_proceeds_after(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    gw = tapped_gateway(background={"max_concurrency": 1, "min_concurrency": 1})
    release_first = tap.hold("first")
    first: Future[httpx.Response] = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=3, user="first"))
    tap.wait_for_user("first")  # in flight: the one background slot is taken
    second = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=3, user="second"))
    state = wait_queue(gw, lambda s: s.waiting == 1)
    assert state.in_flight == 1
    assert tap.users_seen() == ["first"]  # the second waits in the gateway, not in vLLM
    assert not second.done()
    # The benchmarks read the same from /healthz (to drain between phases and to plot the caps).
    health = httpx.get(f"{gw.root_url}/healthz", timeout=TIMEOUT)
    assert background_held(health.json()) == 2
    probed = probe_value(f"{gw.root_url}/healthz", health.text)
    assert (probed["in_flight"], probed["waiting"], probed["cap"]) == (1, 1, 1)
    release_first.set()
    assert first.result(TIMEOUT).status_code == 200
    answer = second.result(TIMEOUT)
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 3
    assert tap.users_seen() == ["first", "second"]
    waited = metric(
        httpx.get(f"{gw.root_url}/metrics").text,
        "visioncap_gateway_queue_wait_seconds_count",
        traffic_class="background",
    )
    assert waited == 2


ALERT_KEY = "test-alert-key"


def with_alert_key(config: GatewayConfig, **alert_class: Any) -> GatewayConfig:
    """The config with a key of the alert class (its settings overridden by `alert_class`)."""
    raw = config.model_dump(mode="json")
    raw["keys"].append({"name": "verifier", "sha256": hash_key(ALERT_KEY), "traffic_class": "alert"})
    raw["classes"]["alert"] = {**raw["classes"]["alert"], **alert_class}
    return GatewayConfig.model_validate(raw)


def test_an_alert_goes_ahead_of_waiting_captions_and_reaches_vllm_at_its_own_priority(
    tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """One background slot, taken; a caption waits, then an alert rule's question comes: it goes first, at the
    alert class's priority (between chat's and captions'), and /healthz shows the alert line on its own."""
    config = with_alert_key(config_for(tap.root_url + "/v1", background={"max_concurrency": 1, "min_concurrency": 1}))
    assert config.classes["alert"].priority == 5 and config.classes["alert"].role == "alert"
    with GatewayThread(config) as gw:
        release_first = tap.hold("first")
        first = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="first"))
        tap.wait_for_user("first")
        caption = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="caption"))
        wait_queue(gw, lambda s: s.waiting == 1)
        alert = pool.submit(post_chat, gw, ALERT_KEY, chat_body(max_tokens=2, user="verify", priority=-3))
        state = wait_queue(gw, lambda s: s.waiting == 2)
        assert (state.waiting_urgent, state.in_flight_urgent) == (1, 0)
        health = httpx.get(f"{gw.root_url}/healthz", timeout=TIMEOUT).json()["upstreams"]["vllm"]
        assert health["alert"]["waiting"] == 1 and health["background"]["waiting"] == 2
        waiting = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
        assert metric(waiting, "visioncap_gateway_alert_queue_depth", upstream="vllm") == 1
        release_first.set()
        assert [future.result(TIMEOUT).status_code for future in (first, alert, caption)] == [200, 200, 200]
        assert tap.users_seen() == ["first", "verify", "caption"]
        priorities = {body["user"]: body["priority"] for body in tap.bodies}
        assert priorities == {"first": 10, "verify": 5, "caption": 10}  # the caller's -3 replaced by the class's
        metrics = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
        assert metric(metrics, "visioncap_gateway_queue_wait_seconds_count", traffic_class="alert") == 1
        health = httpx.get(f"{gw.root_url}/healthz", timeout=TIMEOUT).json()["upstreams"]["vllm"]
        assert health["alert"]["started_last_60_s"] == 1


def test_an_alert_waits_its_own_class_deadline_not_backgrounds(tap: Tap, pool: ThreadPoolExecutor) -> None:
    base = config_for(tap.root_url + "/v1", background={"max_concurrency": 1, "min_concurrency": 1, "deadline_s": 600})
    with GatewayThread(with_alert_key(base, deadline_s=0.5)) as gw:
        release_first = tap.hold("first")
        first = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="first"))
        tap.wait_for_user("first")
        caption = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="caption"))
        wait_queue(gw, lambda s: s.waiting == 1)
        late = post_chat(gw, ALERT_KEY, chat_body(max_tokens=2, user="verify"))
        # Refused once its class's half second has passed; the caption, on background's 600 s, still waits.
        assert late.status_code == 408 and late.json()["error"]["type"] == "deadline_exceeded"
        assert not caption.done()
        release_first.set()
        assert first.result(TIMEOUT).status_code == 200 and caption.result(TIMEOUT).status_code == 200
        assert "verify" not in tap.users_seen()


def test_a_watch_rules_question_waits_in_the_gateway_no_longer_than_its_rules_deadline(
    tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """The verifier tells the gateway its rule's deadline (X-Visioncap-Deadline-Ms, less a margin): a question that
    cannot start in time is refused by the gateway (408, never sent to vLLM), not left waiting out the class's 600 s
    after the verifier has given up on it."""
    base = config_for(tap.root_url + "/v1", background={"max_concurrency": 1, "min_concurrency": 1, "deadline_s": 600})
    with GatewayThread(with_alert_key(base, deadline_s=600)) as gw:
        release_first = tap.hold("first")
        first = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="first"))
        tap.wait_for_user("first")
        verifier = Verifier(VlmEndpoint(base_url=gw.base_url, model=TINY_MODEL), "", ALERT_KEY)
        frame = io.BytesIO()
        Image.new("RGB", (64, 48), (90, 90, 160)).save(frame, "JPEG")
        spec = VerifySpec(question="a person leaves a package at the door", deadline_s=4.0)
        try:
            verdict = verifier.ask(spec, "a person at the door", [frame.getvalue()], camera="door")
        finally:
            verifier.close()
            release_first.set()
        assert verdict.match is None and verdict.error is not None
        assert "HTTP 408" in verdict.error and "deadline_exceeded" in verdict.error, verdict.error
        assert gw.call_soon(lambda: gw.gateway.replicas[0].scheduler.state()).waiting == 0
        metrics = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
        assert metric(metrics, "visioncap_gateway_rejections_total", traffic_class="alert") == 1
        assert first.result(TIMEOUT).status_code == 200
    assert tap.users_seen() == ["first"]


def test_interactive_traffic_starts_background_at_the_floor_and_healthy_latency_raises_it(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """The controller's decisions reach the scheduler: the floor holds a second request back, an increase
    (fresh interactive samples under the objectives) lets it through."""
    gw = tapped_gateway(
        background={"max_concurrency": 2, "min_concurrency": 1},
        objectives={"itl_p99_ms": 50},
        # No automatic steps (the test makes them) and interactive stays "active" once seen.
        controller={"interval_s": 3600, "idle_after_s": 3600, "increase_interval_s": 0},
        pacing={"enabled": False},  # the concurrency-limit policy
    )
    assert post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2, user="chat")).status_code == 200
    assert gw.call_soon(gw.gateway.replicas[0].control_step).caps.concurrency == 1
    assert metric(httpx.get(f"{gw.root_url}/metrics").text, "visioncap_gateway_background_concurrency_cap") == 1
    release = tap.hold("first")
    first = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="first"))
    tap.wait_for_user("first")
    second = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="second"))
    wait_queue(gw, lambda s: s.waiting == 1 and s.in_flight == 1)  # max_concurrency is 2, the floor 1
    assert "second" not in tap.users_seen()
    controller = gw.gateway.replicas[0].controller

    def fast_tokens() -> None:  # what the gateway records while chat streams flow well
        now = gw.gateway.clock()
        for _ in range(20):
            controller.observe_itl(now, 0.005)

    gw.call_soon(fast_tokens)
    decision = gw.call_soon(gw.gateway.replicas[0].control_step)
    assert (decision.action, decision.caps.concurrency) == ("increase", 2)
    tap.wait_for_user("second")  # admitted while `first` is still held: the cap is 2 now
    release.set()
    assert first.result(TIMEOUT).status_code == 200
    assert second.result(TIMEOUT).status_code == 200


def test_paced_background_keeps_flowing_while_chat_is_active(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """The pacing policy spreads frames while chat is active instead of stopping them: with chat active the
    whole time, latency objectives missed (so the rate sits at its floor) and no room for a limit policy to give
    (min_concurrency 0 would stop background), every frame is answered, and no two start closer than the
    floor's interval."""
    gw = tapped_gateway(
        background={"max_concurrency": 4, "min_concurrency": 0, "deadline_s": 60},
        # Always missed: the controller would cut the rate, but it is at the floor.
        objectives={"ttft_p99_ms": 1, "itl_p99_ms": 1},
        controller={"interval_s": 0.05, "idle_after_s": 3600},
        pacing={
            "start_per_s": 5,
            "min_per_s": 5,
            "max_per_s": 5,
            "min_fresh_gaps": 1,
            "evidence_z": 0,  # one missed first token is a miss
            "first_token_hold_s": 0,
        },
    )
    stream = {**chat_body(max_tokens=8, user="chat"), "stream": True}
    assert post_chat(gw, INTERACTIVE_KEY, stream).status_code == 200
    decision = gw.call_soon(gw.gateway.replicas[0].control_step)
    assert decision.caps.interactive_active and decision.action == "hold" and "ttft" in decision.reasons
    frames = [pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user=f"f{i}")) for i in range(6)]
    assert all(frame.result(TIMEOUT).status_code == 200 for frame in frames)
    admitted = sorted(gw.call_soon(lambda: list(gw.gateway.replicas[0].scheduler.recent_starts)))
    assert len(admitted) == 6
    assert min(b - a for a, b in itertools.pairwise(admitted)) >= 1 / 5 - 1e-3
    text = httpx.get(f"{gw.root_url}/metrics").text
    assert metric(text, "visioncap_gateway_background_starts_per_second") == 5


def test_the_pacer_learns_from_the_frames_it_starts_and_the_gaps_chat_measures(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """The learnt rate's model hears of every background start the gateway sends upstream while chat is active,
    and of every gap of the chat streams it proxies; /healthz and the gauges show its estimate."""
    gw = tapped_gateway(
        background={"max_concurrency": 4, "deadline_s": 60},
        controller={"interval_s": 0.05, "idle_after_s": 3600},
        pacing={"first_token_hold_s": 0, "model_min_frames": 3, "model_min_gaps": 4},
    )
    assert post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2, user="chat")).status_code == 200  # chat is active
    frames = [pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user=f"f{i}")) for i in range(3)]
    assert all(frame.result(TIMEOUT).status_code == 200 for frame in frames)
    # The tap holds the answer after its first chunk until released: the gateway reads the other tokens later, so
    # it measures their gaps (vLLM alone may finish all of them before the gateway's first read: no gap).
    release = tap.pause_after_first_chunk("stream")
    body = chat_body(max_tokens=16, stream=True, user="stream", return_token_ids=True)
    with httpx.stream(
        "POST", f"{gw.base_url}/chat/completions", json=body, headers=auth(INTERACTIVE_KEY), timeout=TIMEOUT
    ) as response:
        lines = response.iter_lines()
        for line in lines:  # up to the first event with output: the gateway has read it
            if line.startswith("data:") and "[DONE]" not in line:
                break
        release.set()
        rest = list(lines)
    assert "data: [DONE]" in rest
    decision = gw.call_soon(gw.gateway.replicas[0].control_step)
    learnt = decision.learnt
    assert learnt is not None and learnt.frames == 3
    assert learnt.gaps >= 4 and 0 <= learnt.base_share <= 1
    health = httpx.get(f"{gw.root_url}/healthz", headers=auth(INTERACTIVE_KEY), timeout=TIMEOUT).json()
    shown = upstream_states(health)[0]["background"]["learnt"]
    assert shown["frames"] == 3 and shown["gaps"] == learnt.gaps
    text = httpx.get(f"{gw.root_url}/metrics").text
    assert metric(text, "visioncap_gateway_learnt_gap_share", upstream="vllm", part="base") == pytest.approx(
        learnt.base_share
    )


def test_a_chat_waiting_for_its_first_token_holds_background_starts_back(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """Chat-aware admission: a frame arriving while a chat's prefill is pending waits for the chat's first token
    (so the two never share an engine step), then starts at once."""
    gw = tapped_gateway(
        controller={"interval_s": 3600, "idle_after_s": 3600},
        pacing={"first_token_hold_s": 3600},
    )
    release_chat = tap.hold("chat")
    chat = pool.submit(post_chat, gw, INTERACTIVE_KEY, {**chat_body(max_tokens=4, user="chat"), "stream": True})
    tap.wait_for_user("chat")  # the chat is at vLLM, its first token held back by the tap
    frame = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="frame"))
    state = wait_queue(gw, lambda s: s.waiting == 1)
    assert state.in_flight == 0 and "frame" not in tap.users_seen()
    release_chat.set()
    assert chat.result(TIMEOUT).status_code == 200
    assert frame.result(TIMEOUT).status_code == 200


def test_interactive_arrival_preempts_fresh_background_which_is_redone_later(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """vLLM cannot stop an admitted image prefill for a chat; the gateway can: it cancels the background request
    at vLLM, queues it again at the head, and sends it once the caps allow. The caller sees one answer."""
    gw = tapped_gateway(
        background={"max_concurrency": 2, "min_concurrency": 0, "preempt_window_s": 3600},
        controller={"interval_s": 0.05, "idle_after_s": 0.3},
        pacing={"enabled": False},  # the concurrency-limit policy: the chat cuts the cap to 0
    )
    hold = tap.hold("frame")
    background = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=3, user="frame"))
    tap.wait_for_user("frame")  # idle: admitted at full concurrency, now "inside vLLM" (held by the tap)
    chat = post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2, user="chat"))
    assert chat.status_code == 200
    # The chat's arrival cut the cap to the floor (0): the frame was cancelled and re-queued, then sent again
    # once no chat had been seen for idle_after_s.
    with tap._changed:
        assert tap._changed.wait_for(lambda: tap.users_seen().count("frame") == 2, TIMEOUT)
    hold.set()
    answer = background.result(TIMEOUT)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    text = httpx.get(f"{gw.root_url}/metrics").text
    assert metric(text, "visioncap_gateway_preemptions_total") == 1
    assert metric(text, "visioncap_gateway_requests_total", traffic_class="background") == 1
    assert gw.call_soon(gw.gateway.replicas[0].scheduler.state).in_flight == 0


def test_under_pacing_a_chat_after_idle_preempts_the_frame_admitted_just_before(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    """The default policy (pacing) keeps the concurrency cap, so a chat after idle used to meet every frame
    admitted unpaced just before it; that burst is preempted now and sent again at the pacer's rate."""
    gw = tapped_gateway(
        background={"preempt_window_s": 3600},
        controller={"interval_s": 3600, "idle_after_s": 3600},
    )
    hold = tap.hold("frame")
    background = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=3, user="frame"))
    tap.wait_for_user("frame")  # idle: admitted unpaced, now "inside vLLM" (held by the tap)
    chat = post_chat(gw, INTERACTIVE_KEY, {**chat_body(max_tokens=2, user="chat"), "stream": True})
    assert chat.status_code == 200
    with tap._changed:  # cancelled at vLLM, queued again, sent again once the chat had its first token
        assert tap._changed.wait_for(lambda: tap.users_seen().count("frame") == 2, TIMEOUT)
    hold.set()
    answer = background.result(TIMEOUT)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
    users = tap.users_seen()
    assert users.index("chat") < len(users) - 1 - users[::-1].index("frame"), "the frame came back after the chat"
    assert metric(httpx.get(f"{gw.root_url}/metrics").text, "visioncap_gateway_preemptions_total") == 1


def test_background_images_are_downscaled_while_chat_is_active(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    gw = tapped_gateway(
        background={"active_max_image_tokens": 60},
        controller={"interval_s": 3600, "idle_after_s": 3600},
    )
    frame = jpeg_data_uri(640, 480)  # 391 tokens at 28 px per token
    idle = post_chat(gw, BACKGROUND_KEY, image_chat_body(frame, user="idle"))
    assert post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2)).status_code == 200
    active = post_chat(gw, BACKGROUND_KEY, image_chat_body(frame, user="active"))
    assert idle.status_code == 200 and active.status_code == 200
    sent = {body.get("user"): body for body in tap.bodies}
    idle_url = sent["idle"]["messages"][0]["content"][1]["image_url"]["url"]
    active_url = sent["active"]["messages"][0]["content"][1]["image_url"]["url"]
    assert idle_url == frame  # no chat yet: sent as it came
    small = data_uri_size(active_url)
    assert small is not None and small[0] / small[1] == pytest.approx(640 / 480, rel=0.05)
    assert image_tokens(*small, gw.gateway.config.images) <= 60
    # vLLM saw the smaller image: the prompt shrank by the image tokens saved.
    saved = idle.json()["usage"]["prompt_tokens"] - active.json()["usage"]["prompt_tokens"]
    assert saved >= 391 - 60
    assert metric(httpx.get(f"{gw.root_url}/metrics").text, "visioncap_gateway_downscaled_images_total") == 1


def test_full_queue_answers_429_with_retry_after(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    gw = tapped_gateway(background={"max_concurrency": 1, "queue_size": 1})
    release = tap.hold("held")
    held = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="held"))
    tap.wait_for_user("held")
    queued = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="queued"))
    wait_queue(gw, lambda s: s.waiting == 1)
    refused = post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="refused"))
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "queue_full"
    assert int(refused.headers["retry-after"]) >= 1
    release.set()
    assert held.result(TIMEOUT).status_code == 200
    assert queued.result(TIMEOUT).status_code == 200
    assert "refused" not in tap.users_seen()
    text = httpx.get(f"{gw.root_url}/metrics").text
    assert metric(text, "visioncap_gateway_rejections_total", traffic_class="background", reason="queue_full") == 1


def test_deadline_answers_408_deadline_exceeded(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    gw = tapped_gateway(background={"max_concurrency": 1, "deadline_s": 60})
    release = tap.hold("held")
    held = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="held"))
    tap.wait_for_user("held")
    # The held request stays in flight until this answer is in, so the deadline must pass.
    late = post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="late"), **{"X-Visioncap-Deadline-Ms": "100"})
    assert late.status_code == 408
    assert late.json()["error"]["type"] == "deadline_exceeded"
    assert gw.call_soon(gw.gateway.replicas[0].scheduler.state).waiting == 0
    release.set()
    assert held.result(TIMEOUT).status_code == 200
    assert "late" not in tap.users_seen()
    # The caption client turns it into a skip (recorded by the outbox), not an error or a retry.
    client = openai.OpenAI(base_url=gw.base_url, api_key=BACKGROUND_KEY, max_retries=0, timeout=TIMEOUT)
    release2 = tap.hold("held2")
    held2 = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="held2"))
    tap.wait_for_user("held2")
    with pytest.raises(openai.APIStatusError) as skipped:
        client.chat.completions.create(
            model=TINY_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=2,
            extra_headers={"X-Visioncap-Deadline-Ms": "50"},
        )
    assert skipped.value.status_code == 408
    release2.set()
    assert held2.result(TIMEOUT).status_code == 200


def test_a_caller_that_leaves_the_queue_is_never_forwarded(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap, pool: ThreadPoolExecutor
) -> None:
    gw = tapped_gateway(background={"max_concurrency": 1})
    release = tap.hold("held")
    held = pool.submit(post_chat, gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="held"))
    tap.wait_for_user("held")
    body = json.dumps(chat_body(max_tokens=2, user="gone")).encode()
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BACKGROUND_KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", gw.port)) as raw:
        raw.sendall(request + body)
        wait_queue(gw, lambda s: s.waiting == 1)
    wait_queue(gw, lambda s: s.waiting == 0)  # the socket closed while waiting: its place is given up
    release.set()
    assert held.result(TIMEOUT).status_code == 200
    assert post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="after")).status_code == 200
    assert tap.users_seen() == ["held", "after"]


def test_background_stream_slot_is_given_back_when_the_caller_disconnects(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    # The tap holds vLLM's answer after its first chunk, so the stream is surely still running when the caller
    # leaves. (Timing it against a long answer failed twice: with this process, which runs the gateway, starved
    # of CPU by another vLLM on the machine, the whole answer ended in kernel buffers before the test read on.)
    gw = tapped_gateway(background={"max_concurrency": 1})
    release = tap.pause_after_first_chunk("leaves")
    body = chat_body(max_tokens=64, stream=True, user="leaves")
    url = f"{gw.base_url}/chat/completions"
    with httpx.stream("POST", url, json=body, headers=auth(BACKGROUND_KEY), timeout=TIMEOUT) as response:
        assert response.status_code == 200
        # Kept in a name: a discarded line iterator is closed at once, and closing it closes the connection.
        lines = response.iter_lines()
        next(lines)  # one chunk in: the request holds the only slot
        assert gw.call_soon(gw.gateway.replicas[0].scheduler.state).in_flight == 1
    wait_queue(gw, lambda s: s.in_flight == 0)  # closed mid-stream: slot released
    tap.wait_for_cut("leaves")  # and the gateway let go of the upstream answer, so vLLM stops making it
    release.set()
    text = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
    ended = "visioncap_gateway_responses_ended_total"
    assert metric(text, ended, traffic_class="background", how="caller_gone") == 1
    assert metric(text, ended, traffic_class="background", how="completed") == 0
    assert post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="after")).status_code == 200
    wait_queue(gw, lambda s: s.in_flight == 0)  # the end is counted before the slot is given back
    text = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
    assert metric(text, ended, traffic_class="background", how="completed") == 1


def test_a_failing_stream_observer_never_cuts_the_answer(
    vllm_server: VllmServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Measuring is secondary: an exception in the ITL observer stops measuring, the caller gets every byte.

    The fault is injected (a bug in our own parser cannot be produced by a correct vLLM on purpose).
    """
    body = {**chat_body(max_tokens=24, stream=True), "return_token_ids": True}
    with httpx.stream("POST", f"{vllm_server.base_url}/chat/completions", json=body, timeout=TIMEOUT) as response:
        direct = stream_summary(sse_events(response))

    def broken(self: StreamObserver, data: bytes) -> None:
        raise ValueError("parser bug")

    monkeypatch.setattr(StreamObserver, "feed", broken)
    with GatewayThread(config_for(vllm_server.base_url)) as gw:
        url = f"{gw.base_url}/chat/completions"
        with httpx.stream("POST", url, json=body, headers=auth(BACKGROUND_KEY), timeout=TIMEOUT) as response:
            assert response.status_code == 200
            events = sse_events(response)
        wait_queue(gw, lambda s: s.in_flight == 0)  # the end is counted before the slot is given back
        text = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
    assert events[-1] == "[DONE]"
    assert stream_summary(events) == direct  # every token reached the caller
    ended = "visioncap_gateway_responses_ended_total"
    assert metric(text, ended, traffic_class="background", how="completed") == 1
    assert metric(text, "visioncap_gateway_upstream_errors_total", traffic_class="background") == 0
    assert "stream observer failed" in caplog.text


def test_a_non_streaming_caller_that_leaves_frees_its_slot_before_vllm_answers(
    tapped_gateway: Callable[..., GatewayThread], tap: Tap
) -> None:
    gw = tapped_gateway(background={"max_concurrency": 1})
    tap.hold("gone")
    with pytest.raises(httpx.ReadTimeout):  # the caller gives up and closes its connection
        httpx.post(
            f"{gw.base_url}/chat/completions",
            json=chat_body(max_tokens=2, user="gone"),
            headers=auth(BACKGROUND_KEY),
            timeout=httpx.Timeout(TIMEOUT, read=1.0),
        )
    # Still held in the tap (vLLM's side), yet the gateway has given the slot back and serves the next one.
    wait_queue(gw, lambda s: s.in_flight == 0)
    assert post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=2, user="next")).status_code == 200
    text = httpx.get(f"{gw.root_url}/metrics").text
    assert metric(text, "visioncap_gateway_requests_total", traffic_class="background", status="499") == 1


def test_vllm_unreachable_or_breaking_mid_stream(pool: ThreadPoolExecutor) -> None:
    """A dead upstream gives an OpenAI-shaped 502; a stream cut by vLLM ends with an error event, not [DONE]."""
    with socket.socket() as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.listen(8)
        base = f"http://127.0.0.1:{upstream.getsockname()[1]}/v1"

        def one_chunk_then_hang_up() -> None:
            connection, _ = upstream.accept()
            with connection:
                connection.recv(65536)
                event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
                head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                connection.sendall(head + b"%x\r\n%s\r\n" % (len(event), event))

        # No health checks: the scripted upstream answers one connection, the chat's.
        with GatewayThread(config_for(base, upstream={"metrics_poll_s": 0, "health_interval_s": 0})) as gw:
            served = pool.submit(one_chunk_then_hang_up)
            with httpx.stream(
                "POST",
                f"{gw.base_url}/chat/completions",
                json=chat_body(stream=True),
                headers=auth(INTERACTIVE_KEY),
                timeout=TIMEOUT,
            ) as response:
                assert response.status_code == 200
                events = sse_events(response)
            # An error event last (which OpenAI's clients raise), and no [DONE]. (Whether vLLM's part came before it
            # is aiohttp's: a connection closed in the same read drops the data buffered with it.)
            assert events[-1]["error"]["type"] == "upstream_unavailable" and "[DONE]" not in events
            served.result(TIMEOUT)
            text = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
            assert metric(text, "visioncap_gateway_upstream_errors_total", traffic_class="interactive") == 1
            assert gw.call_soon(lambda: gw.gateway.replicas[0].controller.interactive_in_flight) == 0
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with GatewayThread(config_for(dead, upstream={"metrics_poll_s": 0})) as gw:
        answer = post_chat(gw, BACKGROUND_KEY, chat_body())
        assert answer.status_code == 502
        assert answer.json()["error"]["type"] == "upstream_unavailable"
        text = httpx.get(f"{gw.root_url}/metrics", timeout=TIMEOUT).text
        assert metric(text, "visioncap_gateway_requests_total", traffic_class="background", status="502") == 1
        assert metric(text, "visioncap_gateway_upstream_errors_total", traffic_class="background") == 1
        assert gw.call_soon(gw.gateway.replicas[0].scheduler.state).in_flight == 0  # the slot came back


# -- media -------------------------------------------------------------------------------------------------------


def test_remote_image_url_is_refused_and_a_data_uri_passes(gateway: GatewayThread) -> None:
    for url in ("http://example.com/frame.jpg", "https://169.254.169.254/latest", "file:///etc/passwd"):
        refused = post_chat(gateway, INTERACTIVE_KEY, image_chat_body(url))
        assert refused.status_code == 400, url
        assert refused.json()["error"]["type"] == "media_url_not_allowed"
    before = metric(
        httpx.get(f"{gateway.root_url}/metrics").text,
        "visioncap_gateway_image_tokens_total",
        traffic_class="background",
    )
    with_image = post_chat(gateway, BACKGROUND_KEY, image_chat_body(jpeg_data_uri(640, 480)))
    assert with_image.status_code == 200
    after = metric(
        httpx.get(f"{gateway.root_url}/metrics").text,
        "visioncap_gateway_image_tokens_total",
        traffic_class="background",
    )
    # The gateway's estimate is exactly what vLLM's processor made of it (plus the vision start/end tokens).
    text_only = post_chat(
        gateway,
        BACKGROUND_KEY,
        {
            **chat_body(max_tokens=4),
            "messages": [{"role": "user", "content": [{"type": "text", "text": "who is there"}]}],
        },
    )
    vllm_image_tokens = with_image.json()["usage"]["prompt_tokens"] - text_only.json()["usage"]["prompt_tokens"] - 2
    assert after - before == vllm_image_tokens == 391


def test_allow_listed_host_passes(tapped_gateway: Callable[..., GatewayThread], tap: Tap) -> None:
    gw = tapped_gateway(images={"allowed_hosts": ["127.0.0.1"]})
    url = f"{tap.root_url}/frame.jpg"
    answer = post_chat(gw, INTERACTIVE_KEY, image_chat_body(url, user="fetch"))
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] > 391  # vLLM fetched the 640x480 frame from the allowed host
    assert post_chat(gw, INTERACTIVE_KEY, image_chat_body("http://localhost:1/x.jpg")).status_code == 400


# -- safety -------------------------------------------------------------------------------------------------------


def test_unknown_and_missing_keys_are_refused(gateway: GatewayThread) -> None:
    for headers in ({}, auth("wrong"), {"Authorization": "Basic abc"}):
        for method, path in (("POST", "/chat/completions"), ("POST", "/completions"), ("GET", "/models")):
            kwargs: dict[str, Any] = {"json": chat_body()} if method == "POST" else {}
            response = httpx.request(method, gateway.base_url + path, headers=headers, timeout=TIMEOUT, **kwargs)
            assert response.status_code == 401, (headers, path)
            assert response.json()["error"]["type"] == "authentication_error"
    assert httpx.get(f"{gateway.base_url}/models", headers={"X-Api-Key": INTERACTIVE_KEY}).status_code == 200


def test_bad_bodies_get_openai_shaped_errors(gateway: GatewayThread) -> None:
    url = f"{gateway.base_url}/chat/completions"
    headers = {**auth(INTERACTIVE_KEY), "content-type": "application/json"}
    not_json = httpx.post(url, content=b"{not json", headers=headers, timeout=TIMEOUT)
    assert not_json.status_code == 400
    assert set(not_json.json()["error"]) == {"message", "type", "param", "code"}
    for body in (
        [1, 2],
        {"model": TINY_MODEL},
        {"messages": [], "model": TINY_MODEL},
        {**chat_body(), "stream": "yes"},
    ):
        wrong = httpx.post(url, json=body, headers=headers, timeout=TIMEOUT)
        assert wrong.status_code == 422, body
        assert wrong.json()["error"]["code"] == 422
    assert httpx.post(f"{gateway.base_url}/nothing", headers=headers).json()["error"]["code"] == 404


def test_body_size_limit(vllm_server: VllmServer) -> None:
    with GatewayThread(config_for(vllm_server.base_url, limits={"max_body_bytes": 4096})) as gw:
        big = post_chat(gw, INTERACTIVE_KEY, chat_body(text="x" * 5000))
        assert big.status_code == 413
        assert big.json()["error"]["type"] == "request_too_large"
        assert post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=2)).status_code == 200


def test_per_key_rate_limit(vllm_server: VllmServer) -> None:
    limit = {"rate_limit": {"requests_per_s": 0.001, "burst": 2}}  # two at once, then one per 1000 s
    with GatewayThread(config_for(vllm_server.base_url, interactive_key=limit)) as gw:
        answers = [post_chat(gw, INTERACTIVE_KEY, chat_body(max_tokens=1)) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 429]
        assert answers[2].json()["error"]["type"] == "rate_limit_exceeded"
        assert int(answers[2].headers["retry-after"]) >= 1
        assert post_chat(gw, BACKGROUND_KEY, chat_body(max_tokens=1)).status_code == 200  # other keys unaffected


# -- metrics ----------------------------------------------------------------------------------------------------------


def test_gateway_metrics(tapped_gateway: Callable[..., GatewayThread], tap: Tap) -> None:
    gateway = tapped_gateway()

    def scrape() -> str:
        return httpx.get(f"{gateway.root_url}/metrics", timeout=TIMEOUT).text

    before = scrape()
    # The tap holds the answer after its first chunk until the caller has it: the gateway surely reads the rest
    # in later network reads, so there are gaps to count. (Unpaced, a loaded machine once let vLLM finish all
    # 256 tokens before the gateway's first read: one arrival, no gaps, by the definition.)
    release = tap.pause_after_first_chunk("metrics")
    with httpx.stream(
        "POST",
        f"{gateway.base_url}/chat/completions",
        json=chat_body(max_tokens=16, stream=True, user="metrics"),
        headers=auth(INTERACTIVE_KEY),
        timeout=TIMEOUT,
    ) as response:
        lines = response.iter_lines()
        events = []
        for line in lines:  # up to the first output token: the gateway has read it
            if line.startswith("data:") and "[DONE]" not in line:
                events.append(json.loads(line[5:]))
                if events[-1]["choices"][0]["delta"].get("content"):
                    break
        release.set()
        events += [json.loads(line[5:]) for line in lines if line.startswith("data:") and "[DONE]" not in line]
    chunks = [e for e in events if e.get("choices") and e["choices"][0]["delta"].get("content")]
    post_chat(gateway, "wrong", chat_body())
    after = scrape()

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert grew("visioncap_gateway_ttft_seconds_count", traffic_class="interactive") == 1
    # One gap per token after those of the gateway's first read (here one token per chunk: no token ids); chunks
    # the gateway read together share their gap (visioncap.gateway.sse).
    assert 1 <= grew("visioncap_gateway_inter_token_seconds_count", traffic_class="interactive") <= len(chunks) - 1
    assert grew("visioncap_gateway_requests_total", traffic_class="interactive", status="200") == 1
    assert grew("visioncap_gateway_rejections_total", traffic_class="unknown", reason="unauthorized") == 1
    for gauge in (
        "visioncap_gateway_background_concurrency_cap",
        "visioncap_gateway_background_image_tokens_cap",
        "visioncap_gateway_background_starts_per_second",
        "visioncap_gateway_learnt_starts_per_second",
        "visioncap_gateway_image_tokens_in_flight",
        "visioncap_gateway_queue_depth",
        "visioncap_gateway_alert_queue_depth",
    ):
        assert f'\n{gauge}{{upstream="vllm"}} ' in after, gauge
    assert metric(after, "visioncap_gateway_background_concurrency_cap", upstream="vllm") >= 1
    assert grew("visioncap_gateway_upstream_requests_total", upstream="vllm", traffic_class="interactive") == 1


def test_pipeline_captions_go_through_the_gateway_by_configuration_alone(
    gateway: GatewayThread, demo_video: tuple[Path, object], tmp_path: Path
) -> None:
    from helpers import pipeline_dict, run_cli, write_pipeline

    from visioncap.store import CaptionStore, create_db_engine

    def background_ok() -> float:
        text = httpx.get(f"{gateway.root_url}/metrics").text
        return metric(
            text, "visioncap_gateway_requests_total", traffic_class="background", endpoint="chat", status="200"
        )

    before = background_ok()
    database = f"sqlite:///{tmp_path / 'c.db'}"
    result = run_cli(
        "run",
        str(write_pipeline(tmp_path, pipeline_dict(demo_video[0]))),
        "--progress",
        "none",
        env={
            "VISIONCAP_DATABASE_URL": database,
            "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
            "VISIONCAP_VLM_BASE_URL": gateway.base_url,
            "VISIONCAP_VLM_API_KEY": BACKGROUND_KEY,
        },
    )
    assert result.returncode == 0, result.stderr[-3000:]
    captioned = CaptionStore(create_db_engine(database)).count(status="captioned")
    assert captioned >= 2
    assert background_ok() - before == captioned


def test_responses_embeddings_and_tokenizer_pass_through_under_the_key_rules(
    gateway: GatewayThread, vllm_server: VllmServer
) -> None:
    """The Responses API (agent SDKs use it), /v1/embeddings and vLLM's /tokenize and /detokenize, as vLLM answers."""
    headers = auth(INTERACTIVE_KEY)
    body = {"model": TINY_MODEL, "input": "describe the scene", "max_output_tokens": 8, "temperature": 0}
    direct = httpx.post(f"{vllm_server.base_url}/responses", json=body, timeout=TIMEOUT)
    through = httpx.post(f"{gateway.base_url}/responses", json=body, headers=headers, timeout=TIMEOUT)
    assert direct.status_code == through.status_code == 200

    def contents(answer: httpx.Response) -> list[Any]:
        return [item.get("content") for item in answer.json()["output"]]  # item ids are fresh per request

    assert contents(through) == contents(direct)  # same text, item for item

    events: list[dict[str, Any]] = []
    with httpx.stream(
        "POST", f"{gateway.base_url}/responses", json={**body, "stream": True}, headers=headers, timeout=TIMEOUT
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line[5:]))
    deltas = "".join(e["delta"] for e in events if e.get("type") == "response.output_text.delta")
    assert events[-1]["type"] == "response.completed"
    text = [c["text"] for item in direct.json()["output"] for c in item.get("content") or [] if "text" in c]
    assert deltas == "".join(text)

    tokens = httpx.post(
        f"{gateway.root_url}/tokenize", json={"model": TINY_MODEL, "prompt": "a person at the door"}, headers=headers
    )
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    words = httpx.post(
        f"{gateway.root_url}/detokenize", json={"model": TINY_MODEL, "tokens": tokens.json()["tokens"]}, headers=headers
    )
    assert words.status_code == 200 and words.json()["prompt"] == "a person at the door"
    assert httpx.post(f"{gateway.root_url}/tokenize", json={"prompt": "x"}).status_code == 401

    # A generative model has no embeddings: vLLM's own answer comes back unchanged.
    embed = {"model": TINY_MODEL, "input": "a person"}
    direct = httpx.post(f"{vllm_server.base_url}/embeddings", json=embed, timeout=TIMEOUT)
    through = httpx.post(f"{gateway.base_url}/embeddings", json=embed, headers=headers, timeout=TIMEOUT)
    assert through.status_code == direct.status_code
    assert httpx.post(f"{gateway.base_url}/responses", json=body).status_code == 401
