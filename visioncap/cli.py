"""The `visioncap` command."""

from __future__ import annotations

import logging
import os
import signal
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from visioncap.bench.cli import bench_app
from visioncap.bench.tune.cli import tune_command
from visioncap.errors import ConfigError, VisioncapError
from visioncap.settings import Settings

if TYPE_CHECKING:
    from visioncap.serve import VllmServer

app = typer.Typer(help="Turns camera streams into searchable captions.", no_args_is_help=True, add_completion=False)
app.add_typer(bench_app, name="bench")
app.command("tune")(tune_command)
err = Console(stderr=True)
log = logging.getLogger("visioncap")


def _settings() -> Settings:
    try:
        return Settings()
    except Exception as exc:  # pydantic's ValidationError, already naming the variable
        raise ConfigError(f"invalid VISIONCAP_* setting: {exc}") from exc


def _setup_logging(level: str) -> None:
    from visioncap.redact import MaskingFormatter

    # Camera URLs can reach a line from where no call site masks them (an exception's text, a traceback, another
    # library's message): the formatter masks credentials in whatever is written.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(MaskingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # One line per HTTP request drowns the pipeline's own log.
    for noisy in ("httpx", "httpx2", "httpcore", "openai"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


@app.command()
def run(
    # readable=False: click would refuse an unreadable file in a box of several lines; the loader says it in one.
    pipeline: Annotated[Path, typer.Argument(help="Pipeline YAML file.", readable=False)],
    serve: Annotated[
        str | None,
        typer.Option(help="Start this model profile's vLLM server for the duration of the run (on a free port)."),
    ] = None,
    progress: Annotated[
        str, typer.Option(help="`rich` live table, `log` lines every 10 s (services), or `none`; default by terminal.")
    ] = "auto",
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port (127.0.0.1) while running.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a pipeline until its sources end (files) or until Ctrl-C/SIGTERM (live cameras)."""
    _setup_logging(log_level)
    from visioncap.config.pipeline import load_pipeline

    # A bad file or setting is reported before the slow imports (the model client, YOLO, SQLAlchemy).
    settings = _settings()
    config = load_pipeline(pipeline)
    from visioncap.caption.client import VlmCaptioner
    from visioncap.detect.yolo import PersonDetector
    from visioncap.pipeline.progress import Progress
    from visioncap.pipeline.runner import PipelineRunner
    from visioncap.store import CaptionStore, create_db_engine

    if progress not in ("auto", "rich", "log", "none"):
        raise ConfigError(f"--progress must be auto, rich, log or none, not {progress!r}")
    mode = ("rich" if sys.stderr.isatty() else "log") if progress == "auto" else progress
    base_url = config.vlm.base_url or settings.vlm_base_url
    with ExitStack() as stack:
        if serve is not None:
            server = _server_for(serve, settings, port=None)
            if server.profile.served_model_name != config.vlm.model:
                raise ConfigError(
                    f"{pipeline}: vlm.model is {config.vlm.model!r} but profile {serve!r} serves "
                    f"{server.profile.served_model_name!r}"
                )
            log.info("starting vLLM (profile %s) on %s; log in %s", serve, server.base_url, server.log_file)
            stack.enter_context(server)
            base_url = server.base_url
        store = CaptionStore(create_db_engine(settings.resolved_database_url()))
        store.create_schema()
        from visioncap.pipeline.metrics import PipelineMetrics
        from visioncap.store.retention import RetentionJob

        metrics = PipelineMetrics()
        # Sweeps run here as well as in `visioncap api`: a pipeline alone keeps its database bounded too.
        retention = stack.enter_context(RetentionJob.from_settings(store.engine, settings, metrics.retention))
        captioner = VlmCaptioner(config.vlm, config.caption, base_url, settings.vlm_api_key.get_secret_value())
        captioner.check_ready()
        detector = PersonDetector(config.detector, base_dir=pipeline.parent)
        # A frame that cannot be saved for lack of space wakes retention (VISIONCAP_RETENTION_MIN_FREE_MB).
        runner = PipelineRunner(
            config, detector, captioner, store, settings.data_dir, metrics, on_disk_full=retention.wake
        )
        if metrics_port is not None:
            from visioncap.pipeline.health import HealthServer

            stack.enter_context(HealthServer(runner.readiness, metrics, port=metrics_port))

        def _stop(_signum: int, _frame: object) -> None:
            log.info("stopping: sources close, pending captions stay pending for the next run")
            runner.stop()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        with Progress(mode, runner.summary, lambda: runner.outbox.depth):
            summary = runner.run()
    typer.echo(summary.line())
    for error in summary.source_errors:
        err.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
    if summary.pending:
        err.print(f"{summary.pending} captions still pending; the next run captions them first", markup=False)
    if not summary.ok:
        raise typer.Exit(1)


def _server_for(profile_name: str, settings: Settings, port: int | None, host: str = "127.0.0.1") -> VllmServer:
    from visioncap.serve import free_port
    from visioncap.serve.command import ServeOptions, planned_server

    chosen = port if port is not None else free_port()
    options = ServeOptions(profile_name, settings.models_dir, settings.server_python, host=host, port=chosen)
    server = planned_server(options)
    server.log_file = settings.data_dir / "logs" / f"vllm-{server.profile.name}-{chosen}.log"
    return server


@app.command("serve")
def serve_command(
    profile: Annotated[str, typer.Option(help="Model profile name (models/NAME.yaml) or a profile file.")] = "tiny",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    gpu: Annotated[
        str, typer.Option(help="GPU class: auto (nvidia-smi; cpu without a GPU), cpu, l4, a10, a100, h100, h200.")
    ] = "auto",
    gpu_memory_gib: Annotated[
        float | None, typer.Option(help="Total GPU memory in GiB instead of nvidia-smi's (dry runs elsewhere).")
    ] = None,
    detector_gib: Annotated[float, typer.Option(help="GPU memory kept for the YOLO detector, GiB.")] = 1.5,
    headroom_gib: Annotated[float, typer.Option(help="GPU memory kept free besides, GiB.")] = 1.0,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the vLLM command (stdout) and the plan (stderr), start nothing.")
    ] = False,
    output_format: Annotated[str, typer.Option("--format", help="Dry-run output: shell or json.")] = "shell",
    served_model_alias: Annotated[
        list[str] | None, typer.Option(help="A further model name clients may send (repeatable).")
    ] = None,
) -> None:
    """Start vLLM for a model profile, wait until healthy, and stop it cleanly on Ctrl-C or SIGTERM."""
    _setup_logging("INFO")
    from visioncap.serve.command import FORMATS, ServeOptions, describe, planned_server, print_report, serve_foreground

    if output_format not in FORMATS:
        raise ConfigError(f"--format must be one of {', '.join(FORMATS)}, not {output_format!r}")
    settings = _settings()
    options = ServeOptions(
        profile,
        settings.models_dir,
        settings.server_python,
        host=host,
        port=port,
        gpu=gpu,
        gpu_memory_gib=gpu_memory_gib,
        detector_gib=detector_gib,
        headroom_gib=headroom_gib,
        dry_run=dry_run,
        aliases=tuple(served_model_alias or ()),
    )
    # In the foreground, vLLM's own output is the log.
    server = planned_server(options)
    print_report(server)
    if dry_run:
        typer.echo(describe(server, output_format))
        return
    raise typer.Exit(serve_foreground(server))


@app.command("gateway")
def gateway_command(
    config: Annotated[Path, typer.Option("--config", help="Gateway YAML file (see pipelines/gateway.example.yaml).")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run the priority gateway (OpenAI-compatible) in front of vLLM until Ctrl-C/SIGTERM."""
    _setup_logging(log_level)
    from visioncap.config.gateway import load_gateway_config
    from visioncap.demo_keys import refuse_demo_keys

    gateway_config = load_gateway_config(config)
    refuse_demo_keys(
        host,
        ((key.name, key.sha256) for key in gateway_config.keys),
        f"gateway file {config}",
        "make your own with `visioncap gateway-key` and put its sha256 in the file",
    )
    env = gateway_config.upstream.api_key_env
    # Started without it, every forwarded request would come back 401 from vLLM, long after the cause.
    if env and not os.environ.get(env):
        raise ConfigError(
            f"{config}: upstream.api_key_env names {env}, which is not set: set it to the key vLLM was started "
            "with (--api-key or VLLM_API_KEY)"
        )
    from visioncap.gateway import serve

    serve(gateway_config, host=host, port=port, log_level=log_level)


@app.command("gateway-key")
def gateway_key_command() -> None:
    """Print a new random gateway API key and the sha256 to put in the gateway file."""
    from visioncap.config.keys import generate_key

    key, digest = generate_key("vc-")
    typer.echo(f"key:    {key}\nsha256: {digest}")


@app.command("api")
def api_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8090,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Serve the REST API and web page over the caption database until Ctrl-C/SIGTERM."""
    _setup_logging(log_level)
    from visioncap.api.settings import ApiSettings
    from visioncap.demo_keys import refuse_demo_keys

    try:
        settings = ApiSettings()
    except Exception as exc:  # pydantic's ValidationError, already naming the variable
        raise ConfigError(f"invalid VISIONCAP_* setting: {exc}") from exc
    refuse_demo_keys(
        host,
        ((key.name, key.sha256) for key in settings.api_keys),
        "VISIONCAP_API_KEYS",
        "make your own with `visioncap api-key` and put its entry in VISIONCAP_API_KEYS",
    )
    from visioncap.api import serve

    serve(settings, host=host, port=port, log_level=log_level)


@app.command("api-key")
def api_key_command(
    name: Annotated[str, typer.Option(help="Who holds the key.")] = "ui",
    write: Annotated[bool, typer.Option(help="Also allow POST routes (regenerate).")] = False,
) -> None:
    """Print a new API key and the VISIONCAP_API_KEYS entry (its sha256) to configure."""
    import json

    from visioncap.config.keys import generate_key

    key, digest = generate_key("vca-")
    scopes = ["read", "write"] if write else ["read"]
    entry = json.dumps({"name": name, "sha256": digest, "scopes": scopes})
    typer.echo(f"key:    {key}\nsha256: {digest}\nentry:  {entry}")


@app.command()
def captions(
    camera: Annotated[str | None, typer.Option(help="Only this camera.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many, newest first.")] = 20,
) -> None:
    """Print stored captions, newest first."""
    from visioncap.store import CaptionStore, create_db_engine

    settings = _settings()
    store = CaptionStore(create_db_engine(settings.resolved_database_url()))
    store.create_schema()
    rows = store.list(camera=camera, limit=limit)
    table = Table(title=f"{len(rows)} stored captions (newest first)")
    for column in ("id", "camera", "captured (UTC)", "people", "status", "reason", "tokens in/out", "caption"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row.id),
            row.camera,
            row.captured_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-4],
            str(row.people_count),
            row.status,
            row.reason,
            f"{row.prompt_tokens}/{row.completion_tokens}",
            row.caption if row.caption is not None else f"[red]{row.error}[/red]",
        )
    Console(width=160).print(table)


@app.command("retention")
def retention_command(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")] = False,
) -> None:
    """Delete rows older than VISIONCAP_RETENTION_DAYS (per camera: ..._CAMERA_DAYS) and their images, once; then
    the oldest finished rows while free space is below VISIONCAP_RETENTION_MIN_FREE_MB."""
    from visioncap.store import CaptionStore, create_db_engine
    from visioncap.store.retention import RetentionPolicy, sweep

    settings = _settings()
    policy = RetentionPolicy.from_settings(settings)
    if not policy.enabled:
        typer.echo(
            "retention: not configured (VISIONCAP_RETENTION_DAYS, VISIONCAP_RETENTION_CAMERA_DAYS, "
            "VISIONCAP_RETENTION_MIN_FREE_MB); kept all"
        )
        return
    store = CaptionStore(create_db_engine(settings.resolved_database_url()))
    store.create_schema()
    typer.echo(f"retention policy: {policy.describe()}")
    typer.echo(sweep(store.engine, settings.data_dir, policy, dry_run=dry_run).line())


@app.command("make-demo-video")
def make_demo_video_command(
    path: Annotated[Path, typer.Argument(help="Where to write the video (.mp4).")] = Path("data/demo.mp4"),
) -> None:
    """Write the demo video: photos with people from the ultralytics wheel between empty stretches."""
    from visioncap.demo_video import FPS, make_demo_video

    segments = make_demo_video(path)
    people = [f"{s.start / FPS:.1f}-{s.end / FPS:.1f} s" for s in segments if s.has_people]
    typer.echo(f"{path}: {segments[-1].end} frames at {FPS} fps; people at {', '.join(people)}")


def main() -> None:
    try:
        app()
    except VisioncapError as exc:
        err.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
