"""Takeover time: one camera, two `visioncap worker` processes of capacity 1; the one holding the camera's lease
is killed (`kill -9`) or cut off from the network (it runs in its own namespace, visioncap.bench.common.netns, and its
link is taken down), and the other takes the camera.

Measured from the fault (this process's monotonic clock, just after the kill returned or the link went down) to:
- `lease`: the `camera_leases` row names the standby as owner, unexpired (polled every 50 ms);
- `first_frame`: the standby's own `visioncap_frames_analysed_total{camera}` rises (its /metrics, polled with the
  lease; the standby never ran the camera before, so any frame is the new owner's).

Each fault comes at a random point of the owner's renewal cycle, as a real one would.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from visioncap.bench.common.netns import Host
from visioncap.bench.common.pgcluster import PostgresCluster
from visioncap.bench.common.stats import percentile
from visioncap.bench.fleet.parts import (
    CameraFeeds,
    Worker,
    has_heartbeat,
    owned_by,
    start_worker,
    wait_until,
    write_pipeline,
)
from visioncap.store import CaptionStore, create_db_engine

log = logging.getLogger(__name__)

CAMERA = "cam0"
START_TIMEOUT_S = 240.0  # a bound on a broken run (a worker loading its detector on a busy machine), not a figure


def _summary(trials: list[dict[str, float | None]], key: str) -> dict[str, float | int | None]:
    values = [t[key] for t in trials if t[key] is not None]
    return {"p50": percentile(values, 50), "max": max(values) if values else None, "n": len(values)}  # type: ignore[arg-type, type-var]


def _camera_started(log_file: Path, after: float) -> float | None:
    """Seconds from `after` (wall clock) to the new owner's log line saying it started the camera (the log's
    timestamps have millisecond resolution): what lies between the lease and the first frame is opening the stream."""
    for line in log_file.read_text(errors="replace").splitlines():
        if f"camera {CAMERA}: started" in line:
            stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if stamp >= after:
                return stamp - after
    return None


def _fault(trials: list[dict[str, float | None]]) -> dict[str, Any]:
    return {
        "trials": trials,
        **{name: _summary(trials, f"{name}_s") for name in ("lease", "camera_started", "first_frame")},
    }


class _Bench:
    def __init__(self, pg: PostgresCluster, work: Path, lease_s: float, renew_s: float, analyze_fps: float) -> None:
        self.pg, self.work, self.lease_s, self.renew_s = pg, work, lease_s, renew_s
        self.analyze_fps = analyze_fps
        self.started = 0
        self.rng = random.Random(15)

    def _database(self) -> tuple[str, Engine]:
        name = self.pg.new_database("fleet")
        engine = create_db_engine(self.pg.url_for(name))
        CaptionStore(engine).create_schema()
        return name, engine

    def _worker(self, pipeline: Path, env: dict[str, str], prefix: list[str] | None = None) -> Worker:
        self.started += 1
        return start_worker(
            pipeline, env, self.work / f"worker-{self.started}.log", capacity=1, lease_s=self.lease_s,
            renew_s=self.renew_s, prefix=prefix, metrics=prefix is None,
        )  # fmt: skip

    def _standby(self, pipeline: Path, env: dict[str, str], engine: Engine) -> Worker:
        """A second worker, ready to run a camera at once, returned somewhere in the owner's renewal cycle (not just
        after a renewal): the fault comes next."""
        standby = self._worker(pipeline, env)
        # Its /metrics answers once its detector has loaded: from then on it would run a camera at once.
        wait_until(lambda: has_heartbeat(engine, standby) and standby.serving(), START_TIMEOUT_S, "the standby", 0.5)
        time.sleep(self.rng.uniform(0.0, self.renew_s))
        return standby

    def _observe(self, engine: Engine, standby: Worker, fault_at: float) -> dict[str, float | None]:
        fault_wall = time.time() - (time.monotonic() - fault_at)
        timeout = self.lease_s * 3 + 30
        leased = wait_until(lambda: owned_by(engine, CAMERA, standby), timeout, "the standby to take the lease")
        try:
            framed = wait_until(lambda: standby.frames(CAMERA) > 0, 60.0, "the new owner's first frame", 0.05)
            first_frame: float | None = framed - fault_at
        except TimeoutError:
            first_frame = None
        started = _camera_started(standby.log, fault_wall)
        return {"lease_s": leased - fault_at, "camera_started_s": started, "first_frame_s": first_frame}

    def kill_trials(self, trials: int, vlm_base_url: str) -> list[dict[str, float | None]]:
        folder = self.work / "kill"
        folder.mkdir(parents=True, exist_ok=True)
        name, engine = self._database()
        results = []
        with CameraFeeds(1) as feeds:
            pipeline = write_pipeline(folder, [(CAMERA, feeds.url(0))], self.analyze_fps, max_tokens=8)
            env = {"VISIONCAP_DATABASE_URL": self.pg.url_for(name), "VISIONCAP_VLM_BASE_URL": vlm_base_url,
                   "VISIONCAP_DATA_DIR": str(folder / "data")}  # fmt: skip
            owner = self._worker(pipeline, env)
            standby: Worker | None = None
            try:
                wait_until(lambda: owner.frames(CAMERA) > 0, START_TIMEOUT_S, "the first owner's first frame", 0.5)
                for trial in range(trials):
                    standby = self._standby(pipeline, env, engine)
                    owner.kill()
                    fault_at = time.monotonic()
                    result = self._observe(engine, standby, fault_at)
                    log.info("kill trial %d: %s", trial + 1, result)
                    results.append(result)
                    owner, standby = standby, None
            finally:
                for worker in (owner, standby):
                    if worker is not None:
                        worker.stop()
        engine.dispose()
        return results

    def cut_trials(self, trials: int, vlm_base_url: str) -> list[dict[str, float | None]]:
        """The owner in its own namespace; after each cut it is joined again, the standby stopped cleanly (its
        lease goes back) so that the namespaced worker owns the camera again, and a fresh standby started."""
        folder = self.work / "cut"
        folder.mkdir(parents=True, exist_ok=True)
        name, engine = self._database()
        results = []
        with Host() as host, CameraFeeds(1, host="0.0.0.0") as feeds:
            # One camera URL for both workers: the pipeline file seeds the camera's config, and a second file with
            # another URL would change it under the first worker. The host's end of the link stays reachable from
            # this side while the link is down (checked), so the standby reads the camera there too.
            pipeline = write_pipeline(folder, [(CAMERA, feeds.url(0, host.gateway_ip))], self.analyze_fps, 8)
            env = {"VISIONCAP_DATABASE_URL": self.pg.url_for(name), "VISIONCAP_VLM_BASE_URL": vlm_base_url,
                   "VISIONCAP_DATA_DIR": str(folder / "data")}  # fmt: skip
            # The namespaced worker reaches PostgreSQL and vLLM (both listening on every address) at the host's
            # end of its link.
            remote_env = {**env, "VISIONCAP_DATABASE_URL": self.pg.url_for(name, host.gateway_ip),
                          "VISIONCAP_VLM_BASE_URL": vlm_base_url.replace("127.0.0.1", host.gateway_ip)}  # fmt: skip
            cut_off = self._worker(pipeline, remote_env, prefix=host.command([]))
            standby: Worker | None = None
            try:
                wait_until(lambda: owned_by(engine, CAMERA, cut_off), START_TIMEOUT_S, "the namespaced owner", 0.5)
                for trial in range(trials):
                    standby = self._standby(pipeline, env, engine)
                    host.cut()
                    fault_at = time.monotonic()
                    try:
                        result = self._observe(engine, standby, fault_at)
                    finally:
                        host.join()
                    log.info("cut trial %d: %s", trial + 1, result)
                    results.append(result)
                    standby.stop()
                    standby = None
                    if trial + 1 < trials:
                        back = time.monotonic()
                        wait_until(lambda: owned_by(engine, CAMERA, cut_off), self.lease_s * 4 + 60,
                                   "the rejoined worker to own the camera again", 0.2)  # fmt: skip
                        log.info("rejoined worker owns the camera again after %.1f s", time.monotonic() - back)
            finally:
                for worker in (cut_off, standby):
                    if worker is not None:
                        worker.stop()
        engine.dispose()
        return results


def measure(
    pg: PostgresCluster, vlm_base_url: str, work: Path, trials: int, lease_s: float, renew_s: float, analyze_fps: float
) -> dict[str, Any]:
    bench = _Bench(pg, work, lease_s, renew_s, analyze_fps)
    kills = bench.kill_trials(trials, vlm_base_url)
    cuts = bench.cut_trials(trials, vlm_base_url)
    return {
        "lease_s": lease_s,
        "renew_s": renew_s,
        "stop_margin_s": min(2.0, lease_s / 5),
        "kill": _fault(kills),
        "cut": _fault(cuts),
    }
