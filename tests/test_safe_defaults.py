"""Safe deployment defaults (#13 item 7): vLLM behind a key of the user's own and off the host's ports, and no
published demo key served on an address other machines reach.

The compose file is read as Compose itself resolves it (the helpers of test_deploy.py). The gateway and the API
are the real `visioncap gateway` / `visioncap api` commands in child processes: refused, they must exit at once
with one line; allowed, they must answer on loopback.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers import REPO, TINY_MODEL, serve_cli
from test_deploy import COMPOSE_FILE, ENV_EXAMPLE, KEYS, compose, host_path, resolved

from visioncap.config.gateway import load_gateway_config
from visioncap.config.keys import hash_key
from visioncap.config.profiles import load_profile
from visioncap.config.settings import Settings
from visioncap.demo_keys import DEMO_KEY_HASHES, PUBLISHED_DEMO_KEYS, is_loopback
from visioncap.errors import ConfigError
from visioncap.serve import VllmServer, free_port

TIMEOUT_S = 120  # a bound on a broken test only; a refusal comes in seconds
FRESH_KEY = "vc-test-fresh-key-of-ones-own"
DEMO_CHAT_KEY, DEMO_CAPTIONS_KEY, DEMO_ALERTS_KEY = PUBLISHED_DEMO_KEYS


# --- the list of demo keys ----------------------------------------------------------------------------------


def shipped_files() -> list[Path]:
    """Files a user copies or reads: the example configs, compose, its env file, README, docs, deploy manifests."""
    files = [*sorted((REPO / "pipelines").glob("*.yaml")), COMPOSE_FILE, ENV_EXAMPLE, REPO / "README.md"]
    files += sorted((REPO / "docs").glob("*.md"))
    files += [path for path in sorted((REPO / "deploy").rglob("*")) if path.is_file()]
    return files


def test_every_demo_key_a_shipped_file_names_is_in_the_one_list() -> None:
    named = {key for path in shipped_files() for key in re.findall(r"\bdemo-[a-z0-9-]*key\b", path.read_text())}
    assert named, "no demo key found in the shipped files: the pattern is wrong"
    assert named <= set(PUBLISHED_DEMO_KEYS), f"demo keys missing from visioncap/demo_keys.py: {named}"
    # Each hash in an example file is a published key's, and the key its comment names.
    for path in sorted((REPO / "pipelines").glob("*.yaml")):
        for digest, comment in re.findall(r"sha256:\s*([0-9a-fA-F]{64})(.*)", path.read_text()):
            assert digest.lower() in DEMO_KEY_HASHES, f"{path.name}: {digest} is not a published demo key's hash"
            quoted = re.search(r'"([^"]+)"', comment)
            assert quoted and hash_key(quoted.group(1)) == digest.lower(), f"{path.name}: {comment.strip()}"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("LocalHost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.20", False),
        ("10.0.0.1", False),
        ("fe80::1", False),
        ("gateway", False),  # a name: what it resolves to can change
        ("localhost.example.com", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- docker compose -----------------------------------------------------------------------------------------


@pytest.mark.deploy
def test_compose_needs_keys_of_the_users_own() -> None:
    for name in KEYS:
        for value in (None, ""):  # unset, or left empty as in .env.example
            env = {key: val for key, val in KEYS.items() if key != name}
            if value is not None:
                env[name] = value
            result = compose("config", "-q", env=env, keys=False)
            assert result.returncode != 0, f"{name}={value!r}: accepted"
            assert f"required variable {name} is missing a value: set it in .env" in result.stderr, result.stderr
    result = compose("config", "-q", env_file=ENV_EXAMPLE, keys=False)
    assert result.returncode != 0, "the example env file is accepted as it is"
    required = "VLLM_API_KEY|VISIONCAP_CAPTIONS_KEY|VISIONCAP_ASK_KEY|VISIONCAP_ALERTS_KEY"
    assert re.search(rf"required variable ({required}) is missing", result.stderr), result.stderr
    # No default of any variable is a demo key (the captions key had one).
    assert not any(key in COMPOSE_FILE.read_text() for key in PUBLISHED_DEMO_KEYS)
    settings = dict(re.findall(r"^([A-Z][A-Z0-9_]*)=(.*)$", ENV_EXAMPLE.read_text(), flags=re.MULTILINE))
    assert settings["VLLM_API_KEY"] == settings["VISIONCAP_CAPTIONS_KEY"] == ""
    assert not set(settings.values()) & set(PUBLISHED_DEMO_KEYS)


@pytest.mark.deploy
def test_vllm_is_not_published_and_only_the_gateway_holds_its_key() -> None:
    services = resolved("postgres")["services"]
    vllm = services["vllm"]
    assert "ports" not in vllm and vllm["expose"] == ["8000"]
    published = {name: [port["target"] for port in service.get("ports", [])] for name, service in services.items()}
    assert {name: targets for name, targets in published.items() if targets} == {"gateway": [8080], "api": [8090]}

    secret = KEYS["VLLM_API_KEY"]
    assert vllm["environment"]["VLLM_API_KEY"] == secret  # vLLM reads it itself (envs.VLLM_API_KEY)
    assert secret not in json.dumps([vllm["entrypoint"], vllm["command"]])  # never on a command line
    gateway = services["gateway"]
    options = dict(itertools.pairwise(gateway["command"]))
    (upstream,) = load_gateway_config(Path(host_path(options["--config"], gateway))).upstreams
    assert upstream.base_url == "http://vllm:8000/v1" and upstream.api_key_env == "VLLM_API_KEY"
    assert gateway["environment"]["VLLM_API_KEY"] == secret
    assert {name for name, service in services.items() if secret in json.dumps(service)} == {"vllm", "gateway"}

    # Everything else reaches vLLM through the gateway, with the captions key.
    for name in ("pipeline", "api"):
        env = services[name]["environment"]
        assert env["VISIONCAP_VLM_BASE_URL"] == "http://gateway:8080/v1", name
        assert env["VISIONCAP_VLM_API_KEY"] == KEYS["VISIONCAP_CAPTIONS_KEY"], name
    assert [name for name, service in services.items() if "vllm:8000" in json.dumps(service)] == []


# --- the real commands ----------------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """This environment without the developer's visioncap settings or vLLM key, plus `extra`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("VISIONCAP_")}
    env.pop("VLLM_API_KEY", None)
    return {**env, **extra}


def refusal(args: list[str], env: dict[str, str], cwd: Path) -> str:
    """Run `visioncap ARGS`, which must exit with 2 before serving; its one line of stderr."""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "visioncap", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
            cwd=cwd,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"`visioncap {' '.join(args)}` still running after {TIMEOUT_S} s: it was not refused")
    assert result.returncode == 2, f"exit {result.returncode}: {result.stderr}"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def gateway_file(directory: Path, chat_key: str, base_url: str = "http://127.0.0.1:9/v1", **upstream: Any) -> Path:
    """A gateway file whose `chat-ui` key is `chat_key` and whose `captions` key is a fresh one."""
    path = directory / "gateway.yaml"
    raw = {
        "upstreams": [{"name": "vllm", "base_url": base_url, "metrics_poll_s": 0, **upstream}],
        "keys": [
            {"name": "chat-ui", "sha256": hash_key(chat_key), "traffic_class": "interactive"},
            {"name": "captions", "sha256": hash_key(FRESH_KEY + "-captions"), "traffic_class": "background"},
        ],
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_the_composition_roots_refuse_what_the_commands_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`build_gateway` / `build_api` hold the checks, so anything that builds the apps to serve them (not only the
    commands) is refused the same way, before a socket or the database is opened."""
    from visioncap.api.app import build_api
    from visioncap.config.api import ApiKey, ApiSettings
    from visioncap.gateway.app import build_gateway

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    keyed = load_gateway_config(gateway_file(tmp_path, FRESH_KEY, api_key_env="VLLM_API_KEY"))
    with pytest.raises(ConfigError, match=r"here: upstreams\.0\.api_key_env names VLLM_API_KEY, which is not set"):
        build_gateway(keyed, "127.0.0.1", "here")
    demo = load_gateway_config(gateway_file(tmp_path, DEMO_CHAT_KEY))
    with pytest.raises(ConfigError, match="key 'chat-ui' is a published demo key"):
        build_gateway(demo, "0.0.0.0", "here")
    assert build_gateway(demo, "127.0.0.1", "here").state.gateway is not None
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'api.db'}",
        api_keys=[ApiKey(name="ui", sha256=hash_key(DEMO_CAPTIONS_KEY))],
    )
    with pytest.raises(ConfigError, match="VISIONCAP_API_KEYS: key 'ui' is a published demo key"):
        build_api(settings, "0.0.0.0")
    assert not (tmp_path / "api.db").exists()


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1"])
def test_gateway_refuses_a_demo_key_off_loopback(host: str, tmp_path: Path) -> None:
    config = gateway_file(tmp_path, DEMO_CHAT_KEY)
    line = refusal(["gateway", "--config", str(config), "--host", host], child_env(), tmp_path)
    assert f"gateway file {config}: key 'chat-ui' is a published demo key, and --host {host}" in line
    assert "`visioncap gateway-key`" in line and "127.0.0.1" in line
    assert "captions" not in line and DEMO_CHAT_KEY not in line  # names the key, never the secret


def test_the_compose_gateway_file_as_shipped_is_refused(tmp_path: Path) -> None:
    """What compose runs until the user puts keys of their own into the gateway file."""
    config = REPO / "pipelines" / "compose-gateway.yaml"
    line = refusal(["gateway", "--config", str(config), "--host", "0.0.0.0"], child_env(VLLM_API_KEY="set"), tmp_path)
    assert "keys 'chat-ui', 'captions', 'alerts' are published demo keys" in line, line


def test_gateway_refuses_to_start_without_vllms_key(tmp_path: Path) -> None:
    config = gateway_file(tmp_path, FRESH_KEY, api_key_env="VLLM_API_KEY")
    for env in (child_env(), child_env(VLLM_API_KEY="")):
        line = refusal(["gateway", "--config", str(config)], env, tmp_path)
        assert "upstreams.0.api_key_env names VLLM_API_KEY, which is not set" in line, line


def test_gateway_with_the_demo_keys_serves_on_loopback(tmp_path: Path) -> None:
    """`visioncap gateway --config pipelines/gateway.example.yaml`, as the README runs it locally."""
    config = REPO / "pipelines" / "gateway.example.yaml"
    with serve_cli(["gateway", "--config", str(config), "--host", "127.0.0.1"], child_env(), cwd=tmp_path):
        pass


@pytest.mark.vllm
def test_gateway_with_its_own_keys_serves_on_all_interfaces_in_front_of_a_keyed_vllm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compose set-up on one machine: vLLM started by the launcher with VLLM_API_KEY in its environment, the
    gateway on 0.0.0.0 with keys of its own, sending vLLM's key from upstreams[].api_key_env."""
    secret = "test-vllm-key-" + os.urandom(8).hex()
    monkeypatch.setenv("VLLM_API_KEY", secret)  # the launcher hands its environment to vLLM
    port = free_port()
    server = VllmServer(
        load_profile("tiny", REPO / "models"),
        python=Settings().server_python,
        port=port,
        log_file=REPO / "test-artifacts" / f"vllm-keyed-{port}.log",
    )
    with server:
        root = server.base_url.removesuffix("/v1")
        assert httpx.get(f"{root}/health", timeout=10).status_code == 200  # compose's healthcheck needs no key
        assert httpx.get(f"{server.base_url}/models", timeout=10).status_code == 401
        config = gateway_file(tmp_path, FRESH_KEY, base_url=server.base_url, api_key_env="VLLM_API_KEY")
        env = child_env(VLLM_API_KEY=secret)
        with serve_cli(["gateway", "--config", str(config), "--host", "0.0.0.0"], env, cwd=tmp_path) as url:
            chat = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                headers={"Authorization": f"Bearer {FRESH_KEY}"},
                timeout=TIMEOUT_S,
            )
            assert chat.status_code == 200, chat.text
            assert httpx.get(f"{url}/v1/models", headers={"X-Api-Key": FRESH_KEY}, timeout=30).status_code == 200
            assert httpx.get(f"{url}/v1/models", headers={"X-Api-Key": secret}, timeout=30).status_code == 401


def api_env(tmp_path: Path, key: str) -> dict[str, str]:
    data = tmp_path / "data"
    return child_env(
        VISIONCAP_DATA_DIR=str(data),
        VISIONCAP_DATABASE_URL=f"sqlite:///{data / 'visioncap.db'}",
        VISIONCAP_API_KEYS=json.dumps(
            [
                {"name": "ops", "sha256": hash_key(FRESH_KEY), "scopes": ["read"]},
                {"name": "ui", "sha256": hash_key(key), "scopes": ["read"]},
            ]
        ),
        VISIONCAP_API_READY_CHECK_VLM="false",
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_api_refuses_a_demo_key_off_loopback(host: str, tmp_path: Path) -> None:
    line = refusal(["api", "--host", host], api_env(tmp_path, DEMO_CAPTIONS_KEY), tmp_path)
    assert f"VISIONCAP_API_KEYS: key 'ui' is a published demo key, and --host {host}" in line, line
    assert "`visioncap api-key`" in line and "ops" not in line and DEMO_CAPTIONS_KEY not in line


@pytest.mark.parametrize(("host", "key"), [("0.0.0.0", FRESH_KEY + "-ui"), ("127.0.0.1", DEMO_CAPTIONS_KEY)])
def test_api_serves_with_its_own_keys_anywhere_and_with_a_demo_key_on_loopback(
    host: str, key: str, tmp_path: Path
) -> None:
    with serve_cli(["api", "--host", host, "--create"], api_env(tmp_path, key), cwd=tmp_path) as url:
        answer = httpx.get(f"{url}/v1/cameras", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert answer.status_code == 200, answer.text
