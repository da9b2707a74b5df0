"""End to end on real parts: demo video -> YOLO -> real vLLM (tiny Qwen2-VL) -> SQLite, through the CLI."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from helpers import TINY_MODEL, pipeline_dict, run_cli, scrape_metric, write_pipeline

from visioncap.demo_video import FPS, Segment
from visioncap.serve import VllmServer
from visioncap.store import CaptionRecord, CaptionStore, create_db_engine

DemoVideo = tuple[Path, tuple[Segment, ...]]
DemoRun = tuple[subprocess.CompletedProcess[str], list[CaptionRecord], dict[str, float]]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer, demo_video: DemoVideo) -> DemoRun:
    video, _segments = demo_video
    workdir = tmp_path_factory.mktemp("demo-run")
    pipeline = write_pipeline(workdir, pipeline_dict(video))
    database = f"sqlite:///{workdir / 'captions.db'}"
    metrics = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    before = {name: scrape_metric(vllm_server.root_url, name) for name in metrics}
    result = run_cli(
        "run",
        str(pipeline),
        env={"VISIONCAP_DATABASE_URL": database, "VISIONCAP_VLM_BASE_URL": vllm_server.base_url},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    after = {name: scrape_metric(vllm_server.root_url, name) for name in metrics}
    rows = CaptionStore(create_db_engine(database)).list(limit=1000)
    return result, rows, {name: after[name] - before[name] for name in metrics}


def segment_of(row: CaptionRecord, segments: tuple[Segment, ...]) -> Segment:
    return next(s for s in segments if s.start <= row.frame_index < s.end)


def test_captions_for_every_stretch_with_people_and_none_without(demo_run: DemoRun, demo_video: DemoVideo) -> None:
    _result, rows, _delta = demo_run
    _video, segments = demo_video
    assert rows, "no captions stored"
    for row in rows:
        assert segment_of(row, segments).has_people, f"caption for frame {row.frame_index} in an empty stretch"
    for segment in (s for s in segments if s.has_people):
        reasons = sorted((r.frame_index, r.reason) for r in rows if segment_of(r, segments) == segment)
        # analyze_fps 5 on 10 fps video, 2.5 s stretches, interval 2 s: the first person frame, then one more.
        assert [reason for _, reason in reasons] == ["run-start", "interval"], (segment, reasons)
        first_index = reasons[0][0]
        assert first_index - segment.start <= 2, "the run's first analysed person frame is captioned"


def test_rows_hold_boxes_tokens_and_latency(demo_run: DemoRun) -> None:
    _result, rows, _delta = demo_run
    for row in rows:
        assert row.status == "captioned" and row.error is None
        assert row.camera == "cam-1" and row.model == TINY_MODEL
        assert row.caption, "empty caption"
        assert row.people_count == len(row.people) >= 1
        for box in row.people:
            assert 0 <= box["x1"] < box["x2"] <= 640 and 0 <= box["y1"] < box["y2"] <= 480
            assert 0.35 <= box["confidence"] <= 1 and box["class_id"] in (0, 1)
        assert row.image_width * row.image_height <= 200704
        # A 640x480 frame fitted to 256 image tokens is far above the text prompt's length.
        assert row.prompt_tokens is not None and row.prompt_tokens > 200
        assert row.completion_tokens == 8  # max_tokens with ignore_eos
        assert row.latency_ms is not None and row.latency_ms > 0
        assert abs(row.offset_s - row.frame_index / FPS) < 1e-6


def test_requests_really_reached_vllm(demo_run: DemoRun) -> None:
    _result, rows, delta = demo_run
    assert delta["vllm:request_success_total"] == len(rows)
    assert delta["vllm:prompt_tokens_total"] == sum(r.prompt_tokens or 0 for r in rows)
    assert delta["vllm:generation_tokens_total"] == sum(r.completion_tokens or 0 for r in rows)


def test_summary_line(demo_run: DemoRun, demo_video: DemoVideo) -> None:
    result, rows, _delta = demo_run
    _video, segments = demo_video
    total = segments[-1].end
    match = re.search(
        r"^test: (\d+) frames, (\d+) analysed, (\d+) person frames, (\d+) captions, (\d+) errors", result.stdout, re.M
    )
    assert match, result.stdout
    frames, analysed, person_frames, captions, errors = map(int, match.groups())
    assert (frames, analysed, captions, errors) == (total, total // 2, len(rows), 0)
    people_frames = sum(s.end - s.start for s in segments if s.has_people)
    assert people_frames // 2 - 2 <= person_frames <= people_frames // 2


def test_production_weights_offline_give_a_clear_error(
    tmp_path: Path, vllm_server: VllmServer, demo_video: DemoVideo
) -> None:
    video, _ = demo_video
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, detector={"weights": "yolo26n.pt", "person_classes": [0]}))
    result = run_cli(
        "run",
        str(pipeline),
        env={
            "VISIONCAP_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}",
            "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        },
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "error: detector.weights: cannot load 'yolo26n.pt'" in result.stderr
    assert "point detector.weights at a local file" in result.stderr
    assert "Traceback" not in result.stderr
