"""The gateway's parts that need no server: its config file, image checks and estimates, stream timing, keys."""

from __future__ import annotations

import asyncio
import base64
import io
import math
import random
from pathlib import Path

import pytest
from helpers import REPO
from PIL import Image

from visioncap.config.gateway import GatewayConfig, ImagesConfig, RateLimitConfig, load_gateway_config
from visioncap.config.keys import generate_key, hash_key
from visioncap.errors import ConfigError
from visioncap.gateway.admission import SlidingWindow
from visioncap.gateway.auth import KeyRing, TokenBucket
from visioncap.gateway.images import MediaCost, MediaRefusedError, data_uri_size, image_tokens, inspect_messages
from visioncap.gateway.proxy import UpstreamBroken
from visioncap.gateway.replicas import ReplicaLoad, predicted_ttft_s, rank_for_chat
from visioncap.gateway.sse import StreamObserver
from visioncap.gateway.upstream_metrics import UpstreamPoller, VllmLoad, parse_vllm_load

# -- config file --------------------------------------------------------------------------------------------

VALID = f"""
upstreams: [{{name: a, base_url: "http://127.0.0.1:8000/v1"}}]
keys:
  - {{name: chat, sha256: "{hash_key("k1")}", traffic_class: interactive}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_gateway_file_is_valid() -> None:
    config = load_gateway_config(REPO / "pipelines" / "gateway.example.yaml")
    assert {name: c.role for name, c in config.classes.items()} == {
        "interactive": "interactive",
        "alert": "alert",
        "background": "background",
    }
    assert config.classes["alert"].priority == 5 and config.classes["alert"].deadline_s == 20
    ring = KeyRing(config)
    assert ring.identify({"authorization": "Bearer demo-chat-key"}).class_name == "interactive"  # type: ignore[union-attr]
    assert ring.identify({"authorization": "Bearer demo-captions-key"}).class_name == "background"  # type: ignore[union-attr]


def test_defaults_give_interactive_alert_and_background_classes(tmp_path: Path) -> None:
    config = load_gateway_config(write(tmp_path, VALID))
    priorities = [config.classes[name].priority for name in ("interactive", "alert", "background")]
    assert priorities == sorted(priorities) and len(set(priorities)) == 3  # alerts between chat and captions
    assert config.upstreams[0].resolved_metrics_url() == "http://127.0.0.1:8000/metrics"
    assert config.images.token_size == 28


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (VALID + "surprise: 1\n", "surprise: Extra inputs are not permitted"),
        (VALID.replace("interactive}", "vip}"), "keys.0.traffic_class: 'vip' is not a class"),
        (VALID.replace(hash_key("k1"), "abc"), "keys.0.sha256: String should match pattern"),
        (VALID + "background: {min_concurrency: 5, max_concurrency: 2}\n", "background: min_concurrency (5) is above"),
        (VALID + "classes: {x: {role: interactive, priority: 99999999999999999999}}\n", "classes.x.priority"),
        (VALID.replace("http://", "ftp://"), "upstreams.0.base_url: String should match pattern"),
        (
            VALID.replace("}]", '}, {name: a, base_url: "http://h:8000/v1"}]'),
            "upstreams.1.name: 'a' is used by more than one upstream",
        ),
        (VALID.replace("interactive}", "interactive, upstream: b}"), "keys.0.upstream: 'b' is not an upstream"),
        (VALID.replace("interactive}", "interactive, upstream: a}"), "keys.0.upstream: only background and alert keys"),
        (VALID.replace("upstreams: [", "upstreams: [] #"), "upstreams: List should have at least 1 item"),
        ("keys: [\n", "invalid YAML at line"),
        ("- 1\n", "must be a mapping of fields"),
    ],
)
def test_invalid_files_give_one_line_naming_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        load_gateway_config(path)
    assert str(error.value).startswith(f"{path}: ")
    assert message in str(error.value)
    assert "\n" not in str(error.value)
    assert error.value.exit_code == 2


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    twice = VALID + f'  - {{name: other, sha256: "{hash_key("k1")}", traffic_class: background}}\n'
    with pytest.raises(ConfigError, match="the same key is configured twice"):
        load_gateway_config(write(tmp_path, twice))


def test_every_config_field_is_described() -> None:
    def walk(model: type) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():  # type: ignore[attr-defined]
            if not field.description:
                missing.append(f"{model.__name__}.{name}")
            annotation = field.annotation
            for candidate in (annotation, *getattr(annotation, "__args__", ())):
                if isinstance(candidate, type) and hasattr(candidate, "model_fields"):
                    missing += walk(candidate)
        return missing

    assert walk(GatewayConfig) == []


# -- keys and rate limits -----------------------------------------------------------------------------------


def test_keys_are_matched_by_hash_only() -> None:
    key, digest = generate_key("vc-")
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "a", "base_url": "http://h/v1"}],
            "keys": [{"name": "a", "sha256": digest, "traffic_class": "background"}],
        }
    )
    ring = KeyRing(config)
    assert key not in config.model_dump_json()
    assert ring.identify({"authorization": f"Bearer {key}"}) is not None
    assert ring.identify({"x-api-key": key}) is not None
    assert ring.identify({"authorization": f"Bearer {key}x"}) is None
    assert ring.identify({"authorization": f"Basic {key}"}) is None
    assert ring.identify({}) is None


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(RateLimitConfig(requests_per_s=2, burst=3))
    assert [bucket.take(0.0) for _ in range(3)] == [None, None, None]
    assert bucket.take(0.0) == pytest.approx(0.5)  # next token in 1 / 2 s
    assert bucket.take(0.5) is None
    assert bucket.take(0.5) is not None
    assert [bucket.take(10.0) for _ in range(4)][:3] == [None, None, None]  # refilled to the burst, not beyond


# -- images ---------------------------------------------------------------------------------------------------


def data_uri(width: int, height: int, fmt: str = "JPEG", exif_bytes: int = 0) -> str:
    buffer = io.BytesIO()
    image = Image.new("RGB", (width, height), (10, 200, 30))
    if exif_bytes:
        exif = Image.Exif()
        exif[0x010E] = "x" * exif_bytes  # ImageDescription: pushes the size marker deep into the file
        image.save(buffer, format=fmt, exif=exif)
    else:
        image.save(buffer, format=fmt)
    mime = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    ("size", "tokens"),
    # Expected values: transformers' Qwen2-VL smart_resize (min 4, max 1280 tokens of 28x28 pixels).
    [
        ((640, 480), 391),
        ((1280, 720), 1196),
        ((28, 28), 4),
        ((10, 10), 4),
        ((4000, 3000), 1230),
        ((1920, 1080), 1222),
        ((333, 777), 336),
    ],
)
def test_image_tokens_follow_qwen2vl_resizing(size: tuple[int, int], tokens: int) -> None:
    config = ImagesConfig(max_tokens_per_image=1280)
    assert image_tokens(*size, config) == tokens


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP"])
def test_size_is_read_from_the_header(fmt: str) -> None:
    assert data_uri_size(data_uri(321, 123, fmt)) == (321, 123)


def test_size_behind_a_large_exif_block_is_still_found() -> None:
    assert data_uri_size(data_uri(200, 100, exif_bytes=60_000)) == (200, 100)


def test_unreadable_data_uri_counts_as_the_largest_image() -> None:
    config = ImagesConfig(max_tokens_per_image=1280)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}]}]
    assert inspect_messages(messages, config) == MediaCost(1280, 1)


def test_messages_sum_image_tokens_and_ignore_text() -> None:
    config = ImagesConfig(max_tokens_per_image=1280)
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "two frames: http://example.com is just text"},
                {"type": "image_url", "image_url": {"url": data_uri(640, 480)}},
                {"type": "image_url", "image_url": data_uri(28, 28)},
            ],
        },
    ]
    assert inspect_messages(messages, config) == MediaCost(391 + 4, 2)  # two images; the text counts for nothing


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "http://10.0.0.1/admin"}},
        {"type": "image_url", "image_url": "https://example.com/a.jpg"},
        {"type": "input_image", "image_url": "file:///etc/passwd"},
        {"type": "video_url", "video_url": {"url": "http://example.com/v.mp4"}},
        {"type": "audio_url", "audio_url": {"url": "ftp://example.com/a.wav"}},
    ],
)
def test_media_urls_other_than_data_uris_are_refused(part: dict[str, object]) -> None:
    with pytest.raises(MediaRefusedError):
        inspect_messages([{"role": "user", "content": [part]}], ImagesConfig())


def test_allow_listed_host_passes_with_a_worst_case_estimate() -> None:
    config = ImagesConfig(allowed_hosts=["Frames.Example.com"], max_tokens_per_image=1280)
    ok = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://frames.example.com/1.jpg"}}]}
    ]
    assert inspect_messages(ok, config) == MediaCost(1280, 1)
    other = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/1.jpg"}}]}]
    with pytest.raises(MediaRefusedError, match="not allowed"):
        inspect_messages(other, config)


# -- stream timing ----------------------------------------------------------------------------------------------


def test_stream_observer_times_output_chunks_only() -> None:
    clock = iter([1.0, 1.5, 1.6, 1.8, 2.0, 2.1])
    firsts: list[float] = []
    gaps: list[float] = []
    observer = StreamObserver(0.9, lambda: next(clock), lambda _t, s: firsts.append(s), lambda _t, s: gaps.append(s))
    role = b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    token = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
    observer.feed(role)  # t=1.0: no output yet
    observer.feed(token[:20])  # an event split across reads is only seen when complete
    observer.feed(token[20:])  # t=1.5: first token
    observer.feed(b": keep-alive\n\n")  # t=1.6: comment
    observer.feed(token + token)  # t=1.8: two events in one read, one time stamp
    observer.feed(b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\ndata: [DONE]\n\n')  # t=2.0
    assert firsts == [pytest.approx(0.6)]
    assert gaps == [pytest.approx(0.15), pytest.approx(0.15)]  # two tokens in one read share its gap
    assert observer.chunks == 3
    assert observer.error is None


@pytest.mark.parametrize(
    ("chunk", "output"),
    [
        (b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}', False),
        (b'{"choices":[{"index":0,"delta":{"content":"\\"quoted\\""},"finish_reason":null}]}', True),
        (b'{"choices":[{"index":0,"delta":{"content":null,"reasoning":"hmm"}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"reasoning_content":"","content":""}}]}', False),
        (b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1"}]}}]}', True),
        (b'{"choices":[{"index":0,"delta":{"tool_calls":[]}}]}', False),
        (b'{"choices":[{"index":0,"text":" a","finish_reason":null}]}', True),
        (b'{"choices":[{"index":0,"text":"","finish_reason":"length"}]}', False),
        (b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}', False),
        (b'{"choices": [{"delta": {"content": "spaced"}}]}', True),
    ],
)
def test_output_chunks_are_recognised_without_parsing(chunk: bytes, output: bool) -> None:
    seen: list[float] = []
    observer = StreamObserver(0.0, lambda: 1.0, lambda _t, s: seen.append(s), lambda _t, s: seen.append(s))
    observer.feed(b"data: " + chunk + b"\n\n")
    assert (observer.chunks == 1) is output


def test_stream_observer_reads_completions_and_errors() -> None:
    times = iter([1.0, 2.0])
    seen: list[float] = []
    observer = StreamObserver(0.0, lambda: next(times), lambda _t, s: seen.append(s), lambda _t, s: seen.append(s))
    observer.feed(b'data: {"choices":[{"text":"a"}]}\r\n\r\n')
    observer.feed(b'data: {"error":{"message":"boom","type":"InternalServerError","code":500}}\n\n')
    assert seen == [1.0]
    assert observer.error == "boom"


# -- vLLM metrics ----------------------------------------------------------------------------------------------


def test_vllm_load_is_summed_over_label_sets() -> None:
    text = "\n".join(
        [
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0',
            'vllm:num_requests_waiting{engine="1",model_name="m"} 1.0',
            'vllm:num_requests_running{engine="0",model_name="m"} 5.0',
            'vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 9.0',
            "vllm:num_requests_running_total 100",
        ]
    )
    load = parse_vllm_load(text)
    assert load is not None and (load.waiting, load.running) == (4.0, 5.0)
    assert parse_vllm_load("process_cpu_seconds_total 1.0") is None


GAUGES = 'vllm:num_requests_waiting{engine="0"} 2.0\nvllm:num_requests_running{engine="0"} 3.0\n'


def test_the_poller_reads_often_only_while_background_work_is_present() -> None:
    now = [0.0]
    busy = [False]
    poller = UpstreamPoller(
        lambda url, timeout: asyncio.sleep(0, GAUGES),
        "http://vllm/metrics",
        interval_s=0.5,
        on_load=lambda at, load: None,
        clock=lambda: now[0],
        busy=lambda: busy[0],
        idle_interval_s=10.0,
    )
    assert poller.due(0.0)  # never read yet
    assert asyncio.run(poller.poll_once()) == VllmLoad(2.0, 3.0)
    assert not poller.due(0.6) and not poller.due(9.9) and poller.due(10.0)
    busy[0] = True
    assert not poller.due(0.4) and poller.due(0.5)


def test_the_poller_falls_back_to_the_whole_page_when_the_filtered_one_lacks_the_gauges() -> None:
    asked: list[str] = []
    pages = {"http://vllm/metrics": GAUGES, "http://vllm/metrics/": "# nothing here\n"}

    async def fetch(url: str, timeout_s: float) -> str:
        asked.append(url)
        if "down" in pages:
            raise UpstreamBroken("connection refused")
        return pages[url.split("?")[0]]

    poller = UpstreamPoller(fetch, "http://vllm/metrics", 0.5, lambda at, load: None)
    assert poller.reads_filtered
    assert asyncio.run(poller.poll_once()) == VllmLoad(2.0, 3.0)  # from the whole page
    assert asked == [
        "http://vllm/metrics/?name[]=vllm:num_requests_waiting&name[]=vllm:num_requests_running",
        "http://vllm/metrics",
    ]
    assert not poller.reads_filtered and poller.last_error is None
    asked.clear()
    assert asyncio.run(poller.poll_once()) == VllmLoad(2.0, 3.0)
    assert asked == ["http://vllm/metrics"]  # no second try of the filtered page

    # vLLM down: both reads fail, and the filtered page is not given up for it.
    asked.clear()
    down = UpstreamPoller(fetch, "http://vllm/metrics", 0.5, lambda at, load: None)
    pages["down"] = ""
    assert asyncio.run(down.poll_once()) is None
    assert down.reads_filtered and down.last_error == "connection refused"


def test_the_sliding_window_percentile_matches_sorting_the_samples_it_holds() -> None:
    rng = random.Random(7)
    window = SlidingWindow(max_age_s=5.0, max_samples=50)
    held: list[tuple[float, float]] = []
    now = 0.0
    for _ in range(2000):
        now += rng.random() * 0.1
        value = round(rng.random(), 2)  # repeated values: removal must take one copy only
        window.add(now, value)
        held = [*held, (now, value)][-50:]
        if rng.random() < 0.1:
            window.prune(now)
            held = [(t, v) for t, v in held if t >= now - 5.0]
        values = sorted(v for _, v in held)
        assert len(window) == len(values)
        for q in (50, 99, 100):
            assert window.percentile(q) == values[max(1, math.ceil(q / 100 * len(values))) - 1]
    window.prune(now + 10)
    assert len(window) == 0 and window.percentile(99) is None


# -- choice of replica ----------------------------------------------------------------------------------------


def test_chat_goes_to_the_replica_with_the_best_predicted_first_token() -> None:
    idle = ReplicaLoad(queued=0, running=0, ttft_s=0.1)
    busy = ReplicaLoad(queued=2, running=4, ttft_s=0.1)
    assert rank_for_chat([busy, idle]) == [1, 0]
    # A slower replica (its recent first tokens) loses to a faster one with one request ahead only when the
    # queue costs more than the speed gains: 0.1 x (1 + 1) = 0.2 against 0.3 x 1.
    assert rank_for_chat([ReplicaLoad(0, 0, 0.3), ReplicaLoad(1, 0, 0.1)]) == [1, 0]
    assert rank_for_chat([ReplicaLoad(0, 0, 0.15), ReplicaLoad(1, 0, 0.1)]) == [0, 1]
    # Running requests count a share of a turn each: four of them weigh one queued request.
    assert predicted_ttft_s(ReplicaLoad(0, 4, None), prior_s=0.1) == pytest.approx(0.2)


def test_ties_keep_the_configured_order_and_an_unmeasured_replica_is_assumed_as_fast_as_the_best() -> None:
    assert rank_for_chat([ReplicaLoad(0, 0, None), ReplicaLoad(0, 0, None)]) == [0, 1]
    assert rank_for_chat([ReplicaLoad(0, 0, 0.5), ReplicaLoad(0, 0, None)]) == [0, 1]
    # Judged on a default (0.1 s) instead, the new replica would win with a request ahead: 0.2 against 0.5.
    assert rank_for_chat([ReplicaLoad(0, 0, 0.5), ReplicaLoad(1, 0, None)]) == [0, 1]
