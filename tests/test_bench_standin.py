"""Sizing the CPU stand-in from calibration points (pure arithmetic; the measuring is test_bench_fidelity's)."""

from __future__ import annotations

import pytest

from visioncap.bench.fidelity import FidelityTarget
from visioncap.bench.standin import CalibrationPoint, fit_line, frame_for_tokens, image_tokens, solve


def test_fit_line_recovers_a_line_and_refuses_one_size() -> None:
    assert fit_line([(0, 1.0), (10, 3.0), (20, 5.0)]) == pytest.approx((1.0, 0.2))
    with pytest.raises(ValueError):
        fit_line([(5, 1.0), (5, 2.0)])


def test_frames_are_sized_in_whole_tokens() -> None:
    assert image_tokens(640, 480) == 391  # 644x476 after the resize: 23 x 17
    width, height = frame_for_tokens(100)
    assert width % 28 == 0 and height % 28 == 0
    assert abs(image_tokens(width, height) - 100) <= 12 and 1.1 < width / height < 1.6


def test_solve_scales_frame_chat_and_budget_together() -> None:
    # A stand-in whose prefill costs 0.2 + 0.01 steps per token, its encoder 0.3 + 0.005 steps per image token.
    points = [
        CalibrationPoint(159, 99, 64, 0.3 + 0.005 * 99, 0.2 + 0.01 * 159, 0.2 + 0.01 * 64),
        CalibrationPoint(252, 192, 160, 0.3 + 0.005 * 192, 0.2 + 0.01 * 252, 0.2 + 0.01 * 160),
    ]
    target = FidelityTarget(0.93, 1.94, 1.10, "test")
    sizes = solve(target, target_frame_prompt_tokens=451, target_budget=512, points=points)
    assert sizes.chat_prompt_tokens == 90  # (1.10 - 0.2) / 0.01
    assert abs(sizes.frame_prompt_tokens - 174) <= 12  # (1.94 - 0.2) / 0.01, in whole image-token rows
    assert sizes.frame_prompt_tokens == sizes.image_tokens + 60  # the caption text is not scaled
    assert sizes.scale == pytest.approx(sizes.frame_prompt_tokens / 451)
    assert sizes.max_num_batched_tokens % 16 == 0 and sizes.max_num_batched_tokens >= 512 * sizes.scale
    assert sizes.predicted.frame_prefill_steps == pytest.approx(0.2 + 0.01 * sizes.frame_prompt_tokens)
    assert sizes.predicted.frame_encoder_steps == pytest.approx(0.3 + 0.005 * sizes.image_tokens)
