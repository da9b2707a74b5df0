"""How the served model's costs compare on this machine: a decode step, a text prefill, an image prefill.

Measured alone (nothing else sent to the server), a few times each, medians reported. The benchmark model is
sized so that an image prompt costs clearly more than a decode step; this records by how much.
"""

from __future__ import annotations

import random
import time
from typing import Any

import httpx

from visioncap.bench.common.stats import percentile
from visioncap.bench.common.workload import camera_frame, caption_body, chat_text
from visioncap.caption.encode import jpeg_data_uri
from visioncap.gateway.sse import StreamObserver, SyncCountingTransport, network_reads


def tokens_per_word(client: httpx.Client, root_url: str, model: str, seed: int = 0) -> float:
    """Tokens per word of the benchmark's chat text, from vLLM's /tokenize."""
    text = chat_text(400, random.Random(seed))
    answer = client.post(f"{root_url}/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    answer.raise_for_status()
    count: int = answer.json()["count"]
    return max(0.1, count / 400)


def _stream(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, list[float], int]:
    """(TTFT s, inter-token gaps s, prompt tokens) of one streamed request, timed as the load generator does."""
    ttft: list[float] = []
    gaps: list[float] = []
    started = time.perf_counter()
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", url, json=payload, headers={"accept-encoding": "identity"}) as r:
        r.raise_for_status()
        observer = StreamObserver(
            started,
            time.perf_counter,
            on_first=lambda _at, seconds: ttft.append(seconds),
            on_gap=lambda _at, seconds: gaps.append(seconds),
            reads=network_reads(r),
        )
        for data in r.iter_raw():
            observer.feed(data)
        observer.close()
    return (ttft[0] if ttft else 0.0), gaps, int((observer.usage or {}).get("prompt_tokens") or 0)


def calibrate(base_url: str, model: str, repeats: int = 5, seed: int = 0) -> dict[str, Any]:
    """Median costs in ms of a decode step, a ~256-token text prefill and a 640x480 image prefill, alone."""
    rng = random.Random(f"{seed}:calibrate")
    url = f"{base_url}/chat/completions"
    root = base_url.removesuffix("/v1")
    # Idle connections are closed before vLLM's 5 s keep-alive timeout would close them under a request.
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=4)
    with httpx.Client(timeout=120, transport=SyncCountingTransport(limits)) as client:
        per_word = tokens_per_word(client, root, model, seed)
        short: dict[str, Any] = {
            "model": model,
            "max_tokens": 64,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,  # a chunk per token, also for tokens without text
        }
        # Warm-up: the first requests of a fresh server pay one-off costs.
        _stream(client, url, {**short, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        _stream(client, url, caption_body(model, jpeg_data_uri(camera_frame(640, 480, rng)), 1, "cal"))
        decode, text_ttft, image_ttft = [], [], []
        text_tokens = image_tokens = 0
        for _ in range(repeats):
            _, gaps, _ = _stream(client, url, {**short, "messages": [{"role": "user", "content": chat_text(8, rng)}]})
            decode.append(percentile(gaps, 50) or 0.0)
            long_prompt = [{"role": "user", "content": chat_text(round(256 / per_word), rng)}]
            ttft, _, text_tokens = _stream(client, url, {**short, "max_tokens": 1, "messages": long_prompt})
            text_ttft.append(ttft)
            ttft, _, image_tokens = _stream(
                client, url, caption_body(model, jpeg_data_uri(camera_frame(640, 480, rng)), 1, "cal")
            )
            image_ttft.append(ttft)
    decode_ms = (percentile(decode, 50) or 0.0) * 1000
    image_ms = (percentile(image_ttft, 50) or 0.0) * 1000
    return {
        "tokens_per_word": per_word,
        "repeats": repeats,
        "decode_step_ms": decode_ms,
        "text_prefill_ms": (percentile(text_ttft, 50) or 0.0) * 1000,
        "text_prefill_prompt_tokens": text_tokens,
        "image_prefill_ms": image_ms,
        "image_prefill_prompt_tokens": image_tokens,
        "image_prefill_over_decode_step": image_ms / decode_ms if decode_ms > 0 else None,
    }
