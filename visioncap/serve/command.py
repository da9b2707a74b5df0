"""`visioncap serve` and `python -m visioncap.serve`: plan, print or start vLLM for a profile.

Both entries share this module; the second needs only pydantic, PyYAML and httpx, which vLLM's own image
has, so docker-compose runs the same launcher inside the official vLLM image.
"""

from __future__ import annotations

import json
import shlex
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from visioncap.serve import costmodel
from visioncap.serve.launcher import ServerError, VllmServer
from visioncap.serve.plan import DEFAULT_DETECTOR_GIB, DEFAULT_HEADROOM_GIB, ServingPlan, plan_serving
from visioncap.serve.profiles import ModelProfile, load_profile

FORMATS = ("shell", "json")


@dataclass
class ServeOptions:
    """What a serve invocation asked for."""

    profile: str
    models_dir: Path
    python: Path
    host: str = "127.0.0.1"
    port: int = 8000
    gpu: str = "auto"
    gpu_memory_gib: float | None = None
    detector_gib: float = DEFAULT_DETECTOR_GIB
    headroom_gib: float = DEFAULT_HEADROOM_GIB
    dry_run: bool = False
    log_file: Path | None = None
    aliases: tuple[str, ...] = ()


def planned_server(options: ServeOptions) -> VllmServer:
    """The server for the options' profile, with the GPU class and memory split decided."""
    profile = load_profile(options.profile, options.models_dir)
    plan: ServingPlan = plan_serving(
        profile,
        gpu=options.gpu,
        gpu_memory_gib=options.gpu_memory_gib,
        detector_gib=options.detector_gib,
        headroom_gib=options.headroom_gib,
        dry_run=options.dry_run,
    )
    if options.dry_run:
        # A dry run is where one sizes a deployment: say what steps, frames and chat prompts will cost there.
        plan.report.extend(cost_report(profile, plan.gpu_class))
    return VllmServer(
        profile,
        python=options.python,
        host=options.host,
        port=options.port,
        log_file=options.log_file,
        plan=plan,
        aliases=options.aliases,
    )


def cost_report(profile: ModelProfile, gpu_class: str) -> list[str]:
    """The cost model's lines for the plan's report, or the one line saying why there is none."""
    try:
        return costmodel.report_lines(costmodel.for_profile(profile, gpu_class), profile.model)
    except LookupError as exc:
        return [f"cost model: none ({exc})"]


def cost_dict(server: VllmServer) -> dict[str, Any] | None:
    """The cost model as JSON-ready data; None where the class or the model has no figures."""
    if server.plan is None:
        return None
    try:
        return costmodel.for_profile(server.profile, server.plan.gpu_class).to_dict()
    except LookupError:
        return None


def describe(server: VllmServer, output_format: str = "shell") -> str:
    """The dry-run output: the command (shell) or the command with the plan (json)."""
    plan = server.plan
    if output_format == "json":
        return json.dumps(
            {
                "profile": server.profile.name,
                "served_model_name": server.profile.served_model_name,
                "command": server.command(),
                "env": server.profile.env,
                "gpu_class": plan.gpu_class if plan else None,
                "gpu_memory_utilization": plan.gpu_memory_utilization if plan else None,
                "total_gib": plan.total_gib if plan else None,
                "report": plan.report if plan else [],
                "cost_model": cost_dict(server),
            },
            indent=2,
        )
    return shlex.join(server.command())


def print_report(server: VllmServer) -> None:
    if server.plan is None:
        return
    for line in server.plan.report:
        print(f"serve: {line}", file=sys.stderr, flush=True)


def serve_foreground(server: VllmServer) -> int:
    """Start vLLM, wait for /health, forward SIGTERM, stop it with its workers; vLLM's exit code."""
    server.start()
    stopping = False

    def _forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        server.send_signal(signum)

    signal.signal(signal.SIGTERM, _forward)
    try:
        took = server.wait_ready()
        print(
            f"vLLM ready at {server.base_url} (model {server.profile.served_model_name}) in {took:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        code = server.wait()
    except KeyboardInterrupt:
        code = 0
    except ServerError:
        # Stopped while starting (docker stop during a long weights download): not a failure.
        if not stopping:
            raise
        code = 0
    finally:
        server.stop()
    return code
