"""The cost model: parameter counts against published ones, roofline figures inside the issue's bands, and the
dry run that prints them (without starting vLLM)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import REPO, invoke_cli

from visioncap.config.gateway import GatewayConfig
from visioncap.config.profiles import load_profile
from visioncap.config.settings import Settings
from visioncap.serve import VllmServer
from visioncap.serve import costmodel as cm

MODELS = REPO / "models"
QWEN7B = "Qwen/Qwen2.5-VL-7B-Instruct"
REAL_PROFILES = ("qwen2.5-vl-7b", "qwen2.5-vl-3b", "qwen3-vl-4b", "qwen3-vl-8b", "smolvlm")


def cost(profile: str, gpu_class: str, budget: int | None = None) -> cm.CostModel:
    """The cost model of a profile as committed, or with its chunk budget on `gpu_class` set to `budget` (the
    committed one is `visioncap tune`'s to change)."""
    loaded = load_profile(profile, MODELS)
    if budget is not None:
        loaded = loaded.with_serving(gpu_class, max_num_batched_tokens=budget)
    return cm.for_profile(loaded, gpu_class)


def test_qwen25_vl_7b_parameter_counts_match_the_published_ones() -> None:
    shape = cm.BUILTIN_SHAPES[QWEN7B]
    print(cm.parameter_check(shape, QWEN7B))
    assert shape.text.params == pytest.approx(7.6e9, rel=0.03)
    assert shape.vision is not None and shape.vision.params == pytest.approx(0.67e9, rel=0.03)
    # The profile's memory estimate says 8.3B parameters in all.
    assert shape.params == pytest.approx(8.3e9, rel=0.01)


@pytest.mark.parametrize(
    ("model", "published"),
    [
        ("Qwen/Qwen2.5-VL-3B-Instruct", 3.75e9),
        ("Qwen/Qwen3-VL-4B-Instruct", 4.44e9),
        ("Qwen/Qwen3-VL-8B-Instruct", 8.77e9),
        ("HuggingFaceTB/SmolVLM2-2.2B-Instruct", 2.25e9),
        ("meta-llama/Llama-3.1-8B-Instruct", 8.03e9),
    ],
)
def test_other_builtin_shapes_match_their_model_cards(model: str, published: float) -> None:
    assert cm.BUILTIN_SHAPES[model].params == pytest.approx(published, rel=0.03)


def test_kv_cache_per_token_agrees_with_the_profiles() -> None:
    for name in REAL_PROFILES:
        profile = load_profile(name, MODELS)
        assert profile.memory is not None
        assert cm.shape_for(profile).text.kv_bytes_per_token / 1024 == profile.memory.kv_cache_kib_per_token, name


@pytest.mark.vllm  # the server environment builds the tiny model
def test_local_config_is_read_and_counts_every_parameter() -> None:
    folder = MODELS / "build" / "tiny-qwen2vl"
    profile = load_profile("tiny", MODELS)
    # Built as `visioncap serve` builds it on first use (nothing to do once built), not left to test order.
    VllmServer(profile, python=Settings().server_python).ensure_model()
    shape = cm.shape_for(profile)
    assert shape.source.startswith("config.json")
    built = json.loads((folder / "visioncap_build.json").read_text())
    assert shape.params == built["param_count"]  # the builder counted the real tensors


def test_frame_geometry_matches_the_processor() -> None:
    vision = cm.BUILTIN_SHAPES[QWEN7B].vision
    assert vision is not None
    frame = cm.image_layout(vision, 640, 480)
    assert (frame.resized_width, frame.resized_height, frame.patches, frame.tokens) == (644, 476, 1564, 391)
    # ENVIRONMENT.md's measured token counts at smaller max_pixels.
    for max_pixels, tokens in ((256 * 28 * 28, 234), (128 * 28 * 28, 117), (64 * 28 * 28, 54)):
        assert cm.image_layout(vision, 640, 480, max_pixels=max_pixels).tokens == tokens
    # Window layers attend within 64-patch windows, far less than the whole frame.
    assert frame.attention_pairs_window < frame.attention_pairs_full / 10


def test_decode_step_on_h200_and_l4() -> None:
    h200, l4 = cost("qwen2.5-vl-7b", "h200"), cost("qwen2.5-vl-7b", "l4")
    assert 4 <= h200.decode_ms[1] <= 10
    ratio = l4.decode_ms[1] / h200.decode_ms[1]
    # Bandwidth-bound: the 16x bandwidth gap, diluted by the same fixed step overhead on both.
    assert 8 <= ratio <= 16


def test_encoder_and_prefill_in_the_issue_bands() -> None:
    model = cost("qwen2.5-vl-7b", "h200")
    assert model.encoder_ms_per_frame is not None and 4 <= model.encoder_ms_per_frame <= 8
    assert 0.02 <= model.prefill_ms_per_token <= 0.03
    vision = model.shape.vision
    assert vision is not None and model.frame is not None
    # ~1.35 GFLOP a patch, ~2.2 TFLOP a frame (the issue's estimate).
    flops = cm.encoder_flops(vision, model.frame)
    assert flops / model.frame.patches == pytest.approx(1.35e9, rel=0.05)
    assert flops == pytest.approx(2.2e12, rel=0.1)
    # "about one decode step of encoder and about 1.5 of prefill": the ratios the stand-in must reproduce.
    assert model.frame_encoder_steps is not None and 0.6 <= model.frame_encoder_steps[0] <= 1.5
    assert model.frame_prefill_steps is not None and 1.0 <= model.frame_prefill_steps[0] <= 2.5


def test_monotonic_in_batch_and_context() -> None:
    text = cm.BUILTIN_SHAPES[QWEN7B].text
    gpu = cm.GPU_SPECS["h200"]
    by_batch = [cm.decode_step_ms(text, gpu, b, 1024) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert by_batch == sorted(by_batch) and by_batch[-1] > by_batch[0]
    by_context = [cm.decode_step_ms(text, gpu, 8, c) for c in (0, 512, 2048, 8192, 32768)]
    assert by_context == sorted(by_context) and by_context[-1] > by_context[0]
    per_token = [cm.prefill_ms(text, gpu, 256, c) / 256 for c in (0, 1024, 8192, 32768)]
    assert per_token == sorted(per_token) and per_token[-1] > 1.5 * per_token[0]


def test_step_budget_from_the_profile() -> None:
    h200, l4 = cost("qwen2.5-vl-7b", "h200", 2048), cost("qwen2.5-vl-7b", "l4", 512)
    assert h200.budget.max_num_batched_tokens == 2048 and l4.budget.max_num_batched_tokens == 512
    # vLLM 0.32: encoder budget = max(chunk budget, largest image = 512 tokens); a frame is 391 tokens.
    assert h200.budget.encoder_budget_tokens == 2048 and h200.budget.frames_encoded_per_step == 5
    assert l4.budget.frames_encoded_per_step == 1
    below_an_image = cost("qwen2.5-vl-7b", "h200", 256).budget
    assert below_an_image.encoder_budget_tokens == 512 and below_an_image.frames_encoded_per_step == 1
    # 451 prompt tokens at most 256 a step (long_prefill_token_threshold) on the L4: two steps.
    assert l4.budget.frame_prefill_steps == 2 and h200.budget.frame_prefill_steps == 1


def test_the_worst_step_runs_every_frame_the_encoder_budget_holds() -> None:
    h200, l4 = cost("qwen2.5-vl-7b", "h200", 2048), cost("qwen2.5-vl-7b", "l4", 512)
    text, batch, context = cm.BUILTIN_SHAPES[QWEN7B].text, 8, 1024
    assert h200.encoder_ms_per_frame is not None and l4.encoder_ms_per_frame is not None
    # H200: 5 frames' encoders, then their 5 x 451 prompt tokens cut to the 2048-token budget less the batch.
    expected = cm.step_ms(text, cm.GPU_SPECS["h200"], batch, context, 2040) + 5 * h200.encoder_ms_per_frame
    assert h200.budget.worst_step_ms == pytest.approx(expected)
    assert h200.step_with_frame_ms is not None and h200.budget.worst_step_ms > 3 * h200.step_with_frame_ms
    # L4: one frame fits its encoder budget; its whole 451-token prompt fits the 512-token budget.
    expected = cm.step_ms(text, cm.GPU_SPECS["l4"], batch, context, 451) + l4.encoder_ms_per_frame
    assert l4.budget.worst_step_ms == pytest.approx(expected)


def test_published_measurements_within_a_third() -> None:
    for item in cm.PUBLISHED:
        estimate = cm.published_estimate(item)
        print(f"{item.url}: measured {item.measured_ms:.1f} ms, estimated {estimate:.1f} ms")
        assert estimate == pytest.approx(item.measured_ms, rel=0.33), item.what


def test_every_real_profile_has_figures_on_every_class() -> None:
    for name in REAL_PROFILES:
        for gpu_class in ("l4", "a10", "a100", "h100", "h200"):
            model = cost(name, gpu_class)
            assert model.frame_encoder_steps is not None and model.frame_prefill_steps is not None
            assert all(value > 0 for value in (*model.frame_encoder_steps, *model.chat_prefill_steps))


def test_cpu_class_has_no_roofline() -> None:
    with pytest.raises(LookupError, match="cpu"):
        cost("tiny", "cpu")


def test_dry_run_prints_the_cost_model() -> None:
    result = invoke_cli("serve", "--profile", "qwen2.5-vl-7b", "--gpu", "h200", "--dry-run")
    assert result.returncode == 0, result.stderr
    model = cost("qwen2.5-vl-7b", "h200")
    assert "cost model: Qwen2.5-VL-7B on H200 SXM" in result.stderr
    assert f"1: {model.decode_ms[1]:.2f}" in result.stderr
    assert f"encoder {model.encoder_ms_per_frame:.2f} ms" in result.stderr
    assert "parameters: language model 7.616B (published 7.60B" in result.stderr
    budget = model.budget  # the profile's h200 budget, whatever `visioncap tune` last wrote there
    frames = budget.frames_encoded_per_step
    assert f"encoder budget {budget.encoder_budget_tokens} tokens = {frames} frame encoder pass(es) per step" in (
        result.stderr
    )
    assert budget.worst_step_ms is not None
    assert (
        f"the worst step, a batch-8 step that runs {frames} frame encoder pass(es) (the encoder budget) and their "
        f"prefill: {budget.worst_step_ms:.2f} ms" in result.stderr
    )
    # The gateway's pacing default comes from here: one step in a hundred may carry a frame.
    typical = model.decode_ms[model.workload.typical_batch] / 1000
    assert model.frame_encoder_steps is not None and model.frame_prefill_steps is not None
    frame_steps = model.frame_encoder_steps[1] + model.frame_prefill_steps[1]
    expected = 0.01 / (typical * (1 + 0.01 * frame_steps))
    assert f"{expected:.2f} frames/s started one at a time (1% of steps" in result.stderr
    assert GatewayConfig.model_fields["pacing"].default_factory().start_per_s == pytest.approx(expected, rel=0.05)
    assert "vllm_entry.py" in result.stdout  # the command, still alone on stdout


def test_dry_run_json_carries_the_cost_model() -> None:
    result = invoke_cli("serve", "--profile", "qwen2.5-vl-7b", "--gpu", "l4", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)["cost_model"]
    model = cost("qwen2.5-vl-7b", "l4")
    assert data["gpu_class"] == "l4" and data["decode_ms"]["1"] == pytest.approx(model.decode_ms[1])
    assert data["frame"]["tokens"] == 391 and data["budget"]["frame_prefill_steps"] == 2
    assert data["budget"]["worst_step_ms"] == pytest.approx(model.budget.worst_step_ms)


def test_dry_run_on_the_cpu_says_why_there_is_no_cost_model() -> None:
    result = invoke_cli("serve", "--profile", "tiny", "--gpu", "cpu", "--dry-run", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cost_model"] is None
    assert "cost model: none (no roofline for GPU class 'cpu'" in result.stderr


def test_a_config_of_another_architecture_is_refused(tmp_path: Path) -> None:
    config = {"model_type": "llava", "vision_config": {}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no shape reader"):
        cm.read_shape(tmp_path / "config.json")


def test_an_event_of_several_frames_costs_their_passes_and_their_tokens() -> None:
    """One frame of the event budget costs what the workload's frame costs; the same budget over three frames costs
    three shorter passes (window attention keeps each pass near linear in its patches) and the same prefill."""
    shape, gpu = cm.BUILTIN_SHAPES[QWEN7B], cm.GPU_SPECS["h200"]
    vision = shape.vision
    assert vision is not None
    one = cm.event_cost(shape, gpu, [(644, 476)], text_tokens=60)
    layout = cm.image_layout(vision, 644, 476)
    assert one.image_tokens == layout.tokens == 391
    assert one.encoder_ms == pytest.approx(cm.encoder_ms(vision, gpu, layout)) == one.largest_pass_ms
    assert one.prefill_ms == pytest.approx(cm.prefill_ms(shape.text, gpu, 391 + 60))
    three = cm.event_cost(shape, gpu, [(364, 280)] * 3, text_tokens=60)  # 13 x 10 tokens each
    assert three.frames == 3 and three.image_tokens == 3 * 130
    assert three.largest_pass_ms < one.largest_pass_ms / 2
    assert three.encoder_ms == pytest.approx(3 * three.largest_pass_ms)
    assert three.prefill_ms == pytest.approx(cm.prefill_ms(shape.text, gpu, 390 + 60))
    with pytest.raises(ValueError, match="at least one frame"):
        cm.event_cost(shape, gpu, [])
