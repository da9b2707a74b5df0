"""`visioncap serve` and `python -m visioncap.serve`: one command line that plans, prints or starts vLLM for a
profile.

Both entries run `main` here with what their environment says (the models folder, the server's Python); the
second needs only pydantic, PyYAML and httpx, which vLLM's own image has, so docker-compose runs the same
launcher inside the official vLLM image.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from visioncap.config.profiles import ModelProfile, load_profile
from visioncap.config.serve import ServeOptions
from visioncap.errors import VisioncapError
from visioncap.serve import costmodel
from visioncap.serve.gpu_cards import CardFigures
from visioncap.serve.launcher import ServerError, VllmServer
from visioncap.serve.plan import PlanError, ServingPlan, plan_serving

FORMATS = ("shell", "json")
# The command line's flag for each ServeOptions field it sets; errors naming a field say the flag instead.
FLAGS: dict[str, str] = {
    "profile": "--profile",
    "models_dir": "--models-dir",
    "host": "--host",
    "port": "--port",
    "gpu": "--gpu",
    "gpu_memory_gib": "--gpu-memory-gib",
    "detector_gib": "--detector-gib",
    "headroom_gib": "--headroom-gib",
    "aliases": "--served-model-alias",
    "dry_run": "--dry-run",
}


def flag_naming(field: str, value: object = None, /) -> str:
    """A ServeOptions field as the command line says it (`--gpu`, `--gpu CLASS`, `--dry-run`)."""
    flag = FLAGS.get(field, field)
    return flag if value is None or isinstance(value, bool) else f"{flag} {value}"


def command_line(prog: str, models_dir: Path) -> argparse.ArgumentParser:
    """The serve command line; defaults and help are the ServeOptions fields', `models_dir` the environment's."""
    fields = ServeOptions.model_fields

    def option(field: str, **kwargs: Any) -> None:
        info = fields[field]
        parser.add_argument(FLAGS[field], dest=field, default=info.default, help=info.description, **kwargs)

    parser = argparse.ArgumentParser(
        prog=prog,
        description="Start vLLM for a model profile, wait until healthy, and stop it cleanly on Ctrl-C or SIGTERM.",
    )
    option("profile")
    parser.add_argument("--models-dir", type=Path, default=models_dir, help=fields["models_dir"].description)
    option("host")
    option("port", type=int)
    option("gpu")
    option("gpu_memory_gib", type=float)
    option("detector_gib", type=float)
    option("headroom_gib", type=float)
    parser.add_argument(
        FLAGS["aliases"],
        dest="aliases",
        action="append",
        default=[],
        metavar="NAME",
        help=fields["aliases"].description,
    )
    parser.add_argument(
        FLAGS["dry_run"],
        dest="dry_run",
        action="store_true",
        help="Print the vLLM command (stdout) and the plan (stderr), start nothing.",
    )
    parser.add_argument("--format", choices=FORMATS, default=FORMATS[0], help="Dry-run output: the command or JSON.")
    return parser


def main(argv: Sequence[str] | None, prog: str, models_dir: Path, python: Path) -> int:
    """Parse `argv`, then plan and start (or describe) the server; the exit code. Errors are one line on stderr.

    `models_dir` is --models-dir's default and `python` the server environment's interpreter, both from the
    entry's environment.
    """
    args = command_line(prog, models_dir).parse_args(argv)
    options = ServeOptions(
        profile=args.profile,
        models_dir=args.models_dir,
        python=python,
        host=args.host,
        port=args.port,
        gpu=args.gpu,
        gpu_memory_gib=args.gpu_memory_gib,
        detector_gib=args.detector_gib,
        headroom_gib=args.headroom_gib,
        dry_run=args.dry_run,
        aliases=tuple(args.aliases),
    )
    try:
        server = planned_server(options)
        print_report(server)
        if options.dry_run:
            print(describe(server, args.format))
            return 0
        return serve_foreground(server)
    except PlanError as exc:
        print(f"error: {exc.naming(flag_naming)}", file=sys.stderr)
        return exc.exit_code
    except VisioncapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


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
        plan.report.extend(cost_report(plan.served_profile(profile), plan.gpu_class, plan.card))
    return VllmServer(
        profile,
        python=options.python,
        host=options.host,
        port=options.port,
        log_file=options.log_file,
        plan=plan,
        aliases=options.aliases,
    )


def cost_report(profile: ModelProfile, gpu_class: str, card: CardFigures | None = None) -> list[str]:
    """The cost model's lines for the plan's report, or the one line saying why there is none. `card`: a card
    outside the classes, whose own figures replace the class's."""
    try:
        cost = costmodel.for_profile(profile, gpu_class, gpu=card.spec if card else None)
        return costmodel.report_lines(cost, profile.model)
    except LookupError as exc:
        return [f"cost model: none ({exc})"]


def cost_dict(server: VllmServer) -> dict[str, Any] | None:
    """The cost model as JSON-ready data; None where the class or the model has no figures."""
    if server.plan is None:
        return None
    plan = server.plan
    try:
        profile = plan.served_profile(server.profile)
        return costmodel.for_profile(profile, plan.gpu_class, gpu=plan.card.spec if plan.card else None).to_dict()
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
                # A card outside the classes: its figures and every number the plan assumed for it.
                "gpu": plan.card.to_dict() if plan and plan.card else None,
                "assumed": plan.assumed if plan else [],
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
