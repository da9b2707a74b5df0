"""`bench mixed`'s third stream against real servers: chat, the caption flood and watch rules' questions through a
real gateway (an alert key of its own) in front of the session's vLLM, sent by the benchmark's load generator."""

from __future__ import annotations

import json

import httpx
import pytest
from helpers import metric

from visioncap.bench.common.gateway_proc import gateway_config
from visioncap.bench.common.load import PhaseSpec, Target, run_phase_sync
from visioncap.bench.common.workload import ChatTurn, FramePool, caption_bodies, chat_body, verification_bodies
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import VllmServer

pytestmark = pytest.mark.vllm

KEYS = {"chat": "bench-chat-key", "captions": "bench-captions-key", "alerts": "bench-alerts-key"}


def test_a_phase_carries_questions_on_the_alert_key_beside_chat_and_the_flood(vllm_server: VllmServer) -> None:
    model = vllm_server.profile.served_model_name
    config = gateway_config(
        vllm_server.base_url,
        KEYS["chat"],
        KEYS["captions"],
        10,
        objectives={"ttft_p99_ms": 5000, "itl_p99_ms": 1000},
        background={"max_concurrency": 2},
        controller={"interval_s": 0.25},
        max_tokens_per_image=1280,
        alert={"key": KEYS["alerts"], "priority": 5, "deadline_s": 60},
    )
    frames = FramePool(160, 120, seed=3)
    questions, cameras, counts, _ = verification_bodies(frames.take(12), model, 64, 2, None, (1, 2, 3))
    captions, caption_cameras = caption_bodies(frames.take(40), model, 8, 2, None)
    turns = [ChatTurn(index, 0.5 * index, 16, 8) for index in range(4)]
    with GatewayThread(config) as gw:

        def through(key: str) -> Target:
            return Target(gw.base_url, {"authorization": f"Bearer {KEYS[key]}"})

        spec = PhaseSpec(
            "three-classes",
            duration_s=6.0,
            warmup_s=1.0,
            chat=through("chat"),
            chat_turns=turns,
            chat_bodies=[json.dumps(chat_body(model, turn, seed=7)).encode() for turn in turns],
            flood=through("captions"),
            flood_rate_per_s=4.0,
            flood_bodies=captions,
            flood_cameras=caption_cameras,
            flood_max_outstanding=4,
            verify=through("alerts"),
            verify_rate_per_s=1.0,
            verify_bodies=questions,
            verify_cameras=cameras,
            verify_frames=counts,
            verify_deadline_s=60.0,
            verify_max_outstanding=6,  # none dropped however slow this host is
        )
        result = run_phase_sync(spec)
        metrics = httpx.get(f"{gw.root_url}/metrics", timeout=10).text
    summary = result.summary()
    asked = summary["verifications"]
    # Six questions, one a second from 0.5 s (the first before the window): each answered, none late.
    assert [question.index for question in result.verifications] == list(range(6))
    assert all(question.status == 200 for question in result.verifications), result.verifications
    assert (asked["sent"], asked["answered"], asked["late"]) == (5, 5, 0)
    assert [question.frames for question in result.verifications] == counts[:6]
    # Each went through the alert class (the deadline header accepted), the chats and captions through theirs.
    assert metric(metrics, "visioncap_gateway_requests_total", traffic_class="alert", status="200") == 6
    assert summary["chat"]["ok"] == len(turns)
    assert summary["captions"]["outcomes"].get("200", 0) >= 1
