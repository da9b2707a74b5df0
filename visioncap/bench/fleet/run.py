"""Fleet benchmarks (issue 15): cameras per worker on this CPU, takeover time after `kill -9` and after a network
cut, and cameras per GPU at the 1.25x chat objective from the cost model.

Real parts: PostgreSQL (a throwaway cluster), `visioncap worker` processes with the person detector, the tiny vLLM,
live MJPEG cameras served from this process at real-time rate (visioncap.bench.fleet.parts), a network namespace
for the cut (visioncap.bench.common.netns, root). Each part records its own command, date and `uptime`; a run of some
parts keeps the others' earlier results in benchmarks/results/fleet.json.

Run: `.venv/bin/python -m visioncap.bench.fleet [--quick] [--parts capacity,takeover,model]`
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from visioncap.bench.common.machine import REPO, portable
from visioncap.bench.common.netns import SUBNET_PREFIX, netns_problem
from visioncap.bench.common.outputs import RESULTS_DIR, command_line
from visioncap.bench.common.pgcluster import PostgresCluster, postgres_bin
from visioncap.bench.detection.shared import detector_machine_facts  # sets the YOLO_* defaults first
from visioncap.bench.fleet.render import render
from visioncap.serve import VllmServer, free_port

log = logging.getLogger("visioncap.bench.fleet")
VLLM_START_LIMIT_S = 900.0  # a bound on a broken start, not a figure
PARTS = ("capacity", "takeover", "model")
app = typer.Typer(add_completion=False)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _stamp(part: dict[str, Any], argv: list[str], started: str, uptime_start: str) -> dict[str, Any]:
    return {
        **part,
        "command": command_line("visioncap.bench.fleet", argv),
        "date": started,
        "uptime_start": uptime_start,
        "uptime_end": _uptime(),
    }


@contextlib.contextmanager
def _tiny_vllm(work: Path) -> Iterator[VllmServer]:
    """The tiny vLLM on every address, so that a worker in a namespace reaches it at the host's end of its link.

    Its start may wait longer than the profile's own limit: on this shared 2-core machine a load of 10 has made it
    miss 300 s."""
    from visioncap.config.profiles import load_profile
    from visioncap.config.settings import Settings

    profile = load_profile("tiny", REPO / "models")
    server = VllmServer(
        profile, python=Settings().server_python, host="0.0.0.0", port=free_port(), log_file=work / "vllm.log"
    )
    server.start()
    try:
        server.wait_ready(timeout_s=VLLM_START_LIMIT_S)
        yield server
    finally:
        server.stop()


def _save(data: dict[str, Any], out_dir: Path) -> None:
    """After every part: a later part that fails keeps the earlier ones."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "fleet.json").write_text(json.dumps(portable(data), indent=2) + "\n", encoding="utf-8")
    (out_dir / "fleet.md").write_text(render(data), encoding="utf-8")
    log.info("wrote %s and %s", out_dir / "fleet.json", out_dir / "fleet.md")


def _measure_live(
    data: dict[str, Any], chosen: list[str], argv: list[str], counts: list[int], seconds: float, analyze_fps: float,
    max_tokens: int, trials: int, lease: float, renew: float, out_dir: Path,
) -> None:  # fmt: skip
    """The parts that need PostgreSQL, the tiny vLLM and worker processes (one start of each for both)."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql)")
    if "takeover" in chosen and netns_problem():
        raise SystemExit(f"takeover needs a network namespace: {netns_problem()}")
    # Worker and vLLM logs stay for a look after the run (data/ is not committed); the last run's only.
    work = REPO / "data" / "benchmarks" / "fleet"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cluster = PostgresCluster(bin_dir, listen="*", trusted=(f"{SUBNET_PREFIX}.0.0/16",), max_connections=200)
    with cluster as pg, _tiny_vllm(work) as vllm:
        vlm_url = f"http://127.0.0.1:{vllm.port}/v1"
        if "capacity" in chosen:
            from visioncap.bench.fleet.capacity import measure_point

            started, up = datetime.now(UTC).isoformat(timespec="seconds"), _uptime()
            points = []
            for count in counts:
                log.info("capacity: %d camera(s), %.0f s", count, seconds)
                point = measure_point(pg, vlm_url, work, count, seconds, warmup_s=3.0, drain_s=8.0,
                                      analyze_fps=analyze_fps, max_tokens=max_tokens)  # fmt: skip
                log.info("capacity: %s", point)
                points.append(point)
            settings = {"analyze_fps": analyze_fps, "max_tokens": max_tokens, "duration_s": seconds}
            data["parts"]["capacity"] = _stamp({"settings": settings, "points": points}, argv, started, up)
            _save(data, out_dir)
        if "takeover" in chosen:
            from visioncap.bench.fleet.takeover import measure

            started, up = datetime.now(UTC).isoformat(timespec="seconds"), _uptime()
            result = measure(pg, vlm_url, work, trials, lease, renew, analyze_fps=2.0)
            data["parts"]["takeover"] = _stamp(result, argv, started, up)
            _save(data, out_dir)


@app.command()
def main(
    quick: Annotated[
        bool, typer.Option("--quick", help="Short points (12 s), 1,2,4 cameras, 5 trials of 5 s leases.")
    ] = False,
    parts: Annotated[str, typer.Option(help="Comma-separated: capacity, takeover, model.")] = ",".join(PARTS),
    cameras: Annotated[str | None, typer.Option(help="Camera counts (default 1,2,4,8; quick 1,2,4).")] = None,
    duration: Annotated[float | None, typer.Option(help="Measured seconds per point (default 35; quick 12).")] = None,
    analyze_fps: Annotated[float, typer.Option(help="Frames per second asked of the detector per camera.")] = 5.0,
    max_tokens: Annotated[int, typer.Option(help="Caption length (tokens) from the tiny model.")] = 16,
    trials: Annotated[int, typer.Option(help="Takeover trials per fault.")] = 5,
    lease_s: Annotated[float | None, typer.Option(help="Lease for takeover (default 15, as workers; quick 5).")] = None,
    renew_s: Annotated[float | None, typer.Option(help="Renewal period (default 3, the worker's; quick 1).")] = None,
    out_dir: Annotated[Path, typer.Option(help="Where fleet.json and fleet.md go.")] = RESULTS_DIR,
) -> None:
    """Measure the fleet parts asked for and write fleet.json and fleet.md."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the metrics polls, twenty a second
    argv = sys.argv[1:]
    chosen = [p.strip() for p in parts.split(",") if p.strip()]
    unknown = set(chosen) - set(PARTS)
    if unknown:
        raise typer.BadParameter(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
    counts = [int(c) for c in (cameras or ("1,2,4" if quick else "1,2,4,8")).split(",")]
    seconds = duration or (12.0 if quick else 35.0)
    lease = lease_s or (5.0 if quick else 15.0)
    renew = renew_s or (1.0 if quick else 3.0)
    json_path = out_dir / "fleet.json"
    data: dict[str, Any] = json.loads(json_path.read_text()) if json_path.is_file() else {}
    data.setdefault("parts", {})
    data["machine"] = detector_machine_facts()

    if {"capacity", "takeover"} & set(chosen):
        _measure_live(data, chosen, argv, counts, seconds, analyze_fps, max_tokens, trials, lease, renew, out_dir)
    if "model" in chosen:
        from visioncap.bench.fleet.model import cameras_per_gpu

        started, up = datetime.now(UTC).isoformat(timespec="seconds"), _uptime()
        measured = None
        capacity = data["parts"].get("capacity")
        if capacity:
            one = [p for p in capacity["points"] if p["cameras"] == 1]
            measured = one[0]["captions_selected_per_camera_s"] if one else None
        result = cameras_per_gpu(["qwen2.5-vl-7b", "qwen2.5-vl-3b", "qwen3-vl-8b"], ["h200", "l4"], 1.25, measured)
        data["parts"]["model"] = _stamp(result, argv, started, up)

    _save(data, out_dir)


if __name__ == "__main__":
    app()
