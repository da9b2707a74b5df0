"""Cameras per worker on this CPU: one `visioncap worker` with N live cameras, measured from outside.

- analysed fps per camera: the worker's own `visioncap_frames_analysed_total{camera}` (its /metrics), the
  difference over the measured window divided by the window;
- first-caption delay: from the wall time the camera server wrote the first frame with people after a stretch of
  nobody, to the first caption row of that camera whose frame was captured within the people stretch: `selected`
  is that row's `created_at` (the outbox row, before the VLM), `captioned` its `updated_at` once its status is
  `captioned` (the stored caption). Arrivals with no such row by the end are counted as missed;
- CPU per camera: the worker process's CPU seconds (user + system, psutil) over the window / window / cameras.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import Engine, text

from visioncap.bench.common.pgcluster import PostgresCluster
from visioncap.bench.common.stats import percentile
from visioncap.bench.fleet.parts import CameraFeeds, start_worker, wait_until, workers_stopped, write_pipeline
from visioncap.store import CaptionStore, create_db_engine

log = logging.getLogger(__name__)

WARMUP_TIMEOUT_S = 180.0  # a bound on a broken run (the detector loading on a busy 2-core machine), not a figure


def _caption_rows(engine: Engine) -> list[tuple[str, datetime, datetime, str, datetime]]:
    with engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(text("SELECT camera, captured_at, created_at, status, updated_at FROM captions"))
        ]


def _stamp(value: datetime) -> float:
    return value.timestamp()


def first_caption_delays(
    arrivals: dict[str, list[float]], rows: list[tuple[str, datetime, datetime, str, datetime]], people_s: float,
    window: tuple[float, float],
) -> dict[str, Any]:  # fmt: skip
    """Per arrival inside `window` (wall clock): the delay to its first selected and first captioned row."""
    selected, captioned, missed = [], [], 0
    for camera, times in arrivals.items():
        mine = sorted((r for r in rows if r[0] == camera), key=lambda r: _stamp(r[1]))
        for arrived in times:
            if not window[0] <= arrived <= window[1]:
                continue
            # A frame read a little before the server's stamp cannot show people; one up to a stretch later can.
            inside = [r for r in mine if arrived - 0.2 <= _stamp(r[1]) <= arrived + people_s + 0.5]
            if not inside:
                missed += 1
                continue
            selected.append(_stamp(inside[0][2]) - arrived)
            done = [_stamp(r[4]) - arrived for r in inside if r[3] == "captioned"]
            if done:
                captioned.append(min(done))
    return {
        "arrivals": len(selected) + missed,
        "missed": missed,
        "selected_s": {"p50": percentile(selected, 50), "p95": percentile(selected, 95), "n": len(selected)},
        "captioned_s": {"p50": percentile(captioned, 50), "p95": percentile(captioned, 95), "n": len(captioned)},
    }


def measure_point(
    pg: PostgresCluster, vlm_base_url: str, work: Path, cameras: int, duration_s: float, warmup_s: float,
    drain_s: float, analyze_fps: float, max_tokens: int,
) -> dict[str, Any]:  # fmt: skip
    """One worker with `cameras` cameras (capacity = cameras) for `duration_s` after everything runs."""
    folder = work / f"capacity-{cameras}"
    folder.mkdir(parents=True, exist_ok=True)
    database = pg.new_database("fleet")
    url = pg.url_for(database)
    engine = create_db_engine(url)
    CaptionStore(engine).create_schema()
    with CameraFeeds(cameras) as feeds:
        names = [feeds.camera(i) for i in range(cameras)]
        pipeline = write_pipeline(folder, [(n, feeds.url(i)) for i, n in enumerate(names)], analyze_fps, max_tokens)
        env = {"VISIONCAP_DATABASE_URL": url, "VISIONCAP_VLM_BASE_URL": vlm_base_url,
               "VISIONCAP_DATA_DIR": str(folder / "data")}  # fmt: skip
        worker = start_worker(pipeline, env, folder / "worker.log", capacity=cameras, lease_s=15.0, renew_s=3.0)
        with workers_stopped([worker]):
            wait_until(lambda: all(worker.frames(n) > 0 for n in names), WARMUP_TIMEOUT_S, "every camera analysed",
                       poll_s=0.5)  # fmt: skip
            time.sleep(warmup_s)
            process = psutil.Process(worker.pid)
            cpu0, t0, wall0 = process.cpu_times(), time.monotonic(), time.time()
            frames0 = {n: worker.frames(n) for n in names}
            time.sleep(duration_s)
            cpu1, t1, wall1 = process.cpu_times(), time.monotonic(), time.time()
            frames1 = {n: worker.frames(n) for n in names}
            # Arrivals late in the window get time to be captioned; only those inside it are counted.
            time.sleep(drain_s)
            rows = _caption_rows(engine)
    engine.dispose()
    window = t1 - t0
    fps = [(frames1[n] - frames0[n]) / window for n in names]
    cpu_s = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    delays = first_caption_delays(feeds.arrivals, rows, feeds.people_s, (wall0, wall1))
    in_window = [r for r in rows if wall0 <= _stamp(r[2]) <= wall1]
    return {
        "cameras": cameras,
        "window_s": round(window, 2),
        "analysed_fps_per_camera": {"mean": sum(fps) / len(fps), "min": min(fps), "max": max(fps)},
        "offered_fps_per_camera": analyze_fps,
        "cpu_s": round(cpu_s, 2),
        "cpu_per_camera": cpu_s / window / cameras,
        "worker_cpu_share": cpu_s / window,
        "captions_selected_per_camera_s": len(in_window) / window / cameras,
        "first_caption": delays,
    }
