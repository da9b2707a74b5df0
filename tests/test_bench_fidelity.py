"""The stand-in fidelity check: pure parts, and one measurement against the session's real vLLM."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from helpers import REPO, TINY_MODEL

from visioncap.bench.standin.fidelity import (
    FidelityProbe,
    FidelityTarget,
    Injection,
    _bodies,
    encoder_steps,
    gate_goals,
    histogram_totals,
    judge,
    measure,
    report_lines,
    spread_of,
    target_for,
    within_tolerance,
)
from visioncap.serve import VllmServer

TARGET = FidelityTarget(frame_encoder_steps=1.0, frame_prefill_steps=2.0, chat_prefill_steps=1.0, source="test")


def test_tolerance_is_a_band_around_the_target() -> None:
    assert within_tolerance(1.25, 1.0) and within_tolerance(0.75, 1.0)
    assert not within_tolerance(1.26, 1.0) and not within_tolerance(0.74, 1.0)
    assert not within_tolerance(1.0, 0.0)
    ratios, within = judge({"frame_encoder_steps": 2.0, "frame_prefill_steps": 2.1, "chat_prefill_steps": 0.8}, TARGET)
    assert ratios == pytest.approx({"frame_encoder_steps": 2.0, "frame_prefill_steps": 1.05, "chat_prefill_steps": 0.8})
    assert within == {"frame_encoder_steps": False, "frame_prefill_steps": True, "chat_prefill_steps": True}


def test_histogram_totals_add_every_label_set_and_ignore_the_buckets() -> None:
    text = "\n".join(
        [
            "# HELP vllm:inter_token_latency_seconds Histogram of inter-token latency in seconds.",
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 3.0',
            'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10.0',
            'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.25',
            'vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 5.0',
            'vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.5',
            'vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 9.0',
        ]
    )
    assert histogram_totals(text, "vllm:inter_token_latency_seconds") == (0.75, 15.0)
    assert histogram_totals(text, "vllm:time_to_first_token_seconds") == (9.0, 0.0)


def test_spread_says_how_much_the_step_moved() -> None:
    assert spread_of([10.0] * 9) == 0
    assert spread_of([10.0, 10.0, 10.0, 30.0]) > 0.5
    assert math.isinf(spread_of([0.0, 0.0]))


def test_the_encoder_is_the_median_difference_within_a_round_not_a_difference_of_quartiles() -> None:
    # Each round the machine's load adds the same to both kinds (0 to 4 steps); stalls hit the text prompt of
    # the three quietest rounds. The kinds' lower quartiles then come from different rounds: 4.0 - 4.5 steps, a
    # negative encoder (as measured once); within each round the frame costs one step more.
    load = [0.0, 4.0, 1.0, 3.0, 0.5, 2.0, 3.5, 1.5, 2.5]
    injections = []
    for index, extra in enumerate(load):
        stall = 5.0 if extra <= 1.0 else 0.0
        injections.append(Injection("frame", 560, 0.0, index, steps=3.0 + extra))
        injections.append(Injection("same_text", 560, 0.0, index, steps=2.0 + extra + stall))
    assert encoder_steps(injections) == pytest.approx(1.0)
    # A round that lost its text (a dropped connection gave up on it) pairs nothing.
    assert encoder_steps([*injections, Injection("frame", 560, 0.0, 99, steps=50.0)]) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no round"):
        encoder_steps([i for i in injections if i.kind == "frame"])


def test_cost_model_targets_for_the_two_gpu_classes() -> None:
    h200 = target_for("qwen2.5-vl-7b", "h200", REPO / "models")
    l4 = target_for("qwen2.5-vl-7b", "l4", REPO / "models")
    # Roofline figures of the cost model (docs/cost-model.md): about one decode step of encoder per frame on
    # an H200, fewer on an L4, whose slow memory makes its decode step relatively dearer.
    assert 0.7 < h200.frame_encoder_steps < 1.2 and 1.5 < h200.frame_prefill_steps < 2.5
    assert l4.frame_encoder_steps < h200.frame_encoder_steps and l4.chat_prefill_steps < h200.chat_prefill_steps
    with pytest.raises(LookupError):
        target_for("qwen2.5-vl-7b", "cpu", REPO / "models")


def test_goals_are_not_judged_on_a_stand_in_that_is_off_target() -> None:
    from visioncap.bench.standin.fidelity import FidelityResult

    goals = {"itl_p99_at_1_25": {"value": 1.1, "goal": "<= 1.25", "met": True}}

    def result(encoder: float, spread: float = 0.1) -> FidelityResult:
        measured = {"frame_encoder_steps": encoder, "frame_prefill_steps": 2.0, "chat_prefill_steps": 1.0}
        ratios, within = judge(measured, TARGET)
        return FidelityResult(
            TARGET, FidelityProbe(), 10.0, 451, 256, measured, ratios, within, 0.25,
            all(within.values()) and spread <= 0.5, step_spread=spread, steady=spread <= 0.5,
        )  # fmt: skip

    good = gate_goals(goals, result(1.1))
    assert good["itl_p99_at_1_25"]["met"] is True and good["stand_in_fidelity_encoder"]["met"] is True
    off = gate_goals(goals, result(20.0))
    assert off["stand_in_fidelity_encoder"] == {**off["stand_in_fidelity_encoder"], "value": 20.0, "met": False}
    assert off["itl_p99_at_1_25"]["met"] is None and "frame_encoder_steps" in off["itl_p99_at_1_25"]["not_judged"]
    assert off["itl_p99_at_1_25"]["value"] == 1.1  # kept for the record
    busy = gate_goals(goals, result(1.0, spread=2.0))
    assert busy["itl_p99_at_1_25"]["met"] is None and "busy" in busy["itl_p99_at_1_25"]["not_judged"]
    assert gate_goals(goals, None) == goals


def test_fidelity_is_measured_against_real_vllm(vllm_server: VllmServer) -> None:
    probe = FidelityProbe(
        frame_width=320, frame_height=240, chat_prompt_tokens=96, frame_filler_words=30, repeats=3, probe_tokens=400
    )
    result = measure(vllm_server.base_url, TINY_MODEL, TARGET, probe)
    assert [i["kind"] for i in result.injections] == ["tiny", "frame", "same_text", "chat"] * 3
    # The frame's prompt holds its image tokens (320x240 resized to 308x252: 11x9 merged patches), the caption
    # text (16 tokens or more) and the filler after the image (about a token a word).
    assert result.frame_prompt_tokens > 99 + 16 + 25
    same = [i["prompt_tokens"] for i in result.injections if i["kind"] == "same_text"]
    assert all(abs(tokens - result.frame_prompt_tokens) <= 4 for tokens in same)
    assert abs(result.chat_prompt_tokens - 96) <= 2
    # Each injection's prefill time is vLLM's own, one request at a time; a frame's prompt takes longer than a
    # one-word prompt's.
    assert all(i["prefill_ms"] > 0 for i in result.injections)
    tiny = sorted(i["prefill_ms"] for i in result.injections if i["kind"] == "tiny")
    frame = sorted(i["prefill_ms"] for i in result.injections if i["kind"] == "frame")
    assert frame[1] > tiny[1]
    assert result.step_ms > 0 and all(math.isfinite(v) for v in result.measured.values())
    lines = report_lines(result)
    assert lines[0].startswith("stand-in fidelity against test") and len(lines) == 5


def test_a_second_measurement_on_the_same_server_sends_frames_it_has_not_seen(vllm_server: VllmServer) -> None:
    """A refit measures again on the same server (prefix cache on), often at the same frame size with more filler.
    Its frames must be new images: the same image again, with the old filler a prefix of the new, is found in
    vLLM's prefix cache and costs no encoder pass (a tune run measured a frame's encoder at -1.1 steps)."""
    first_probe = FidelityProbe(frame_width=196, frame_height=140, frame_filler_words=20, repeats=2)
    refit_probe = FidelityProbe(frame_width=196, frame_height=140, frame_filler_words=40, repeats=2)

    def images(probe: FidelityProbe) -> list[str]:
        async def made() -> list[str]:
            async with httpx.AsyncClient(timeout=60) as client:
                bodies = await _bodies(client, vllm_server.base_url, TINY_MODEL, probe)
            return [body["messages"][0]["content"][1]["image_url"]["url"] for body in bodies.frames]

        return asyncio.run(made())

    first, again = images(first_probe), images(refit_probe)
    assert len(set(first)) == len(first) == (2 + first_probe.warmup_rounds) * 2
    assert not set(first) & set(again)
