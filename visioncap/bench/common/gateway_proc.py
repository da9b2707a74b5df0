"""The gateway as its own process (`python -m visioncap gateway --config FILE`), as it runs in production.

In the load generator's process it would share one event loop and one core with the clients that measure it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import httpx
import yaml

from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import generate_key, hash_key
from visioncap.serve.ports import PortTakenError, bind_refused, check_own, free_port

# Starts of one gateway on fresh ports when other processes took them (each a collision of two random picks).
PORT_TRIES = 3


def gateway_config(
    upstream_base_url: str,
    interactive_key: str,
    background_key: str,
    background_priority: int,
    objectives: dict[str, Any],
    background: dict[str, Any],
    controller: dict[str, Any],
    max_tokens_per_image: int,
    pacing: dict[str, Any] | None = None,
    realtime_priority: int | None = None,
    alert: dict[str, Any] | None = None,
) -> GatewayConfig:
    """A gateway with one interactive and one background key, validated as `visioncap gateway` would;
    `pacing`: the pacing section (None: its defaults); `realtime_priority`: process.realtime_priority; `alert`:
    an alert class too, its `key`, `priority` and `deadline_s`."""
    classes: dict[str, Any] = {
        "interactive": {"role": "interactive", "priority": 0},
        "background": {"role": "background", "priority": background_priority},
    }
    keys = [
        {"name": "bench-chat", "sha256": hash_key(interactive_key), "traffic_class": "interactive"},
        {"name": "bench-captions", "sha256": hash_key(background_key), "traffic_class": "background"},
    ]
    if alert is not None:
        classes["alert"] = {"role": "alert", "priority": alert["priority"], "deadline_s": alert["deadline_s"]}
        keys.append({"name": "bench-alerts", "sha256": hash_key(alert["key"]), "traffic_class": "alert"})
    return GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": upstream_base_url, "metrics_poll_s": 0.5}],
            "classes": classes,
            "keys": keys,
            "objectives": objectives,
            "background": background,
            "controller": controller,
            "images": {"max_tokens_per_image": max_tokens_per_image},
            **({} if pacing is None else {"pacing": pacing}),
            "process": {"realtime_priority": realtime_priority},
        }
    )


def new_key() -> str:
    """A fresh key for one benchmark's gateway (config.keys makes every key: one way to generate them)."""
    return generate_key("bench-")[0]


class GatewayProcess:
    """`with GatewayProcess(config, workdir) as gw:` runs `visioncap gateway` on a free port."""

    def __init__(self, config: GatewayConfig, workdir: Path, name: str = "gateway", python: str | None = None):
        self.config = config
        self.workdir = workdir
        self.name = name
        self.python = python or sys.executable
        self.port = free_port()
        self.config_path = workdir / f"{name}.yaml"
        self.log_path = workdir / f"{name}.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def base_url(self) -> str:
        return f"{self.root_url}/v1"

    def start(self, timeout_s: float = 60.0) -> None:
        """Starts the gateway and waits until it answers /healthz; where another process took the port meanwhile
        (see visioncap.serve.ports), starts it again on a new one, at most PORT_TRIES times."""
        for attempt in range(1, PORT_TRIES + 1):
            try:
                self._start_once(timeout_s)
                return
            except PortTakenError:
                self.stop()
                if attempt == PORT_TRIES:
                    raise
                self.port = free_port()

    def _start_once(self, timeout_s: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        data = self.config.model_dump(mode="json", exclude_defaults=True)
        self.config_path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        self._log = self.log_path.open("ab")
        logged = self.log_path.stat().st_size
        self._process = subprocess.Popen(
            [
                *(self.python, "-m", "visioncap", "gateway", "--config", str(self.config_path)),
                *("--port", str(self.port), "--log-level", "warning"),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        give_up = time.monotonic() + timeout_s
        with httpx.Client(timeout=2) as client:
            while True:
                if self._process.poll() is not None:
                    with self.log_path.open("rb") as log:
                        log.seek(logged)
                        said = log.read().decode(errors="replace")
                    taken = bind_refused(self.port, said)
                    if taken is not None:
                        raise taken
                    raise RuntimeError(f"gateway exited with {self._process.returncode}; see {self.log_path}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{self.root_url}/healthz").status_code == 200:
                        check_own(self._process.pid, self.port)  # not another gateway's /healthz
                        return
                if time.monotonic() > give_up:
                    self.stop()
                    raise TimeoutError(f"gateway not healthy within {timeout_s:.0f} s; see {self.log_path}")
                time.sleep(0.1)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.root_url}/metrics", timeout=10).text

    def stop(self, grace_s: float = 15.0) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> GatewayProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
