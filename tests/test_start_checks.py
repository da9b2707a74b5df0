"""What a start checks first: a video file that is not a video is one line and exit 2 before vLLM, the VLM check
and the detector load; pid files that a killed `run --serve` left for servers and starters that have ended are
removed at the next start, whatever port they were for; a server that dies at start on a full disk is reported
with the disk named (a real full tmpfs; vLLM is the stand-in of fake_vllm.py, which exits when its first log
line cannot be written)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_vllm import fake_server, install_fake_vllm
from helpers import missing, pipeline_dict, run_cli, write_pipeline

from visioncap.serve import free_port
from visioncap.serve.launcher import ServerError, ServerRecord, start_time


def test_a_file_that_is_not_a_video_is_one_line_and_exit_2_before_anything_loads(tmp_path: Path) -> None:
    video = tmp_path / "camera.mp4"
    video.write_text("this is not a video\n")
    dead_vlm = f"http://127.0.0.1:{free_port()}/v1"
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, vlm={"base_url": dead_vlm}))
    env = {"VISIONCAP_DATA_DIR": str(tmp_path / "data"), "VISIONCAP_DATABASE_URL": f"sqlite:///{tmp_path / 'c.db'}"}
    # The VLM is a closed port: a run that checked it (or loaded the detector) first would fail on it instead.
    done = run_cli("run", str(pipeline), "--progress", "none", env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"error: pipeline test: camera cam-1: {video} is not a video file that can be read (moov atom not found)"
    ]
    # Nor was vLLM started for `--serve`: the file comes first there too.
    served = run_cli("run", str(pipeline), "--serve", "tiny", "--progress", "none", env=env, timeout=120)
    assert served.returncode == 2 and "is not a video file" in served.stderr and len(served.stderr.splitlines()) == 1
    assert not (tmp_path / "data" / "run").exists()


def ended_process() -> tuple[int, int]:
    """A real process, SIGKILLed and reaped: its pid and start time (as a killed run's pid file names them)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    began = start_time(process.pid)
    assert began is not None
    process.send_signal(signal.SIGKILL)
    process.wait()
    return process.pid, began


def record(path: Path, port: int, server: tuple[int, int], owner: tuple[int, int | None]) -> None:
    path.write_text(
        json.dumps(
            {
                "profile": "tiny",
                "host": "127.0.0.1",
                "port": port,
                "pid": server[0],
                "start_time": server[1],
                "cmdline": ["vllm"],
                "server_id": "0123456789abcdef",
                "owner_pid": owner[0],
                "owner_start_time": owner[1],
            }
        )
    )


def test_a_start_removes_the_pid_files_of_ended_servers_on_any_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_vllm(tmp_path / "fake", monkeypatch)
    server = fake_server(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead_server, dead_owner = ended_process(), ended_process()
    # A run killed with its server (another port than this start's, as `run --serve` picks a free one).
    killed = run_dir / f"vllm-tiny-{server.port + 1}.pid"
    record(killed, server.port + 1, dead_server, dead_owner)
    # A pid file a start was killed in the middle of writing, long ago.
    torn = run_dir / f"vllm-tiny-{server.port + 2}.pid"
    torn.write_text('{"profile": "ti')
    os.utime(torn, (1_000_000_000, 1_000_000_000))
    # A run that still runs (this process) whose server has just died: its starter will report that itself.
    alive = run_dir / f"vllm-tiny-{server.port + 3}.pid"
    record(alive, server.port + 3, dead_server, (os.getpid(), start_time(os.getpid())))
    server.start()
    try:
        server.wait_ready(timeout_s=60)
        assert sorted(path.name for path in run_dir.iterdir()) == sorted([alive.name, server.pid_file.name])
        own = ServerRecord.read(server.pid_file)
        assert own is not None and own.pid == server.pid
    finally:
        server.stop(grace_s=10)
    assert not server.pid_file.exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs, filled to the last byte."""
    mount = tmp_path / "full"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        missing(f"a tmpfs mount ({done.stderr.decode().strip()})", "run the tests as root, as CI does")
    try:
        (mount / "logs").mkdir()
        with (mount / "filler").open("wb") as filler, contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_server_that_dies_on_a_full_disk_names_the_disk(
    tmp_path: Path, full_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_vllm(tmp_path / "fake", monkeypatch)
    server = fake_server(tmp_path)
    server.log_file = full_disk / "logs" / "vllm.log"  # its first line fails to be written: it exits
    server.start()
    try:
        with pytest.raises(ServerError) as raised:
            server.wait_ready(timeout_s=60)
    finally:
        server.stop(grace_s=10)
    message = str(raised.value)
    assert message.startswith("vLLM exited with code 1 before becoming healthy")
    free = os.statvfs(full_disk).f_bavail * os.statvfs(full_disk).f_frsize
    assert f"; disk full: {full_disk / 'logs'} has {free} bytes free" in message, message
    assert message.endswith(f"; its log {server.log_file} is empty"), message
