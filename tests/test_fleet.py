"""The fleet, for real: three `visioncap worker` processes on one PostgreSQL, one of them on a host of its own (a
network namespace), two vLLM servers behind one gateway, six live cameras. One worker is killed, the other host
is cut off for 30 s, one vLLM is killed; every event the cameras showed is captioned exactly once, and every chat
is answered or refused before its first byte.

Real parts: PostgreSQL (listening on the namespace's link too), the gateway process, two tiny vLLM servers, the
detector, five MJPEG cameras looping one video on a shared clock (all show the same scene at the same time, so
what each showed when is known) and one GStreamer RTSP camera. The namespace's link is taken down for the cut:
its packets go nowhere, as with a pulled cable.

The timeline is the video's: nobody for 10 s, a person for 8 s (seen in several frames at one analysed frame a
second, even when the cores are short), nobody for 8 s, over and over. Faults are made in the empty part of a loop,
so a camera moves between workers while it shows nobody and an event is never half seen by two owners (which would
rightly get a caption from each: the new owner cannot know it saw the same person). The killed worker reaches the
gateway through a tap that holds its caption requests, so its selected frames are certainly pending when it dies and
must be captioned by the live workers.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

import httpx
import pytest
import yaml
from helpers import ARTIFACTS, REPO, TINY_MODEL, pipeline_dict, wait_for, write_pipeline
from servers.mjpeg_server import MjpegServer
from sqlalchemy import Engine, text
from streams import RtspServer, skip_unless_gstreamer
from taps import AsgiThread, Tap
from videos import make_event_video

from visioncap.bench.common.netns import Host, netns_problem
from visioncap.bench.common.pgcluster import PostgresCluster, postgres_bin
from visioncap.config.keys import hash_key
from visioncap.serve import VllmServer, free_port
from visioncap.store import CaptionStatus, CaptionStore, create_db_engine
from visioncap.store.cameras import camera_states

pytestmark = [pytest.mark.detector, pytest.mark.rtsp, pytest.mark.postgres, pytest.mark.fleet]

LOOP = [(None, 10.0), ("zidane-right", 8.0), (None, 8.0)]
PERIOD_S = 26.0
PERSON_S = (10.0, 18.0)  # when the person shows, within a loop
# Faults start in here (within a loop): the event has ended (event_end_s after the person left) and a camera moved
# now is watched again by its new owner (a lease, a renewal round, opening the stream) before the next person.
QUIET_S = (21.5, 26.0)
# Longer than test_workers' 3 s: three workers, two vLLM servers and six cameras share two cores here, and a
# renewal held up by the CPU must not move cameras at random times.
LEASE_S, RENEW_S = 6.0, 1.0
CUT_S = 30.0
# After the scene ends: event_end_s (2 s) closes the last events, one more analysed frame (1 s) at least.
CAUGHT_UP_S = 4.0
LOOPS_AFTER = 1  # full loops after the last fault
WAIT_S = 300.0  # a bound on a broken test, never a measurement
MJPEG_CAMERAS = ["cam-a", "cam-b", "cam-c", "cam-d", "cam-e"]
CHAT_KEY, FRAMES_A, FRAMES_B = "fleet-chat-key", "fleet-frames-a", "fleet-frames-b"
REFUSALS = {429, 503}  # refused before any byte of an answer: the caller may try again


@pytest.fixture
def netns() -> Iterator[Host]:
    problem = netns_problem()
    if problem is not None:
        pytest.fail(f"the fleet test needs a network namespace: {problem}")
    with Host() as host:
        yield host


@pytest.fixture
def fleet_postgres(netns: Host) -> Iterator[PostgresCluster]:
    """A cluster of this test's own that the namespace can reach (the session's listens on loopback only)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.fail("PostgreSQL is not installed (make system-deps)")
    with PostgresCluster(bin_dir, listen="*", trusted=(netns.subnet,)) as cluster:
        yield cluster


class Every:
    """`step()` every `interval_s` seconds in a thread of its own, from the start of a `with` block to its end."""

    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def step(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.step()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(150)  # a chat's own timeout is 120 s


class Chats(Every):
    """A chat user through the gateway for the whole run, asking every 2 s (the cores are few), one question at a
    time: each answer's status or error."""

    def __init__(self, url: str) -> None:
        super().__init__(2.0, "chats")
        self.url = url
        self.results: list[tuple[float, int | str]] = []
        self._client = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {CHAT_KEY}"})
        self._body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "what is happening?"}],
                      "max_tokens": 4, "temperature": 0, "ignore_eos": True}  # fmt: skip

    def step(self) -> None:
        try:
            response = self._client.post(self.url, json=self._body)
            outcome: int | str = response.status_code
            if response.status_code == 200:
                response.json()["choices"][0]["message"]["content"]  # a whole answer, not a torn one
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        self.results.append((time.time(), outcome))

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._client.close()


class Leases(Every):
    """Who held each camera, polled every 0.1 s: [(time, owner or None)] per camera, changes only."""

    def __init__(self, engine: Engine) -> None:
        super().__init__(0.1, "leases")
        self.engine = engine
        self.history: dict[str, list[tuple[float, str | None]]] = {}

    def owners(self) -> dict[str, str]:
        with self.engine.connect() as conn:
            # A lease given back has no owner and expires at its release's now(), which is later than this
            # statement's now() when the release committed after this transaction began.
            query = "SELECT camera, owner FROM camera_leases WHERE owner IS NOT NULL AND expires_at > now()"
            found = conn.execute(text(query))
            return {camera: owner for camera, owner in found}

    def step(self) -> None:
        now, owners = time.time(), self.owners()
        for camera in {*owners, *self.history}:
            changes = self.history.setdefault(camera, [])
            if not changes or changes[-1][1] != owners.get(camera):
                changes.append((now, owners.get(camera)))


def start_worker(argv_prefix: list[str], pipeline: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [*argv_prefix, sys.executable, "-m", "visioncap", "worker", "--pipeline", str(pipeline),
             "--capacity", "6", "--lease-s", str(LEASE_S), "--renew-s", str(RENEW_S), "--progress", "none"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=REPO,
        )  # fmt: skip


def held_by(leases: Leases, process: subprocess.Popen[bytes]) -> set[str]:
    return {camera for camera, owner in leases.owners().items() if f"/{process.pid}/" in owner}


def pending(engine: Engine, cameras: set[str]) -> int:
    if not cameras:
        return 0
    with engine.connect() as conn:
        query = text("SELECT count(*) FROM captions WHERE status = 'pending' AND camera = ANY(:c)")
        return int(conn.scalar(query, {"c": sorted(cameras)}) or 0)


def test_workers_and_replicas_fail_and_every_event_is_captioned_exactly_once(
    tmp_path: Path,
    netns: Host,
    fleet_postgres: PostgresCluster,
    vllm_server: VllmServer,
    second_vllm_server: VllmServer,
) -> None:
    skip_unless_gstreamer()
    host_ip = netns.gateway_ip  # this machine as every worker sees it, the namespaced one included
    video = tmp_path / "loop.mp4"
    make_event_video(video, LOOP)

    replica_b = second_vllm_server
    url = fleet_postgres.url_for(fleet_postgres.new_database(), host_ip)
    engine = create_db_engine(url)
    CaptionStore(engine).create_schema()

    gateway_port = free_port()
    gateway_file = tmp_path / "gateway.yaml"
    gateway_file.write_text(yaml.safe_dump({
        "upstreams": [{"name": "a", "base_url": vllm_server.base_url},
                      {"name": "b", "base_url": replica_b.base_url}],
        "keys": [{"name": "chat", "sha256": hash_key(CHAT_KEY), "traffic_class": "interactive"},
                 {"name": "frames-a", "sha256": hash_key(FRAMES_A), "traffic_class": "background", "upstream": "a"},
                 {"name": "frames-b", "sha256": hash_key(FRAMES_B), "traffic_class": "background", "upstream": "b"}],
        # Frames wait as long as they must: this test is about who captions them, not about admission.
        "background": {"deadline_s": 600},
    }))  # fmt: skip
    gateway_log = (tmp_path / "gateway.log").open("wb")
    gateway = subprocess.Popen(
        [sys.executable, "-m", "visioncap", "gateway", "--config", str(gateway_file), "--host", "0.0.0.0",
         "--port", str(gateway_port)],
        stdout=gateway_log, stderr=subprocess.STDOUT, cwd=REPO,
    )  # fmt: skip
    gateway_url = f"http://{host_ip}:{gateway_port}/v1"

    mjpeg = [MjpegServer(video, host="0.0.0.0", fps=5).start() for _ in MJPEG_CAMERAS]
    for server in mjpeg:
        server.origin = math.inf  # the empty first frame until the scene starts, however long the set-up takes
    rtsp = RtspServer(video, host="0.0.0.0")
    # One frame a second per camera: the detector takes ~0.1 CPU-s a frame here
    # (benchmarks/results/detector_throughput.md), so six cameras need ~0.6 of the two cores beside two vLLMs.
    sources: list[dict[str, Any]] = [
        {"camera": name, "kind": "http", "url": f"http://{host_ip}:{server.port}/stream.mjpg", "analyze_fps": 1}
        for name, server in zip(MJPEG_CAMERAS, mjpeg, strict=True)
    ]
    data = pipeline_dict(video, selection={"stable_frames": 2, "best_frame_window_s": 0.6, "recaption_interval_s": 60,
                                           "min_interval_s": 1, "event_end_s": 2})  # fmt: skip
    tap = Tap(f"http://127.0.0.1:{gateway_port}")
    answers = tap.hold("")  # every caption request of the worker to be killed waits here
    workers: list[subprocess.Popen[bytes]] = []
    leases, chats = Leases(engine), Chats(f"{gateway_url}/chat/completions")
    origin = math.nan  # when the scene starts (set below); the timeline is written however far the test got
    logs = [tmp_path / f"worker-{n}.log" for n in (1, 2, 3)]
    try:
        rtsp.start()
        port = rtsp.url.rsplit(":", 1)[1].split("/", 1)[0]
        sources.append({"camera": "yard", "kind": "rtsp", "url": f"rtsp://{host_ip}:{port}/stream", "analyze_fps": 1})
        pipeline = write_pipeline(tmp_path, {**data, "sources": sources})

        def gateway_ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{gateway_port}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(gateway_ready, WAIT_S, "the gateway to see both replicas")
        env = {"VISIONCAP_DATABASE_URL": url, "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
               "VISIONCAP_VLM_BASE_URL": gateway_url}  # fmt: skip
        with AsgiThread(tap.app) as tapped, leases, chats:
            tap.root_url = tapped.root_url
            # Worker 1 (to be killed) and worker 2 here, worker 3 on the other host; 1 and 3 frame to replica a.
            workers.append(start_worker([], pipeline, {**env, "VISIONCAP_VLM_BASE_URL": f"{tap.root_url}/v1",
                                                       "VISIONCAP_VLM_API_KEY": FRAMES_A}, logs[0]))  # fmt: skip
            wait_for(lambda: len(leases.owners()) == 6, WAIT_S, "the first worker to seed and claim the cameras")
            workers.append(start_worker([], pipeline, {**env, "VISIONCAP_VLM_API_KEY": FRAMES_B}, logs[1]))
            workers.append(start_worker(netns.command([]), pipeline, {**env, "VISIONCAP_VLM_API_KEY": FRAMES_A},
                                        logs[2]))  # fmt: skip
            first, second, third = workers

            def balanced() -> bool:
                return all(len(held_by(leases, worker)) == 2 for worker in workers)

            wait_for(balanced, WAIT_S, "two cameras on each worker")
            # The scene starts now, on every MJPEG camera at once.
            origin = time.time() + 1.0
            for server in mjpeg:
                server.origin = origin

            def in_quiet_phase(condition: Callable[[], bool] = lambda: True) -> Callable[[], bool]:
                def check() -> bool:
                    phase = (time.time() - origin) % PERIOD_S
                    in_quiet = QUIET_S[0] <= phase < QUIET_S[1]
                    return time.time() > origin + PERIOD_S and in_quiet and condition()

                return check

            # Fault 1: kill worker 1 while frames it selected wait for their captions, once it has selected a frame
            # of every event its cameras showed: a worker that dies before it has analysed an event's frames takes
            # that event with it (a live camera's frames are nowhere else), which is not what this test is about.
            def selected_every_event_shown() -> bool:
                cameras = held_by(leases, first)
                loops_begun = int((time.time() - origin) // PERIOD_S) + 1
                shown = [k for k in range(loops_begun) if origin + k * PERIOD_S + PERSON_S[1] < time.time()]
                taken = [(camera, at) for _, camera, at in rows_of(engine).values() if camera in cameras]
                return pending(engine, cameras) > 0 and all(
                    any(camera == mine and in_event(at, origin, k) for mine, at in taken)
                    for camera in cameras & set(MJPEG_CAMERAS)
                    for k in shown
                )

            wait_for(in_quiet_phase(selected_every_event_shown), WAIT_S,
                     "the first worker to have selected every event shown, its frames pending, between two events",
                     poll_s=0.05)  # fmt: skip
            stalled = held_by(leases, first)
            orphaned = pending(engine, stalled)
            first.send_signal(signal.SIGKILL)
            first.wait()
            answers.set()  # its held requests go on to a socket nobody reads: no answer can reach a row
            wait_for(lambda: not held_by(leases, first) and len(leases.owners()) == 6, WAIT_S,
                     "the live workers to take the killed worker's cameras", poll_s=0.05)  # fmt: skip

            # Fault 2: cut worker 3's host off for 30 s, between two events and with its captions written.
            def third_settled() -> bool:
                cameras = held_by(leases, third)
                return bool(cameras) and pending(engine, cameras) == 0

            wait_for(in_quiet_phase(third_settled), WAIT_S,
                     "the namespaced worker to hold cameras with nothing pending, between two events",
                     poll_s=0.05)  # fmt: skip
            cut_at = time.time()
            netns.cut()
            wait_for(lambda: not held_by(leases, third) and len(held_by(leases, second)) == 6, WAIT_S,
                     "worker 2 to take the cut-off worker's cameras", poll_s=0.05)  # fmt: skip
            taken_s = time.time() - cut_at

            # Fault 3, during the cut: kill replica b while frames are being captioned (worker 2's go there).
            wait_for(lambda: PERSON_S[1] <= (time.time() - origin) % PERIOD_S < QUIET_S[0], WAIT_S,
                     "an event's captions to be under way", poll_s=0.05)  # fmt: skip
            b_killed_at = time.time()
            replica_b.send_signal(signal.SIGKILL)
            assert b_killed_at < cut_at + CUT_S, "the replica was to die while the namespace is cut off"
            # The cut lasts 30 s by the scenario: this wait is the fault, not a synchronisation.
            time.sleep(max(0.0, cut_at + CUT_S - time.time()))
            netns.join()
            joined_at = time.time()
            wait_for(lambda: len(held_by(leases, third)) == 3, WAIT_S, "the returned worker to get its share back")
            loops = math.ceil((joined_at - origin) / PERIOD_S) + LOOPS_AFTER
            wait_for(lambda: time.time() > origin + loops * PERIOD_S, WAIT_S, "the last loop to end")
            # The scene ends: the MJPEG cameras show nobody from now on and the RTSP camera goes away.
            for server in mjpeg:
                server.origin = math.inf
            rtsp.kill()
            ended_at = time.time()

            # Every camera's owner has analysed frames from well after the last event ended (its events are closed
            # and their frames selected), however far behind the wall clock a loaded worker's detector runs; and
            # no worker holds a frame in its journal (a database outage's backlog, written back later).
            def caught_up() -> bool:
                states = camera_states(engine)
                return all(
                    (state := states.get(camera)) is not None and state.last_frame_at is not None
                    and seconds(state.last_frame_at) >= ended_at + CAUGHT_UP_S
                    for camera in MJPEG_CAMERAS
                ) and not journaled(tmp_path / "data")  # fmt: skip

            def behind() -> str:
                seen = {camera: state.last_frame_at and round(seconds(state.last_frame_at) - origin, 2)
                        for camera, state in camera_states(engine).items()}  # fmt: skip
                return f"the workers to catch up with the scene's end ({round(ended_at - origin, 2)} s): newest " \
                       f"analysed frames {seen}, journal entries {journaled(tmp_path / 'data')}"  # fmt: skip

            wait_for(caught_up, WAIT_S, behind)

            def all_captioned() -> bool:
                found = rows_of(engine)
                return bool(found) and all(status == CaptionStatus.CAPTIONED for status, _, _ in found.values())

            def not_captioned() -> str:
                stuck = {row: (camera, status, round(at - origin, 2)) for row, (status, camera, at)
                         in rows_of(engine).items() if status != CaptionStatus.CAPTIONED}  # fmt: skip
                return f"every selected frame to be captioned; not captioned: {stuck}"

            wait_for(all_captioned, WAIT_S, not_captioned)
            final = rows_of(engine)
            history = {camera: list(changes) for camera, changes in leases.history.items()}
        chat_results = list(chats.results)
    finally:
        answers.set()
        # The timeline of however far it got, for whoever reads a failure.
        (ARTIFACTS / "fleet-timeline.json").write_text(
            json.dumps(timeline(origin, rows_of(engine), selected_at(engine), leases.history, chats.results), indent=1)
        )
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            if worker.poll() is None:
                worker.wait(60)
        gateway.send_signal(signal.SIGTERM)
        gateway.wait(60)
        gateway_log.close()
        for server in mjpeg:
            server.stop()
        rtsp.kill()

    # Every selected frame was captioned once: one answer logged for it across all workers (the killed worker's
    # requests were held, so it never had one; a fenced-out late answer would show here as a second).
    assert orphaned > 0
    text_of_logs = "".join(log.read_text(errors="replace") for log in logs)
    for row_id, (_, camera, _) in final.items():
        count = len(re.findall(rf"camera {re.escape(camera)} frame {row_id}: ", text_of_logs))
        assert count == 1, f"frame #{row_id} of {camera} captioned {count} times"
    assert any(camera == "yard" for _, camera, _ in final.values()), "the RTSP camera's events were captioned"

    def since(times: list[float]) -> list[float]:
        """Seconds from the scene's origin (the person is in view at 10-18 s of each 26 s loop)."""
        return [round(at - origin, 2) for at in times]

    def since_origin(changes: list[tuple[float, Any]]) -> list[tuple[float, Any]]:
        return [(round(at - origin, 2), what) for at, what in changes]

    # Every event each MJPEG camera showed: exactly one caption, taken while the person was in view.
    def moved_near(camera: str, start: float, end: float) -> bool:
        return any(start - 2 <= at <= end + 3 for at, _ in history.get(camera, [])[1:])

    for camera in MJPEG_CAMERAS:
        taken = sorted(at for _, cam, at in final.values() if cam == camera)
        counted = 0
        for k in range(loops):
            start, end = origin + k * PERIOD_S + PERSON_S[0], origin + k * PERIOD_S + PERSON_S[1]
            inside = [at for at in taken if in_event(at, origin, k)]
            counted += len(inside)
            if moved_near(camera, start, end):
                # Seen in part by two owners (only a rebalance at an arbitrary time can do this): one each at most.
                assert len(inside) <= 2, (camera, k, since(inside), since_origin(history.get(camera, [])))
            else:
                assert len(inside) == 1, f"{camera} event {k}: {len(inside)} captions at {since(inside)} " \
                                         f"(leases: {since_origin(history.get(camera, []))})"  # fmt: skip
        assert counted == len(taken), f"{camera}: captions outside any event; all of its captions at {since(taken)}"

    # Takeover within the lease (plus a renewal round and the poll).
    assert taken_s <= LEASE_S + RENEW_S + 2.0, f"the cut-off worker's cameras were taken after {taken_s:.1f} s"
    # Chat: answered or refused before any byte, through every fault; answered after replica b died.
    assert chat_results, "chats ran"
    torn = [(at - origin, outcome) for at, outcome in chat_results if outcome != 200 and outcome not in REFUSALS]
    assert not torn, torn
    after_b = [(at, outcome) for at, outcome in chat_results if at > b_killed_at + 5]
    assert any(outcome == 200 for _, outcome in after_b), f"none answered after replica b died: {since_origin(after_b)}"
    in_cut = [(at, outcome) for at, outcome in chat_results if cut_at < at < cut_at + CUT_S]
    assert any(outcome == 200 for _, outcome in in_cut), f"no chat answered during the cut: {since_origin(in_cut)}"


def journaled(data_dir: Path) -> list[str]:
    """Frames the workers keep in their journals (written back when the database answers), from the files."""
    return sorted(str(path.relative_to(data_dir)) for path in (data_dir / "journal").rglob("*.json"))


def seconds(at: datetime) -> float:
    """A stored time as time.time() counts it (stored as UTC; the raw read may give it without its zone)."""
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def in_event(at: float, origin: float, loop: int) -> bool:
    """Whether a frame captured at `at` shows loop `loop`'s person (both on time.time()'s clock)."""
    start, end = origin + loop * PERIOD_S + PERSON_S[0], origin + loop * PERIOD_S + PERSON_S[1]
    return start - 0.3 <= at <= end + 0.3


def rows_of(engine: Engine) -> dict[int, tuple[str, str, float]]:
    with engine.connect() as conn:
        found = conn.execute(text("SELECT id, status, camera, captured_at FROM captions"))
        return {row_id: (status, camera, seconds(at)) for row_id, status, camera, at in found}


Rows = dict[int, tuple[str, str, float]]
History = dict[str, list[tuple[float, str | None]]]


def selected_at(engine: Engine) -> dict[int, float]:
    """When each row was written: its frame's selection, on the worker's clock (this machine's)."""
    with engine.connect() as conn:
        return {row_id: seconds(at) for row_id, at in conn.execute(text("SELECT id, created_at FROM captions"))}


def timeline(
    origin: float, final: Rows, selected: dict[int, float], history: History, chats: list[tuple[float, int | str]]
) -> dict[str, Any]:
    """What happened when, in seconds from the scene's origin: kept beside the test's logs for whoever reads a
    failure. A row: camera, frame captured, status, frame selected (its row written)."""
    return {
        "rows": {
            str(row): [
                camera,
                round(at - origin, 2),
                status,
                round(selected[row] - origin, 2) if row in selected else None,
            ]
            for row, (status, camera, at) in final.items()
        },
        "leases": {cam: [[round(at - origin, 2), owner] for at, owner in changes] for cam, changes in history.items()},
        "chats": [[round(at - origin, 2), outcome] for at, outcome in chats],
    }
