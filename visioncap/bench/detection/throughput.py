"""Detector throughput of the pipeline against plain `YOLO.predict`, as a ratio, for PyTorch and ONNX weights.

"Pipeline": frames of a real `VideoFileSource` through the real `FrameHub` (one reader thread per camera), then
`PersonDetector.detect` on each batch, `PersonTracker.update` and `EventSelector.offer` per camera, and the
JPEG encoding of selected frames, as `PipelineRunner.run` does (no VLM, no outbox). "Plain": a loop of
`YOLO(weights).predict(frame, imgsz, conf, classes)` over the same frames, decoded beforehand. Both use the same
weights and settings, are warmed up, and run alternately (ABBA) several times in one process; the ratio is taken
per repetition and its median reported, so the machine's noise hits both sides alike.

Two cameras: both clips through one hub, so each `detect` gets up to two frames (one predict call), against two
sequential plain predicts per step.

Run: `.venv/bin/python -m visioncap.bench.detection.throughput [--quick]`
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from visioncap.bench.common.outputs import command_line, machine_line, write_results
from visioncap.bench.common.stats import percentile
from visioncap.bench.detection.scenes import DATA_DIR, Scene
from visioncap.bench.detection.shared import WEIGHTS, detector_config, detector_machine_facts
from visioncap.caption.encode import compose, encode_jpeg
from visioncap.config.caption import CaptionConfig
from visioncap.config.detector import DetectorConfig
from visioncap.config.selection import SelectionConfig
from visioncap.config.sources import FileSourceConfig
from visioncap.detect.tracking import PersonTracker
from visioncap.detect.weights import resolve_weights
from visioncap.detect.yolo import PersonDetector
from visioncap.frames import Frame
from visioncap.pipeline.hub import FrameHub
from visioncap.select.events import EventSelector
from visioncap.sources.registry import open_source

GOAL = 0.95
# Clips start inside the scene's two long events, so every frame has people for the tracker and selector.
CLIP_STARTS = (260, 1150)


def make_clips(scene: Scene, frames: int) -> list[Path]:
    folder = DATA_DIR / "clips"
    # Clips of earlier scene definitions are stale.
    for old in folder.glob("*.mp4") if folder.is_dir() else []:
        if not old.name.startswith(scene.spec_hash()):
            old.unlink()
    paths = []
    for number, start in enumerate(CLIP_STARTS):
        path = folder / f"{scene.spec_hash()}-cam{number}-{start}-{frames}.mp4"
        if not path.is_file():
            scene.write(path, start, start + frames)
        paths.append(path)
    return paths


def decode(path: Path) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    images = []
    try:
        while True:
            ok, image = capture.read()
            if not ok:
                break
            images.append(image)
    finally:
        capture.release()
    return images


def export_onnx(image_size: int) -> tuple[Path, dict[str, Any]]:
    """The packaged .pt exported to ONNX at the benchmark's image size, into data/ (Ultralytics writes the export
    beside its input, so the .pt is copied there first rather than exporting inside site-packages)."""
    from ultralytics.models import YOLO

    folder = DATA_DIR / "models"
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(resolve_weights(WEIGHTS))
    pt = folder / f"fall-best-{image_size}.pt"
    onnx = pt.with_suffix(".onnx")
    simplify = importlib.util.find_spec("onnxslim") is not None
    info: dict[str, Any] = {"file": str(onnx.relative_to(DATA_DIR.parent.parent)), "simplify": simplify}
    if onnx.is_file() and onnx.stat().st_mtime >= source.stat().st_mtime:
        info.update(reused=True, bytes=onnx.stat().st_size)
        return onnx, info
    shutil.copy2(source, pt)
    started = time.perf_counter()
    exported = YOLO(str(pt), task="detect").export(
        format="onnx", imgsz=image_size, simplify=simplify, dynamic=False, device="cpu", verbose=False
    )
    info.update(reused=False, export_s=round(time.perf_counter() - started, 2), bytes=Path(exported).stat().st_size)
    return Path(exported), info


@dataclass
class Trial:
    frames: int
    seconds: float
    cpu_s: float
    startup_s: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    batches: Counter[int] = field(default_factory=Counter)
    selected: int = 0

    @property
    def fps(self) -> float:
        return self.frames / self.seconds


class Pipeline:
    """The runner's hot loop for some cameras, with one shared detector (as one process has)."""

    def __init__(self, config: DetectorConfig) -> None:
        self.config = config
        self.detector = PersonDetector(config)
        self.selection = SelectionConfig()
        self.caption = CaptionConfig()

    def warm_up(self, image: np.ndarray, batch: int) -> None:
        for _ in range(3):
            self.detector.detect([Frame("warm", i, 0.0, image) for i in range(batch)])

    def run(self, clips: Sequence[Path]) -> Trial:
        sources = [open_source(FileSourceConfig(camera=f"cam{i}", path=p)) for i, p in enumerate(clips)]
        # Built as PipelineRunner.__init__ builds them, and like there outside the timed loop.
        trackers = {
            s.camera: PersonTracker(self.config.tracker, s.analyse_rate(), keep_lost_s=self.selection.event_end_s)
            for s in sources
        }
        selectors = {s.camera: EventSelector(self.selection) for s in sources}
        # Counted as the loop goes; the times are set at the end.
        trial = Trial(0, 0.0, 0.0, stages=dict.fromkeys(("wait", "detect", "track", "select", "encode"), 0.0))
        errors: list[str] = []

        def finished(camera: str, error: str | None) -> None:
            if error:
                errors.append(error)

        started = time.perf_counter()
        cpu_started = time.process_time()
        hub = FrameHub(sources, on_finished=finished)
        hub.start()
        try:
            first, cpu_first = self._drain(hub, trackers, selectors, trial, cpu_started)
        finally:
            hub.stop()
            hub.join(timeout=10)
        for selector in selectors.values():
            for picked in selector.flush():
                self._encode(picked)
                trial.selected += 1
        ended = time.perf_counter()
        cpu_s = time.process_time() - cpu_first
        if errors:
            raise RuntimeError("; ".join(errors))
        first = started if first is None else first
        trial.seconds, trial.cpu_s, trial.startup_s = ended - first, cpu_s, first - started
        return trial

    def _drain(
        self,
        hub: FrameHub,
        trackers: dict[str, PersonTracker],
        selectors: dict[str, EventSelector],
        trial: Trial,
        cpu_first: float,
    ) -> tuple[float | None, float]:
        """Every batch the hub gives until its cameras are finished, detected, tracked, selected and encoded,
        each stage's time added up in `trial`; when the first frame came, and the process's CPU time then
        (`cpu_first` if none came)."""
        stages = trial.stages
        first: float | None = None
        while True:
            t0 = time.perf_counter()
            batch = hub.next_batch(timeout=0.5)
            t1 = time.perf_counter()
            if first is None and batch:
                # Steady state starts with the first frame: opening the file and decoding its first frame is
                # a once-per-camera cost that plain, with frames decoded beforehand, does not have either.
                first, cpu_first = t1, time.process_time()
            else:
                stages["wait"] += t1 - t0
            if not batch:
                if hub.finished:
                    return first, cpu_first
                continue
            trial.batches[len(batch)] += 1
            detections = self.detector.detect(batch)
            t2 = time.perf_counter()
            stages["detect"] += t2 - t1
            for detection in detections:
                camera = detection.frame.camera
                t3 = time.perf_counter()
                tracked = trackers[camera].update(detection)
                t4 = time.perf_counter()
                picks = selectors[camera].offer(tracked)
                t5 = time.perf_counter()
                for picked in picks:
                    self._encode(picked)
                stages["track"] += t4 - t3
                stages["select"] += t5 - t4
                stages["encode"] += time.perf_counter() - t5
                trial.frames += 1
                trial.selected += len(picks)

    def _encode(self, picked: Any) -> None:
        picture = compose(picked.detection.frame.image, picked.detection.people, self.caption.image_mode)
        encode_jpeg(picture, self.caption.max_image_tokens, 28, self.caption.jpeg_quality)


class Plain:
    """The baseline: Ultralytics' own predict, one frame per call, frames already decoded."""

    def __init__(self, weights: str, config: DetectorConfig) -> None:
        from ultralytics.models import YOLO

        self.model = YOLO(weights, task="detect")
        self.config = config

    def predict(self, image: np.ndarray) -> Any:
        c = self.config
        return self.model.predict(image, imgsz=c.image_size, conf=c.confidence, classes=c.person_classes, verbose=False)

    def warm_up(self, image: np.ndarray) -> None:
        for _ in range(3):
            self.predict(image)

    def run(self, cameras: Sequence[Sequence[np.ndarray]]) -> Trial:
        started = time.perf_counter()
        cpu_started = time.process_time()
        frames = 0
        for step in zip(*cameras, strict=True):
            for image in step:
                self.predict(image)
                frames += 1
        return Trial(frames=frames, seconds=time.perf_counter() - started, cpu_s=time.process_time() - cpu_started)

    def run_decoding(self, clips: Sequence[Path]) -> Trial:
        """The naive loop a pipeline has to beat: read a frame, predict, read the next (nothing overlapped)."""
        captures = [cv2.VideoCapture(str(p)) for p in clips]
        frames = 0
        try:
            # Timed from the first decoded frames on, as the pipeline is (opening a file is a once-per-camera cost).
            step = [c.read() for c in captures]
            started = time.perf_counter()
            cpu_started = time.process_time()
            while all(ok for ok, _ in step):
                for _, image in step:
                    self.predict(image)
                    frames += 1
                step = [c.read() for c in captures]
            seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
        finally:
            for capture in captures:
                capture.release()
        return Trial(frames=frames, seconds=seconds, cpu_s=cpu_s)


def _ratio_stats(values: Sequence[float]) -> dict[str, Any]:
    return {
        "median": round(percentile(values, 50) or 0.0, 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "all": [round(v, 3) for v in values],
    }


def compare(
    pipeline: Pipeline, plain: Plain, clips: Sequence[Path], decoded: Sequence[Sequence[np.ndarray]], repeats: int
) -> dict[str, Any]:
    runners = {
        "pipeline": lambda: pipeline.run(clips),
        "plain": lambda: plain.run(decoded),
        "plain+decode": lambda: plain.run_decoding(clips),
    }
    rows: list[dict[str, Trial]] = []
    for rep in range(repeats):
        # Forward, then backward (ABC CBA ...): no variant always runs first or last, so drifts in machine load
        # and cache warmth do not favour one.
        order = list(runners) if rep % 2 == 0 else list(runners)[::-1]
        rows.append({name: runners[name]() for name in order})
    if any(len({t.frames for t in row.values()}) != 1 for row in rows):
        raise RuntimeError(f"frame counts differ: {[{k: t.frames for k, t in row.items()} for row in rows]}")
    ratios = [row["pipeline"].fps / row["plain"].fps for row in rows]
    # CPU seconds of the whole process (all threads) per frame, plain / pipeline: what the pipeline's extra work
    # (decoding, tracking, selection) costs in CPU, which wall time hides while a core is idle, and which other
    # processes on the machine disturb less than wall time.
    cpu_ratios = [row["plain"].cpu_s / row["pipeline"].cpu_s for row in rows]
    frames = sum(row["pipeline"].frames for row in rows)

    def ms(name: str, attr: str = "seconds") -> float:
        return round(1000 * float(sum(getattr(row[name], attr) for row in rows)) / frames, 2)

    piped = [row["pipeline"] for row in rows]
    stage_ms = {k: round(1000 * sum(p.stages[k] for p in piped) / frames, 2) for k in piped[0].stages}
    batches: Counter[int] = Counter()
    for p in piped:
        batches.update(p.batches)
    return {
        "cameras": len(clips),
        "frames_per_trial": piped[0].frames,
        "repeats": repeats,
        "ratio": _ratio_stats(ratios),
        "ratio_vs_plain_decode": _ratio_stats([row["pipeline"].fps / row["plain+decode"].fps for row in rows]),
        "cpu_ratio": _ratio_stats(cpu_ratios),
        "fps_median": {name: round(percentile([row[name].fps for row in rows], 50) or 0.0, 2) for name in runners},
        "ms_per_frame": {name: ms(name) for name in runners},
        "cpu_ms_per_frame": {name: ms(name, "cpu_s") for name in runners},
        "pipeline_startup_ms_median": round(1000 * (percentile([p.startup_s for p in piped], 50) or 0.0), 1),
        # Per analysed frame, summed over all pipeline trials; "wait" is time blocked on the hub (decoding).
        "pipeline_ms_per_frame": stage_ms,
        "pipeline_batch_sizes": {str(k): v for k, v in sorted(batches.items())},
        "selected_per_trial": piped[0].selected,
        "meets_goal": (percentile(ratios, 50) or 0.0) >= GOAL,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Short trials, many of them: on a shared machine the load swings within seconds, and only trials run close
    # together in time compare fairly.
    frames = args.frames or (8 if args.quick else 10)
    repeats = args.repeats or (3 if args.quick else 10)
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]

    facts = detector_machine_facts()
    scene = Scene()
    clips = make_clips(scene, frames)
    decoded = [decode(p) for p in clips]
    if any(len(d) != frames for d in decoded):
        raise RuntimeError(f"clips decoded to {[len(d) for d in decoded]} frames, expected {frames}")
    results: dict[str, Any] = {
        "benchmark": "detector_throughput",
        "command": command_line("visioncap.bench.detection.throughput", argv if argv is not None else sys.argv[1:]),
        "machine": facts,
        "goal": f"pipeline fps / plain fps >= {GOAL}",
        "image_size": args.image_size,
        "weights": WEIGHTS,
        "frame_size": [scene.width, scene.height],
        "clips": [str(p.relative_to(DATA_DIR.parent.parent)) for p in clips],
        "runs": {},
    }
    for fmt in formats:
        _compare_format(fmt, args, clips, decoded, frames, repeats, results)
    write_results("detector_throughput" + (f"-{args.tag}" if args.tag else ""), results, _markdown)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few frames and repeats: a smoke run of ~1 minute")
    parser.add_argument("--image-size", type=int, default=320, help="detector image size (default 320, the demo's)")
    parser.add_argument("--formats", default="pt,onnx", help="comma-separated: pt, onnx")
    parser.add_argument("--frames", type=int, help="frames per camera per trial")
    parser.add_argument("--repeats", type=int, help="trials per variant (alternating)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        help="torch threads after the models are loaded (Ultralytics sets cpu_count - 1: 1 on 2 cores)",
    )
    parser.add_argument("--tag", help="write results/detector_throughput-TAG.* instead of the default files")
    return parser


def _compare_format(
    fmt: str,
    args: argparse.Namespace,
    clips: list[Path],
    decoded: list[list[np.ndarray]],
    frames: int,
    repeats: int,
    results: dict[str, Any],
) -> None:
    """The pipeline against plain predict with the weights in `fmt`, on one camera and on two; into `results`."""
    if fmt == "pt":
        weights = resolve_weights(WEIGHTS)
    elif fmt == "onnx":
        onnx, results["onnx_export"] = export_onnx(args.image_size)
        weights = str(onnx)
    else:
        raise SystemExit(f"unknown format {fmt!r}")
    config = detector_config(image_size=args.image_size, weights=weights)
    pipeline, plain = Pipeline(config), Plain(weights, config)
    pipeline.warm_up(decoded[0][0], 1)
    pipeline.warm_up(decoded[0][0], 2)
    plain.warm_up(decoded[0][0])
    # Ultralytics sets torch's thread count when it sets up a predictor, so change or read it only now. Imported here:
    # torch takes seconds to import, and every module is imported by a test of what imports register.
    import torch

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    results["machine"]["torch_threads"] = torch.get_num_threads()
    for cameras in (1, 2):
        key = f"{fmt}-{cameras}cam"
        print(f"{key}: {repeats} x {frames * cameras} frames per side ...", flush=True)
        run = compare(pipeline, plain, clips[:cameras], decoded[:cameras], repeats)
        results["runs"][key] = run
        ratio, fps = run["ratio"], run["fps_median"]
        print(
            f"  ratio {ratio['median']:.3f} (min {ratio['min']:.3f}, max {ratio['max']:.3f}), vs plain+decode "
            f"{run['ratio_vs_plain_decode']['median']:.3f}, CPU {run['cpu_ratio']['median']:.3f}; fps: "
            + ", ".join(f"{k} {v:.2f}" for k, v in fps.items()),
            flush=True,
        )


def _markdown(r: dict[str, Any]) -> str:
    m = r["machine"]
    lines = [
        "# Detector throughput: pipeline vs plain `YOLO.predict`",
        "",
        f"Command: `{r['command']}`",
        "",
        machine_line(
            m,
            f"Python {m['python']}, torch {m['torch']} (threads: {m['torch_threads']}), ultralytics "
            f"{m['ultralytics']}, onnxruntime {m['onnxruntime']}",
        ),
        "",
        f"Weights `{r['weights']}` (and its ONNX export), image size {r['image_size']}, "
        f"{r['frame_size'][0]}x{r['frame_size'][1]} frames from `bench/detection/scenes.py` (people in every frame). "
        f"Goal: {r['goal']}. Ratio = median over alternating repetitions of (pipeline fps / plain fps).",
        "",
        "| variant | frames x repeats | **ratio** median (min-max) | vs plain+decode | CPU ratio | fps: pipeline / "
        "plain / plain+decode | ms/frame: pipeline / plain / plain+decode | pipeline ms/frame: wait / detect / "
        "track / select / encode | batch sizes | startup ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, run in r["runs"].items():
        ratio, st, fps, ms = run["ratio"], run["pipeline_ms_per_frame"], run["fps_median"], run["ms_per_frame"]
        lines.append(
            f"| {key} | {run['frames_per_trial']} x {run['repeats']} | **{ratio['median']:.3f}** "
            f"({ratio['min']:.3f}-{ratio['max']:.3f}) {'meets goal' if run['meets_goal'] else 'below goal'} "
            f"| {run['ratio_vs_plain_decode']['median']:.3f} | {run['cpu_ratio']['median']:.3f} "
            f"| {fps['pipeline']:.2f} / {fps['plain']:.2f} / {fps['plain+decode']:.2f} "
            f"| {ms['pipeline']} / {ms['plain']} / {ms['plain+decode']} "
            f"| {st['wait']} / {st['detect']} / {st['track']} / {st['select']} / {st['encode']} "
            f"| {run['pipeline_batch_sizes']} | {run['pipeline_startup_ms_median']} |"
        )
    if "onnx_export" in r:
        e = r["onnx_export"]
        lines += [
            "",
            f"ONNX: `{e['file']}` ({e['bytes'] / 1e6:.1f} MB, static batch 1, {r['image_size']}x{r['image_size']} "
            f"input, onnxslim simplify: {e['simplify']}"
            + (f", exported in {e['export_s']} s" if "export_s" in e else ", reused")
            + ").",
        ]
    lines += [
        "",
        "Absolute fps depend on a shared, noisy 2-core machine; compare ratios only. The 2-camera rows compare one "
        "batched predict per hub batch with two sequential plain predicts. plain+decode = plain predicts on frames "
        "read from the clip in the same loop (nothing overlapped): the naive alternative to the hub. "
        "Pipeline time runs from the first frame "
        "out of the hub to the selector's flush; opening the sources and decoding their first frame is the "
        "startup column (once per camera, not per frame). CPU ratio = plain CPU s/frame / pipeline CPU s/frame, "
        "whole process (decoding in the reader threads included); below 1 means the pipeline burns more CPU "
        "per frame even where wall time hides it.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
