"""Sizing the CPU stand-in from calibration points (pure arithmetic; the measuring is test_bench_fidelity's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

from visioncap.bench.standin.fidelity import FidelityTarget
from visioncap.bench.standin.sizing import (
    CalibrationPoint,
    fit_line,
    frame_for_tokens,
    image_tokens,
    scaled_chat_prompts,
    solve,
    stand_in_spec,
    workload_for,
    write_stand_in,
)
from visioncap.config.profiles import load_profile
from visioncap.errors import ConfigError


def test_fit_line_recovers_a_line_and_refuses_one_size() -> None:
    assert fit_line([(0, 1.0), (10, 3.0), (20, 5.0)]) == pytest.approx((1.0, 0.2))
    with pytest.raises(ValueError):
        fit_line([(5, 1.0), (5, 2.0)])


def test_frames_are_sized_in_whole_tokens() -> None:
    assert image_tokens(640, 480) == 391  # 644x476 after the resize: 23 x 17
    width, height = frame_for_tokens(100)
    assert width % 28 == 0 and height % 28 == 0
    assert abs(image_tokens(width, height) - 100) <= 12 and 1.1 < width / height < 1.6


def test_solve_sizes_the_image_for_the_encoder_and_fills_the_prompt_for_the_prefill() -> None:
    # A stand-in whose prefill costs 0.2 + 0.01 steps per token, its encoder 0.3 + 0.01 steps per image token.
    points = [
        CalibrationPoint(159, 99, 64, 0.3 + 0.01 * 99, 0.2 + 0.01 * 159, 0.2 + 0.01 * 64),
        CalibrationPoint(252, 192, 160, 0.3 + 0.01 * 192, 0.2 + 0.01 * 252, 0.2 + 0.01 * 160),
    ]
    target = FidelityTarget(0.93, 1.94, 1.10, "test")
    sizes = solve(target, target_frame_prompt_tokens=451, target_budget=512, points=points)
    assert sizes.chat_prompt_tokens == 90  # (1.10 - 0.2) / 0.01
    assert sizes.frame_prompt_tokens == 174  # (1.94 - 0.2) / 0.01
    assert abs(sizes.image_tokens - 63) <= 8  # (0.93 - 0.3) / 0.01, in whole image-token rows
    # The caption text (60 tokens) is kept; filler text makes up the rest of the prompt.
    assert sizes.frame_filler_words == 174 - sizes.image_tokens - 60 > 0
    assert sizes.scale == pytest.approx(174 / 451)
    assert sizes.max_num_batched_tokens % 16 == 0 and sizes.max_num_batched_tokens >= 512 * sizes.scale
    assert sizes.predicted.frame_prefill_steps == pytest.approx(1.94)
    assert sizes.predicted.frame_encoder_steps == pytest.approx(0.3 + 0.01 * sizes.image_tokens)
    assert abs(sizes.predicted.frame_encoder_steps / 0.93 - 1) < 0.15


def test_solve_never_makes_the_prompt_shorter_than_its_image() -> None:
    # An encoder so cheap that the target's encoder cost takes more image tokens than the prefill allows.
    points = [
        CalibrationPoint(159, 99, 64, 0.001 * 99, 0.2 + 0.01 * 159, 0.2 + 0.01 * 64),
        CalibrationPoint(252, 192, 160, 0.001 * 192, 0.2 + 0.01 * 252, 0.2 + 0.01 * 160),
    ]
    sizes = solve(FidelityTarget(0.93, 1.94, 1.10, "test"), 451, 512, points)
    assert sizes.frame_filler_words == 0
    assert sizes.frame_prompt_tokens == sizes.image_tokens + 60


def _sized(gpu: str, width: int) -> dict[str, Any]:
    figures = {"frame_encoder_steps": 1.1, "frame_prefill_steps": 0.9, "chat_prefill_steps": 1.0}
    return {
        "target": {"gpu": gpu, "chat_prompt_tokens": 256},
        "sizes": {
            "frame_width": width,
            "frame_height": 224,
            "frame_filler_words": 200,
            "chat_prompt_tokens": 230,
            "max_num_batched_tokens": 1728,
            "scale": 1.2,
        },
        "verified": {"ratio": figures},
    }


def test_the_stand_in_block_is_written_into_the_profile_and_rewritten_in_place(tmp_path: Path) -> None:
    profile = tmp_path / "stand.yaml"
    original = (REPO / "models" / "tiny-bench.yaml").read_text(encoding="utf-8")
    profile.write_text(original, encoding="utf-8")
    write_stand_in(profile, stand_in_spec("qwen2.5-vl-7b", {"targets": {"h200": _sized("h200", 308)}}, "now"))
    loaded = load_profile(str(profile), tmp_path)
    assert loaded.stand_in is not None and loaded.stand_in.target == "qwen2.5-vl-7b"
    workload = workload_for(loaded, "qwen2.5-vl-7b", "h200")
    assert workload is not None and (workload.frame_width, workload.frame_filler_words) == (308, 200)
    assert workload_for(loaded, "qwen2.5-vl-7b", "l4") is None and workload_for(loaded, "other", "h200") is None
    assert scaled_chat_prompts(workload, (64, 256)) == (58, 230)
    # Written again: one block, the new values, and the hand-written part of the file byte for byte.
    write_stand_in(profile, stand_in_spec("qwen2.5-vl-7b", {"targets": {"l4": _sized("l4", 224)}}, "later"))
    text = profile.read_text(encoding="utf-8")
    assert text.count("stand_in:") == 1 and text.startswith(original.rstrip())
    again = load_profile(str(profile), tmp_path)
    assert again.stand_in is not None and list(again.stand_in.workloads) == ["l4"]


def test_a_hand_written_stand_in_section_is_not_overwritten(tmp_path: Path) -> None:
    profile = tmp_path / "stand.yaml"
    text = (REPO / "models" / "tiny-bench.yaml").read_text(encoding="utf-8")
    profile.write_text(text + "stand_in:\n  target: x\n  workloads: {}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not the generated block"):
        write_stand_in(profile, stand_in_spec("x", {"targets": {}}, "now"))


def _measured(ratios: dict[str, float], within: dict[str, bool]) -> Any:
    from visioncap.bench.standin.fidelity import FidelityProbe, FidelityResult

    target = FidelityTarget(0.93, 1.94, 1.10, "test")
    probe = FidelityProbe(frame_width=224, frame_height=168, chat_prompt_tokens=475, frame_filler_words=688)
    measured = {name: getattr(target, name) * ratio for name, ratio in ratios.items()}
    return FidelityResult(
        target=target,
        probe=probe,
        step_ms=3.3,
        frame_prompt_tokens=796,  # 48 image tokens, 688 filler, 60 of caption text and template
        chat_prompt_tokens=475,
        measured=measured,
        ratio=ratios,  # type: ignore[arg-type]
        within=within,
        tolerance=0.25,
        faithful=all(within.values()),
    )


def test_refit_resizes_only_the_figures_that_missed_and_keeps_the_caption_text() -> None:
    from visioncap.bench.standin.sizing import refit

    # The committed run of 2026-12-02 13:41: encoder 1.48x, frame prefill 1.29x, chat 1.03x.
    ratios = {"frame_encoder_steps": 1.48, "frame_prefill_steps": 1.29, "chat_prefill_steps": 1.03}
    resized = refit(
        _measured(ratios, {"frame_encoder_steps": False, "frame_prefill_steps": False, "chat_prefill_steps": True})
    )
    assert resized.changed == ("frame_encoder_steps", "frame_prefill_steps")
    tokens = image_tokens(resized.frame_width, resized.frame_height)
    assert abs(tokens - 48 / 1.48) <= 5 and tokens < 48  # a smaller image for a dearer encoder
    assert 1.1 < resized.frame_width / resized.frame_height < 1.6
    # The frame prompt shrinks by the prefill's miss; the caption text's 60 tokens stay, the filler gives way.
    assert resized.frame_filler_words == round(796 / 1.29) - tokens - 60
    assert resized.chat_scale == 1.0

    # Only the encoder off: the frame prompt keeps its length, the filler takes up the smaller image.
    only = refit(
        _measured(
            {**ratios, "frame_prefill_steps": 1.1},
            {"frame_encoder_steps": False, "frame_prefill_steps": True, "chat_prefill_steps": True},
        )
    )
    assert only.changed == ("frame_encoder_steps",)
    assert only.frame_filler_words + image_tokens(only.frame_width, only.frame_height) + 60 == 796

    # A cheap chat prompt gets longer; a figure measured at or below zero is noise and keeps its size.
    noisy = refit(
        _measured(
            {"frame_encoder_steps": -0.2, "frame_prefill_steps": 1.0, "chat_prefill_steps": 0.5},
            {"frame_encoder_steps": False, "frame_prefill_steps": True, "chat_prefill_steps": False},
        )
    )
    assert noisy.changed == ("chat_prefill_steps",) and noisy.chat_scale == pytest.approx(2.0)
    assert (noisy.frame_width, noisy.frame_height, noisy.frame_filler_words) == (224, 168, 688)


def test_next_size_follows_the_line_through_two_measurements_and_falls_back_to_proportion() -> None:
    from visioncap.bench.standin.sizing import next_size

    # The run of 2026-12-02 21:00: chat prompts of 475 tokens cost 1.71 steps, cut to 305 they cost 0.81 (target
    # 1.10): the line through both (0.0053 a token, zero at 150 tokens) asks for 360 tokens, proportion for 414.
    assert next_size(305, 0.81, 1.10, [(475, 1.71)]) == 360
    assert next_size(305, 0.81, 1.10, []) == 414
    assert next_size(305, 0.81, 1.10, [(305, 0.9)]) == 414  # no earlier point at another size
    assert next_size(305, 0.81, 1.10, [(475, 0.5)]) == 414  # cost falling with size: noise
    assert next_size(305, 0.81, 1.10, [(302, 0.809)]) == 414  # the secant lands beyond twice the size
    assert next_size(305, 0.81, 1.10, [(475, 1.71), (305, 0.9)]) == 360  # the latest at another size counts
