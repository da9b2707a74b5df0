"""`visioncap worker` processes sharing a camera through PostgreSQL leases: one is killed with SIGKILL while its
selected frames wait for the VLM, and the other takes the camera within the lease time and captions those frames,
each exactly once.

Real parts: two worker processes, the detector, PostgreSQL, the tiny vLLM. The first worker talks to vLLM through a
tap that holds every caption request it sends, so its frames are certainly pending when it dies (the fault held is
the VLM's answer, not the worker). Every wait is on observable state: lease and caption rows.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, pipeline_dict, wait_for, write_pipeline
from pg import fresh_database
from sqlalchemy import Engine, text
from taps import AsgiThread, Tap
from videos import make_event_video

from visioncap.serve import VllmServer
from visioncap.store import CaptionStatus, CaptionStore, create_db_engine

pytestmark = [pytest.mark.detector]

LEASE_S, RENEW_S = 3.0, 0.5
WAIT_S = 300.0  # a bound on a broken test, never a measurement


def start_worker(pipeline: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    # Logs to a file: a pipe nobody reads would block the worker once full.
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "visioncap", "worker", "--pipeline", str(pipeline), "--capacity", "1",
             "--lease-s", str(LEASE_S), "--renew-s", str(RENEW_S), "--progress", "none"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO,
        )  # fmt: skip


def lease_owner(engine: Engine, camera: str) -> str | None:
    with engine.connect() as conn:
        return conn.scalar(
            text("SELECT owner FROM camera_leases WHERE camera = :c AND expires_at > now()"), {"c": camera}
        )


def rows(engine: Engine, camera: str) -> dict[int, tuple[str, int]]:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT id, status, attempts FROM captions WHERE camera = :c"), {"c": camera})
        return {row_id: (status, attempts) for row_id, status, attempts in found}


def live_workers(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT count(*) FROM workers")) or 0)


def test_a_killed_workers_camera_and_pending_frames_go_to_a_live_worker(
    tmp_path: Path, postgres: str, vllm_server: VllmServer
) -> None:
    video = tmp_path / "people.mp4"
    make_event_video(video, [(None, 1), ("zidane-right", 3)])
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, sources=[{"camera": "door", "path": str(video)}]))
    url = fresh_database(postgres)
    engine = create_db_engine(url)
    CaptionStore(engine).create_schema()  # the tables the test watches, before any worker makes them
    env = {"VISIONCAP_DATABASE_URL": url, "VISIONCAP_DATA_DIR": str(tmp_path / "data")}  # frames on shared disk
    tap = Tap(vllm_server.root_url)
    answers = tap.hold("")  # the captioner names no user: every caption request of the first worker waits
    first = second = None
    try:
        with AsgiThread(tap.app) as served:
            tap.root_url = served.root_url
            first = start_worker(pipeline, {**env, "VISIONCAP_VLM_BASE_URL": f"{tap.root_url}/v1"}, tmp_path / "a.log")
            wait_for(lambda: lease_owner(engine, "door") is not None, WAIT_S, "the first worker to lease the camera")
            owner_a = lease_owner(engine, "door")
            assert owner_a is not None and f"/{first.pid}/" in owner_a
            wait_for(lambda: tap.bodies, WAIT_S, "the first worker to ask the VLM for a caption")
            second = start_worker(pipeline, {**env, "VISIONCAP_VLM_BASE_URL": vllm_server.base_url}, tmp_path / "b.log")
            wait_for(lambda: live_workers(engine) == 2, WAIT_S, "the second worker to heartbeat")
            assert lease_owner(engine, "door") == owner_a, "a camera held by a live worker stays with it"

            pending = {row_id for row_id, (status, _) in rows(engine, "door").items() if status == "pending"}
            assert pending, "the first worker's frames wait for their captions"
            first.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            first.wait()

            def taken() -> bool:
                owner = lease_owner(engine, "door")
                return owner is not None and f"/{second.pid}/" in owner

            wait_for(taken, WAIT_S, "the live worker to take the camera", poll_s=0.05)
            took = time.monotonic() - killed
            # Expiry is at most a lease after the last renewal, and the live worker claims in its next round.
            assert took <= LEASE_S + RENEW_S + 1.0, f"takeover took {took:.1f} s"

            def captioned() -> bool:
                now = rows(engine, "door")
                return all(now[row_id][0] == CaptionStatus.CAPTIONED for row_id in pending)

            wait_for(captioned, WAIT_S, "the live worker to caption the killed worker's pending frames")
            after = rows(engine, "door")
            # One caption write each: the killed worker never got an answer, the live one asked once.
            assert {row_id: after[row_id][1] for row_id in pending} == dict.fromkeys(pending, 1)
            log_b = (tmp_path / "b.log").read_text()
            for row_id in pending:
                assert log_b.count(f"camera door frame {row_id}: ") == 1, f"frame {row_id} captioned more than once"
    finally:
        answers.set()
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(60)
