"""End to end on real parts: demo video -> YOLO -> real vLLM (tiny Qwen2-VL) -> SQLite, through the CLI."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import cv2
import pytest
from helpers import TINY_MODEL, pipeline_dict, run_cli, scrape_metric, write_pipeline

from visioncap.demo_video import FPS, Segment
from visioncap.serve import VllmServer
from visioncap.store import CaptionRecord, CaptionStore, create_db_engine

DemoVideo = tuple[Path, tuple[Segment, ...]]


@dataclass(frozen=True)
class DemoRunResult:
    result: subprocess.CompletedProcess[str]
    rows: list[CaptionRecord]
    vllm_delta: dict[str, float]
    pipeline: Path
    env: dict[str, str]


DemoRun = DemoRunResult


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer, demo_video: DemoVideo) -> DemoRun:
    video, _segments = demo_video
    workdir = tmp_path_factory.mktemp("demo-run")
    pipeline = write_pipeline(workdir, pipeline_dict(video))
    env = {
        "VISIONCAP_DATABASE_URL": f"sqlite:///{workdir / 'captions.db'}",
        "VISIONCAP_DATA_DIR": str(workdir / "data"),
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
    }
    metrics = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")
    before = {name: scrape_metric(vllm_server.root_url, name) for name in metrics}
    result = run_cli("run", str(pipeline), "--progress", "log", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    after = {name: scrape_metric(vllm_server.root_url, name) for name in metrics}
    rows = CaptionStore(create_db_engine(env["VISIONCAP_DATABASE_URL"])).list(limit=1000)
    return DemoRunResult(result, rows, {name: after[name] - before[name] for name in metrics}, pipeline, env)


def segment_of(row: CaptionRecord, segments: tuple[Segment, ...]) -> Segment:
    return next(s for s in segments if s.start <= row.frame_index < s.end)


def summary_counts(stdout: str) -> dict[str, int]:
    match = re.search(
        r"^test: (\d+) frames, (\d+) analysed, (\d+) person frames, (\d+) events, (\d+) captions, (\d+) skipped, "
        r"(\d+) pending, (\d+) errors",
        stdout,
        re.M,
    )
    assert match, stdout
    keys = ("frames", "analysed", "person_frames", "events", "captions", "skipped", "pending", "errors")
    return dict(zip(keys, map(int, match.groups()), strict=True))


def test_captions_for_every_stretch_with_people_and_none_without(demo_run: DemoRun, demo_video: DemoVideo) -> None:
    _video, segments = demo_video
    rows = demo_run.rows
    assert rows, "no captions stored"
    for row in rows:
        assert segment_of(row, segments).has_people, f"caption for frame {row.frame_index} in an empty stretch"
    for segment in (s for s in segments if s.has_people):
        in_segment = [r for r in rows if segment_of(r, segments) == segment]
        assert in_segment, f"no caption for the people at frames {segment.start}-{segment.end}"
        assert in_segment[-1].reason == "new-event"  # the oldest row of the stretch opened its event


def test_every_event_is_in_a_caption(demo_run: DemoRun) -> None:
    counts = summary_counts(demo_run.result.stdout)
    covered = {(r.event_key, tuple(r.event_ids)) for r in demo_run.rows}
    ids = {i for r in demo_run.rows for i in r.event_ids}
    assert counts["events"] >= 2 and len(ids) >= counts["events"], (counts, covered)
    # Captions are far fewer than the frames with people: one per event, not one per frame.
    assert counts["captions"] <= counts["events"] < counts["person_frames"]


def test_rows_hold_boxes_tokens_images_and_latency(demo_run: DemoRun) -> None:
    data_dir = Path(demo_run.env["VISIONCAP_DATA_DIR"])
    text_tokens = set()
    for row in demo_run.rows:
        assert row.status == "captioned" and row.error is None and row.attempts == 1
        assert row.camera == "cam-1" and row.model == TINY_MODEL
        assert row.caption, "empty caption"
        assert row.people_count == len(row.people) >= 1
        for box in row.people:
            assert 0 <= box["x1"] < box["x2"] <= 640 and 0 <= box["y1"] < box["y2"] <= 480
            assert 0.35 <= box["confidence"] <= 1 and box["class_id"] in (0, 1)
            assert box["track_id"] in row.event_ids
        assert 200 < row.image_tokens <= 256
        assert row.prompt_tokens is not None and row.prompt_tokens > row.image_tokens
        text_tokens.add(row.prompt_tokens - row.image_tokens)
        assert row.completion_tokens == 8  # max_tokens with ignore_eos
        assert row.latency_ms is not None and row.latency_ms > 0
        assert abs(row.offset_s - row.frame_index / FPS) < 1e-6
        image = cv2.imread(str(data_dir / row.image_path))
        assert image is not None and image.shape[:2] == (row.image_height, row.image_width)
    # The same prompt around every image: if the image-token estimate were off, this would vary.
    assert len(text_tokens) == 1, text_tokens


def test_requests_really_reached_vllm(demo_run: DemoRun) -> None:
    rows, delta = demo_run.rows, demo_run.vllm_delta
    assert delta["vllm:request_success_total"] == len(rows)
    assert delta["vllm:prompt_tokens_total"] == sum(r.prompt_tokens or 0 for r in rows)
    assert delta["vllm:generation_tokens_total"] == sum(r.completion_tokens or 0 for r in rows)


def test_summary_line(demo_run: DemoRun, demo_video: DemoVideo) -> None:
    _video, segments = demo_video
    counts = summary_counts(demo_run.result.stdout)
    total = segments[-1].end
    assert (counts["frames"], counts["analysed"]) == (total, total // 2)
    assert (counts["captions"], counts["skipped"], counts["pending"], counts["errors"]) == (len(demo_run.rows), 0, 0, 0)
    people_frames = sum(s.end - s.start for s in segments if s.has_people)
    assert people_frames // 2 - 4 <= counts["person_frames"] <= people_frames // 2


def test_a_rerun_over_the_same_file_stores_nothing_twice(demo_run: DemoRun, vllm_server: VllmServer) -> None:
    before = scrape_metric(vllm_server.root_url, "vllm:request_success_total")
    again = run_cli("run", str(demo_run.pipeline), "--progress", "none", env=demo_run.env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert summary_counts(again.stdout)["captions"] == 0
    store = CaptionStore(create_db_engine(demo_run.env["VISIONCAP_DATABASE_URL"]))
    assert store.count() == len(demo_run.rows)
    assert scrape_metric(vllm_server.root_url, "vllm:request_success_total") == before


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
