"""The Kubernetes manifests (deploy/k8s/), checked without a cluster.

Every overlay is rendered by the real `kubectl kustomize` and every object validated against the Kubernetes
OpenAPI schemas in strict mode (kubernetes-validate, offline, in .venv-deploy). Then what a schema cannot see:
each visioncap command is run with --help (vLLM's launcher with --dry-run), the probes are sent to the real
apps without a key, vLLM's port is admitted to nothing but its gateway, the GPU pods are the ones the overlay
claims, and every Secret, ConfigMap, volume claim and Service target a pod names exists.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from helpers import REPO, http_get_from, missing
from test_deploy import deploy_tool, help_run

from visioncap.api.app import build_api
from visioncap.bench.common.netns import Host
from visioncap.config.api import ApiSettings
from visioncap.config.gateway import load_gateway_config
from visioncap.config.pipeline import load_pipeline
from visioncap.demo_keys import DEMO_KEY_HASHES
from visioncap.errors import ConfigError
from visioncap.gateway.app import build_gateway
from visioncap.pipeline.health import HealthServer
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.serve import free_port

pytestmark = pytest.mark.deploy

K8S = REPO / "deploy" / "k8s"
# Each overlay and the GPU pods (one per GPU node) it claims to run.
GPU_PODS = {"one-gpu": 1, "two-gpu-nodes": 2}
KUBERNETES_VERSION = "1.34.0"  # one kubernetes-validate ships; NetworkPolicy and everything used here are GA
USER_SECRET = "visioncap-keys"  # created by the user (deploy/k8s/README.md), never rendered from these files
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")

Obj = dict[str, Any]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        missing("kubectl (with kustomize)", "https://kubernetes.io/docs/tasks/tools/")
    return path


def render(overlay: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    return [obj for obj in yaml.safe_load_all(result.stdout) if obj]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {name: render(K8S / "overlays" / name) for name in GPU_PODS}


def test_every_overlay_is_tested() -> None:
    assert sorted(path.name for path in (K8S / "overlays").iterdir() if path.is_dir()) == sorted(GPU_PODS)


def validate(objects: list[Obj], directory: Path) -> subprocess.CompletedProcess[str]:
    path = directory / "rendered.yaml"
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return subprocess.run(
        [str(deploy_tool("bin/kubernetes-validate")), "--strict", "--quiet", "-k", KUBERNETES_VERSION, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_overlay_objects_match_the_kubernetes_schemas(
    overlay: str, rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    result = validate(rendered[overlay], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_strict_validation_rejects_a_misspelt_field_and_a_wrong_type(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """The validation really validates: a field the schema lacks, or a value of the wrong type, fails."""
    for mistake, mutate in {
        "paht": lambda c: c["readinessProbe"]["httpGet"].update(paht="/healthz"),
        "containerPort": lambda c: c["ports"][0].update(containerPort="eight thousand"),
    }.items():
        objects = copy.deepcopy(rendered["one-gpu"])
        mutate(next(container for _, container in containers(objects) if container["name"] == "gateway"))
        result = validate(objects, tmp_path)
        assert result.returncode != 0, f"{mistake}: accepted"
        assert mistake in result.stdout + result.stderr, result.stdout


# --- the rendered objects ---------------------------------------------------------------------------------------


def workloads(objects: list[Obj]) -> list[Obj]:
    return [obj for obj in objects if obj["kind"] in WORKLOADS]


def containers(objects: list[Obj], init: bool = False) -> Iterator[tuple[Obj, Obj]]:
    """(workload, container) for every container of every pod template."""
    for workload in workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        for container in [*(spec.get("initContainers", []) if init else []), *spec["containers"]]:
            yield workload, container


def pod_labels(workload: Obj) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels is checked here: {selector}"
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def named(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == kind}


def is_vllm(container: Obj) -> bool:
    return container["image"].split(":")[0] == "vllm/vllm-openai"


def runs(container: Obj, subcommand: str) -> bool:
    return container.get("command", [])[:2] == ["visioncap", subcommand]


def env_value(container: Obj, name: str) -> Obj:
    (entry,) = [entry for entry in container.get("env", []) if entry["name"] == name]
    return entry


def mounted_files(workload: Obj, container: Obj, objects: list[Obj], directory: Path) -> dict[str, Path]:
    """Each file a ConfigMap mounts into the container (by subPath), written under `directory`."""
    volumes = {volume["name"]: volume for volume in workload["spec"]["template"]["spec"]["volumes"]}
    config_maps = named(objects, "ConfigMap")
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume and "subPath" in mount:
            path = directory / workload["metadata"]["name"] / container["name"] / mount["subPath"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(config_maps[volume["configMap"]["name"]]["data"][mount["subPath"]])
            files[mount["mountPath"]] = path
    return files


def the_user_secret() -> Obj:
    """The Secret deploy/k8s/README.md has the user create: its command, with test values, as kubectl makes it."""
    lines = iter((K8S / "README.md").read_text().splitlines())
    command = next(line for line in lines if "create secret generic" in line)
    while command.endswith("\\"):  # the shell's continuation lines
        command = command.removesuffix("\\") + next(lines)
    assert f"create secret generic {USER_SECRET}" in command and "-n visioncap" in command, command
    keys = re.findall(r"--from-literal=([A-Z_][A-Z0-9_]*)=", command)
    literals = [f"--from-literal={key}=test-{key.lower()}" for key in keys]
    result = subprocess.run(
        [kubectl(), "create", "secret", "generic", USER_SECRET, *literals, "--dry-run=client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# --- commands -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_every_visioncap_command_is_accepted_and_wired_to_its_neighbours(
    overlay: str, rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    objects = rendered[overlay]
    commands = 0
    for workload, container in containers(objects):
        if not container["image"].startswith("visioncap:"):
            continue
        files = mounted_files(workload, container, objects, tmp_path)
        command = [str(files.get(arg, arg)) for arg in container["command"]]
        result = help_run(command)
        assert result.returncode == 0, f"{workload['metadata']['name']}/{container['name']}: {result.stderr}"
        commands += 1
        options = dict(itertools.pairwise(container["command"]))
        if runs(container, "gateway"):
            port = options["--port"]
            assert {p["name"]: str(p["containerPort"]) for p in container["ports"]} == {"gateway": port}
            config = load_gateway_config(files[options["--config"]])
            (vllm,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if is_vllm(c)]
            vllm_options = dict(itertools.pairwise(vllm["args"]))
            # vLLM in its own pod, on loopback, with the key both take from the same Secret entry.
            assert config.upstreams[0].base_url == f"http://127.0.0.1:{vllm_options['--port']}/v1"
            key = env_value(container, config.upstreams[0].api_key_env or "")["valueFrom"]["secretKeyRef"]
            assert env_value(vllm, "VLLM_API_KEY")["valueFrom"]["secretKeyRef"] == key
        if runs(container, "worker"):
            assert load_pipeline(files[options["--pipeline"]]).vlm.model == "vlm"
            gateway = next(c for c in workload["spec"]["template"]["spec"]["containers"] if runs(c, "gateway"))
            gateway_port = dict(itertools.pairwise(gateway["command"]))["--port"]
            assert env_value(container, "VISIONCAP_VLM_BASE_URL")["value"] == f"http://127.0.0.1:{gateway_port}/v1"
    assert commands == 3  # the API, and the GPU pods' gateway and worker


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_vllm_launcher_arguments_dry_run(overlay: str, rendered: dict[str, list[Obj]]) -> None:
    """vLLM's command with the app environment's Python (the launcher needs only what vLLM's image has)."""
    for _, container in containers(rendered[overlay]):
        if not is_vllm(container):
            continue
        assert container["command"] == ["python3", "-m", "visioncap.serve"]
        args = container["args"]
        assert dict(itertools.pairwise(args))["--served-model-alias"] == "vlm"
        # The GPU class and its memory as an H200 would report them (argparse: the last value wins).
        result = subprocess.run(
            [sys.executable, "-m", "visioncap.serve", *args, "--gpu", "h200", "--gpu-memory-gib", "141",
             "--dry-run", "--format", "json"],
            capture_output=True, text=True, timeout=120, check=False, cwd=REPO,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert plan["gpu_memory_utilization"] == 0.98  # (141 - 1.5 - 1.0) / 141, as docker-compose's
        assert "--host 0.0.0.0 --port 8000" in " ".join(plan["command"])


# --- probes -------------------------------------------------------------------------------------------------------


def probes(container: Obj) -> dict[str, Obj]:
    return {kind: container[kind] for kind in ("startupProbe", "readinessProbe", "livenessProbe") if kind in container}


def http_paths(container: Obj) -> set[str]:
    paths = set()
    for probe in probes(container).values():
        assert set(probe) & {"httpGet", "exec"}, probe
        if "httpGet" in probe:
            port = probe["httpGet"]["port"]
            assert port in {p["name"] for p in container["ports"]} | {p["containerPort"] for p in container["ports"]}
            paths.add(probe["httpGet"]["path"])
    return paths


def test_http_probes_answer_200_without_a_key(
    rendered: dict[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's and the API's probes, sent to the real apps as the kubelet sends them: with no key."""
    monkeypatch.setenv("VLLM_API_KEY", "test-vllm-key")
    objects = rendered["one-gpu"]
    checked = set()
    for workload, container in containers(objects):
        if runs(container, "gateway"):
            files = mounted_files(workload, container, objects, tmp_path)
            config = load_gateway_config(files["/etc/visioncap/gateway.yaml"])
            app = build_gateway(config, "127.0.0.1")
        elif runs(container, "api"):
            settings = ApiSettings(  # type: ignore[call-arg]
                _env_file=None, data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'api.db'}"
            )
            app = build_api(settings, "127.0.0.1")
            with TestClient(app) as client:
                assert client.get("/readyz").status_code == 401  # why /readyz is no kubelet probe
        else:
            continue
        paths = http_paths(container)
        assert paths, container["name"]
        with TestClient(app) as client:
            for path in paths:
                assert client.get(path).status_code == 200, f"{container['name']}: {path}"
        checked.add(container["name"])
    assert checked == {"gateway", "api"}


def test_vllm_probes_use_its_open_health_route(rendered: dict[str, list[Obj]]) -> None:
    """vLLM answers /health without its key (tests/test_safe_defaults.py checks that on a real vLLM)."""
    for overlay in GPU_PODS:
        vllms = [container for _, container in containers(rendered[overlay]) if is_vllm(container)]
        assert vllms
        for container in vllms:
            assert set(probes(container)) == {"startupProbe", "readinessProbe", "livenessProbe"}
            assert http_paths(container) == {"/health"}


def test_worker_probes_reach_its_real_health_server_from_outside_the_pod(
    rendered: dict[str, list[Obj]], other_host: Host
) -> None:
    """The kubelet sends probes to the pod's IP, so the worker's health port must listen beyond loopback: a real
    HealthServer on the address and port the command opens answers them from another host (a network namespace)."""
    pipelines = [c for overlay in GPU_PODS for _, c in containers(rendered[overlay]) if runs(c, "worker")]
    assert len(pipelines) == len(GPU_PODS)
    for container in pipelines:
        options = dict(itertools.pairwise(container["command"]))
        assert "readinessProbe" not in container  # it takes no traffic; unready would drop its gateway
        assert set(probes(container)) == {"startupProbe", "livenessProbe"}
        paths = http_paths(container)
        assert paths == {"/healthz"}
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert {probe["httpGet"]["port"] for probe in probes(container).values()} == {"health"}
        assert str(ports["health"]) == options["--metrics-port"]
        port = free_port()
        with HealthServer(
            lambda: (False, {"database": "down"}), PipelineMetrics(), port=port, host=options["--metrics-host"]
        ):
            for path in paths:
                assert http_get_from(other_host, port, path)[0] == 200, path
            # And the check can fail: /readyz of a worker whose database is down.
            assert http_get_from(other_host, port, "/readyz")[0] == 503


# --- network policies ------------------------------------------------------------------------------------------------


def admitted(objects: list[Obj], workload: Obj, port: Obj) -> list[Obj] | None:
    """The peers network policies admit to `port` (a containerPort) of the workload's pods; None: everyone, as
    no policy selects them for ingress, or a rule admits every source."""
    labels = pod_labels(workload)
    policies = [
        p for p in objects
        if p["kind"] == "NetworkPolicy" and selects(p["spec"]["podSelector"], labels)
        and "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
    ]  # fmt: skip
    if not policies:
        return None
    peers: list[Obj] = []
    for policy in policies:
        for rule in policy["spec"].get("ingress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") in (port["containerPort"], port.get("name")) for p in ports):
                continue
            if not rule.get("from"):
                return None
            peers += rule["from"]
    return peers


def peer_containers(objects: list[Obj], peer: Obj) -> list[Obj]:
    """The containers of the pods a peer admits; an ipBlock or namespaceSelector admits unknown pods."""
    assert set(peer) == {"podSelector"}, f"admits pods this check cannot list: {peer}"
    pods = [w["spec"]["template"]["spec"] for w in workloads(objects) if selects(peer["podSelector"], pod_labels(w))]
    return [container for pod in pods for container in pod["containers"]]


def vllm_intruders(objects: list[Obj]) -> list[str]:
    """What may reach a vLLM port besides its gateway: the gateway in vLLM's pod reaches it over loopback, so then
    no pod at all; a gateway in pods of its own, those pods only."""
    problems = []
    for workload, container in containers(objects):
        if not is_vllm(container):
            continue
        pod = workload["spec"]["template"]["spec"]["containers"]
        for port in container["ports"]:
            peers = admitted(objects, workload, port)
            name = f"{workload['metadata']['name']}:{port['containerPort']}"
            if peers is None:
                problems.append(f"{name}: every source")
            elif any(runs(c, "gateway") for c in pod):
                problems += [f"{name}: {peer}" for peer in peers]
            else:
                others = [c for peer in peers for c in peer_containers(objects, peer) if not runs(c, "gateway")]
                problems += [f"{name}: {c['name']}" for c in others]
    return problems


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_only_the_gateway_reaches_vllm_and_only_visioncap_reaches_postgres(
    overlay: str, rendered: dict[str, list[Obj]]
) -> None:
    objects = rendered[overlay]
    assert vllm_intruders(objects) == []
    (postgres,) = [w for w in workloads(objects) if w["metadata"]["name"] == "postgres"]
    port = postgres["spec"]["template"]["spec"]["containers"][0]["ports"][0]
    peers = admitted(objects, postgres, port)
    assert peers, "PostgreSQL is open to every pod"
    users = {c["name"] for peer in peers for c in peer_containers(objects, peer)}
    assert users == {"api", "pipeline", "gateway", "vllm"}, users  # the pipelines' pods hold vLLM and the gateway
    # The rest is closed by default: a policy selecting every pod, admitting nothing.
    assert any(
        p["kind"] == "NetworkPolicy" and p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")
        for p in objects
    )


COMPONENT = "app.kubernetes.io/component"


def test_the_vllm_check_catches_an_opened_port(rendered: dict[str, list[Obj]]) -> None:
    for opening in (
        {"ports": [{"port": 8000}]},  # from every source
        {"ports": [{"port": "vllm"}], "from": [{"podSelector": {"matchLabels": {COMPONENT: "api"}}}]},
        {"from": [{"podSelector": {}}]},  # every port, from every pod of the namespace
    ):
        objects = copy.deepcopy(rendered["two-gpu-nodes"])
        policy = named(objects, "NetworkPolicy")["gpu-node-gateway-only"]
        policy["spec"]["ingress"].append(opening)
        assert vllm_intruders(objects), opening
    objects = [obj for obj in copy.deepcopy(rendered["one-gpu"]) if obj["kind"] != "NetworkPolicy"]
    assert vllm_intruders(objects) == ["gpu:8000: every source"]


# --- GPUs and nodes -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_gpu_pods_are_the_ones_the_overlay_claims_one_per_node_with_a_worker_on_the_sites_cameras(
    overlay: str, rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    objects = rendered[overlay]
    gpu_workloads = []
    for workload in workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        vllms = [c for c in pod["containers"] if is_vllm(c)]
        if not vllms:
            assert not any(runs(c, "worker") or runs(c, "run") for c in pod["containers"]), "a worker off vLLM's node"
            assert not any("nvidia.com/gpu" in json.dumps(c.get("resources", {})) for c in pod["containers"])
            continue
        gpu_workloads.append(workload)
        for container in vllms:
            for section in ("requests", "limits"):
                assert str(container["resources"][section]["nvidia.com/gpu"]) == "1", container["name"]
        # A rollout stops one pod at a time (the new one needs its GPU); the others' workers run its cameras.
        assert workload["kind"] == "StatefulSet" and workload["spec"]["podManagementPolicy"] == "Parallel"
        assert workload["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
        # At most one GPU pod per node: the detector takes the node's GPU 0.
        (rule,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert rule["topologyKey"] == "kubernetes.io/hostname" and selects(rule["labelSelector"], pod_labels(workload))
        # vLLM's weight cache: a claim per pod, never one volume that a second node could not mount.
        assert [t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]] == ["hf-cache"]
        # The worker beside vLLM, in the same pod (its frames stay on the node), on the site's cameras, with the
        # database all workers share.
        (worker,) = [c for c in pod["containers"] if runs(c, "worker")]
        assert not any(runs(c, "run") for c in pod["containers"]), "a single-box pipeline beside the worker"
        files = mounted_files(workload, worker, objects, tmp_path)
        options = dict(itertools.pairwise(worker["command"]))
        config = load_pipeline(files[options["--pipeline"]])
        assert config.sources and int(options["--capacity"]) >= 1
        assert env_value(worker, "VISIONCAP_DATABASE_URL")["valueFrom"]["secretKeyRef"]["name"] == USER_SECRET
    (workload,) = gpu_workloads  # one workload: every pod reads the same pipeline, the leases share it out
    assert workload["spec"]["replicas"] == GPU_PODS[overlay]


# --- references and keys ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", GPU_PODS)
def test_everything_a_pod_names_exists(overlay: str, rendered: dict[str, list[Obj]]) -> None:
    """ConfigMaps, Secrets and their keys, volume claims, Services' pods and ports: a typo in a name fails here,
    not as a pod stuck in ContainerCreating."""
    objects = rendered[overlay]
    assert named(objects, "Secret") == {}  # no key in these files
    user_secret = the_user_secret()
    data = {("ConfigMap", name): set(obj["data"]) for name, obj in named(objects, "ConfigMap").items()}
    data[("Secret", USER_SECRET)] = set(user_secret["data"])
    claims = set(named(objects, "PersistentVolumeClaim"))
    for workload in workloads(objects):
        spec = workload["spec"]["template"]["spec"]
        templates = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in data, volume
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, volume
        volume_names = {volume["name"] for volume in spec.get("volumes", [])} | templates
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            assert {m["name"] for m in container.get("volumeMounts", [])} <= volume_names, container["name"]
            for entry in container.get("env", []):
                for kind, ref in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    ref = entry.get("valueFrom", {}).get(ref)
                    if ref and not ref.get("optional"):
                        assert ref["key"] in data.get((kind, ref["name"]), set()), f"{container['name']}: {ref}"
    for service in named(objects, "Service").values():
        pods = [w for w in workloads(objects) if selects({"matchLabels": service["spec"]["selector"]}, pod_labels(w))]
        assert pods, f"service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            for pod in pods:
                offered = [p for c in pod["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])]
                assert port["targetPort"] in {p.get("name") for p in offered} | {p["containerPort"] for p in offered}


def test_vllms_key_reaches_vllm_and_the_gateway_only(rendered: dict[str, list[Obj]]) -> None:
    for overlay in GPU_PODS:
        holders = {
            container["name"]
            for _, container in containers(rendered[overlay], init=True)
            if '"key": "VLLM_API_KEY"' in json.dumps(container)
        }
        assert holders == {"vllm", "gateway"}, overlay
        for _, container in containers(rendered[overlay]):
            assert "VLLM_API_KEY" not in json.dumps([container.get("command"), container.get("args")])


def test_the_shipped_gateway_file_is_refused_until_its_demo_keys_are_replaced(
    rendered: dict[str, list[Obj]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway listens on 0.0.0.0 in its pod: with the shipped demo keys it must stop, naming them."""
    monkeypatch.setenv("VLLM_API_KEY", "test-vllm-key")
    for overlay in GPU_PODS:
        for config_map in named(rendered[overlay], "ConfigMap").values():
            if "gateway.yaml" not in config_map["data"]:
                continue
            path = tmp_path / "gateway.yaml"
            path.write_text(config_map["data"]["gateway.yaml"])
            config = load_gateway_config(path)
            assert {key.sha256 for key in config.keys} <= DEMO_KEY_HASHES
            with pytest.raises(ConfigError, match="published demo key"):
                build_gateway(config, "0.0.0.0")
