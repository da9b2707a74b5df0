"""The `visioncap` command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from visioncap.bench.cli import bench_app
from visioncap.bench.tune.cli import tune_command
from visioncap.cameras_cli import cameras_app
from visioncap.config.settings import Settings, load_settings
from visioncap.errors import ConfigError, VisioncapError

if TYPE_CHECKING:
    from visioncap.config.worker import WorkerConfig

app = typer.Typer(help="Turns camera streams into searchable captions.", no_args_is_help=True, add_completion=False)
app.add_typer(bench_app, name="bench")
app.add_typer(cameras_app, name="cameras")
app.command("tune")(tune_command)
err = Console(stderr=True)


def _version(wanted: bool) -> None:
    if wanted:
        from visioncap import __version__

        typer.echo(f"visioncap {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Turns camera streams into searchable captions."""


log = logging.getLogger("visioncap")
# Loopback by default: /metrics tells whoever reaches it the cameras' names and the pipeline's state.
METRICS_HOST_HELP = (
    "Address the metrics port listens on: 0.0.0.0 in a container or pod, so that probes and scrapers from outside "
    "it reach /healthz, /readyz and /metrics."
)


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
        int | None,
        typer.Option(help="Serve Prometheus metrics, /healthz and /readyz on this port while running."),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help=METRICS_HOST_HELP)] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run a pipeline until its sources end (files) or until Ctrl-C/SIGTERM (live cameras)."""
    _setup_logging(log_level)
    _run_pipeline(pipeline, progress, serve=serve, metrics_port=metrics_port, metrics_host=metrics_host)


@app.command()
def worker(
    pipeline: Annotated[
        Path, typer.Option(help="Pipeline YAML file: its models and settings, and cameras to seed.", readable=False)
    ],
    capacity: Annotated[int, typer.Option(help="Most cameras this worker runs.")] = 4,
    lease_s: Annotated[
        float, typer.Option(help="Seconds a camera lease holds unrenewed: how soon live workers take a dead one's.")
    ] = 15.0,
    renew_s: Annotated[float, typer.Option(help="Seconds between lease renewals.")] = 3.0,
    progress: Annotated[str, typer.Option(help="`rich`, `log` or `none`; default by terminal.")] = "auto",
    metrics_port: Annotated[
        int | None,
        typer.Option(help="Serve Prometheus metrics, /healthz and /readyz on this port while running."),
    ] = None,
    metrics_host: Annotated[str, typer.Option(help=METRICS_HOST_HELP)] = "127.0.0.1",
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Run the cameras of a pipeline shared with other workers (PostgreSQL leases) until Ctrl-C/SIGTERM."""
    _setup_logging(log_level)
    from pydantic import ValidationError

    from visioncap.config.worker import WorkerConfig

    try:
        # The margin stays below the lease, so that short leases (tests, small fleets) are valid too.
        worker_config = WorkerConfig(
            capacity=capacity, lease_s=lease_s, renew_s=renew_s, stop_margin_s=min(2.0, lease_s / 5)
        )
    except ValidationError as exc:
        raise ConfigError(f"visioncap worker: {exc.errors()[0]['msg']}") from None
    _run_pipeline(pipeline, progress, metrics_port=metrics_port, metrics_host=metrics_host, worker=worker_config)


def _run_pipeline(
    pipeline: Path,
    progress: str,
    *,
    serve: str | None = None,
    metrics_port: int | None = None,
    metrics_host: str = "127.0.0.1",
    worker: WorkerConfig | None = None,
) -> None:
    from visioncap.config.pipeline import load_pipeline

    # A bad file or setting is reported before the slow imports (the model client, YOLO, SQLAlchemy).
    settings = load_settings()
    config = load_pipeline(pipeline)
    if progress not in ("auto", "rich", "log", "none"):
        raise ConfigError(f"--progress must be auto, rich, log or none, not {progress!r}")
    mode = ("rich" if sys.stderr.isatty() else "log") if progress == "auto" else progress
    from visioncap.pipeline.preflight import check_video_files

    # A file that is no video: said before vLLM, the VLM check and the detector load (exit 2 when nothing is left).
    for problem in check_video_files(config):
        typer.echo(f"warning: {problem}; the other sources run", err=True)
    from visioncap.pipeline.compose import build_pipeline, stop_on_signals
    from visioncap.pipeline.progress import Progress

    with build_pipeline(
        config,
        settings,
        base_dir=pipeline.parent,
        serve=serve,
        metrics_port=metrics_port,
        metrics_host=metrics_host,
        worker=worker,
    ) as running:
        stop_on_signals(running)
        with Progress(mode, running.summary, lambda: running.outbox_depth):
            summary = running.run()
    typer.echo(summary.line())
    if summary.fatal is not None:
        err.print(f"error: {summary.fatal}", markup=False, highlight=False, soft_wrap=True)
    for error in summary.source_errors:
        err.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
    if summary.pending:
        err.print(f"{summary.pending} captions still pending; the next run captions them first", markup=False)
    if not summary.ok:
        raise typer.Exit(1)


# The options are the launcher's own command line (visioncap.serve.command), which `python -m visioncap.serve` runs
# too: one definition, whose defaults are ServeOptions'. Click hands every argument, --help included, to it.
@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve_command(ctx: typer.Context) -> None:
    """Start vLLM for a model profile, wait until healthy, and stop it cleanly on Ctrl-C or SIGTERM (options:
    visioncap serve --help)."""
    _setup_logging("INFO")
    from visioncap.serve.command import main as serve_main

    settings = load_settings()
    code = serve_main(ctx.args, prog="visioncap serve", models_dir=settings.models_dir, python=settings.server_python)
    raise typer.Exit(code)


def _check_port(host: str, port: int, command: str) -> None:
    """A port another process holds, said in one line before the web stack loads (uvicorn would start, then print
    a multi-line error). A process binding it between this check and uvicorn's still gets uvicorn's error."""
    import errno
    import socket

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError):
        return  # a host that does not resolve: uvicorn's to report
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: a TIME_WAIT is no holder
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise VisioncapError(
                    f"port {port} on {host}: address already in use by another process "
                    f"(another `visioncap {command}`?); stop it or choose another with --port"
                ) from None


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

    gateway_config = load_gateway_config(config)
    source = f"gateway file {config}"
    from visioncap.gateway.safety import check_gateway_can_serve

    check_gateway_can_serve(gateway_config, host, source)  # before the web stack loads: a refusal comes at once
    _check_port(host, port, "gateway")
    from visioncap.gateway import run_gateway

    run_gateway(gateway_config, host=host, port=port, log_level=log_level, source=source)


@app.command("gateway-key")
def gateway_key_command() -> None:
    """Print a new random gateway API key and the sha256 to put in the gateway file."""
    from visioncap.config.keys import generate_key

    key, digest = generate_key("vc-")
    typer.echo(f"key:    {key}\nsha256: {digest}")


def _database(settings: Settings) -> str:
    """The database a command uses, as it may be shown (no password), and where that came from."""
    from visioncap.store.database import masked_url

    source = "VISIONCAP_DATABASE_URL" if settings.database_url else "the default, VISIONCAP_DATA_DIR/visioncap.db"
    return f"{masked_url(settings.resolved_database_url())} ({source})"


def _require_database(settings: Settings, command: str, create_option: bool = False) -> None:
    """A SQLite file that does not exist is an error for a command that reads: connecting would make an empty one,
    and a mistyped path would look like a database with nothing stored."""
    from visioncap.store.database import missing_sqlite_file

    missing = missing_sqlite_file(settings.resolved_database_url())
    if missing is None:
        return
    folder = "" if missing.parent.is_dir() else f" (nor does its folder {missing.parent})"
    demo = Path("data/demo.db").resolve()
    hints = ["`visioncap run` makes it"]
    if demo.is_file() and demo != missing:
        hints.append(f"`make demo`'s is VISIONCAP_DATABASE_URL=sqlite:///{demo}")
    if create_option:
        hints.append("--create starts an empty one")
    raise ConfigError(f"visioncap {command}: database {_database(settings)} does not exist{folder}; {'; '.join(hints)}")


@app.command("api")
def api_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8090,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
    create: Annotated[
        bool,
        typer.Option(
            "--create",
            help="Make the SQLite database (and its folder) if it does not exist, for an API started before the "
            "pipeline's first run; without it a missing file is an error, not a new empty database.",
        ),
    ] = False,
) -> None:
    """Serve the REST API and web page over the caption database until Ctrl-C/SIGTERM."""
    _setup_logging(log_level)
    from visioncap.config.api import ApiSettings

    settings = load_settings(ApiSettings)
    from visioncap.api.safety import check_api_can_serve

    check_api_can_serve(settings, host)  # before the web stack loads: a refusal comes at once
    _check_port(host, port, "api")
    if not create:
        _require_database(settings, "api", create_option=True)
    shown_host = f"[{host}]" if ":" in host else host
    typer.echo(f"visioncap api: database {_database(settings)}, page http://{shown_host}:{port}/", err=True)
    from visioncap.api import run_api

    run_api(settings, host=host, port=port, log_level=log_level)


@app.command("alerts")
def alerts_command(
    config: Annotated[Path, typer.Option("--config", help="Alerts YAML file (see pipelines/alerts.example.yaml).")],
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port (127.0.0.1) while running.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "INFO",
) -> None:
    """Evaluate alert rules on every stored caption and deliver alerts (webhooks, MQTT) until Ctrl-C/SIGTERM."""
    _setup_logging(log_level)
    from visioncap.config.alerts import load_alerts_config

    settings = load_settings()
    alerts_config = load_alerts_config(config)
    from visioncap.alerts.service import run_alerts

    run_alerts(alerts_config, settings, metrics_port)


@app.command("api-key")
def api_key_command(
    name: Annotated[str, typer.Option(help="Who holds the key.")] = "ui",
    write: Annotated[bool, typer.Option(help="Also allow POST routes (regenerate).")] = False,
    camera: Annotated[
        list[str] | None,
        typer.Option(help="Limit the key to this camera; repeat for several. Left out: every camera."),
    ] = None,
) -> None:
    """Print a new API key and the VISIONCAP_API_KEYS entry (its sha256) to configure."""
    import json

    from pydantic import ValidationError

    from visioncap.config.api import ApiKey
    from visioncap.config.keys import generate_key

    key, digest = generate_key("vca-")
    scopes = ["read", "write"] if write else ["read"]
    values: dict[str, object] = {"name": name, "sha256": digest, "scopes": scopes}
    if camera:
        values["cameras"] = list(dict.fromkeys(camera))
    try:  # an entry the API would refuse at start is refused now
        ApiKey.model_validate(values)
    except ValidationError as exc:
        raise typer.BadParameter(exc.errors()[0]["msg"], param_hint="--name/--camera") from None
    entry = json.dumps(values)
    typer.echo(f"key:    {key}\nsha256: {digest}\nentry:  {entry}")


@app.command()
def captions(
    camera: Annotated[str | None, typer.Option(help="Only this camera.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many, newest first.")] = 20,
) -> None:
    """Print stored captions, newest first."""
    from visioncap.store import CaptionStore, create_db_engine

    settings = load_settings()
    _require_database(settings, "captions")
    typer.echo(f"database {_database(settings)}", err=True)
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

    settings = load_settings()
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


@app.command("embed")
def embed_command(
    batch: Annotated[int, typer.Option(min=1, max=1024, help="Captions per transaction.")] = 64,
) -> None:
    """Write the semantic-search vector of every captioned row that has none (a backfill; safe to run again).

    The API does the same in the background when VISIONCAP_API_SEMANTIC_SEARCH is on."""
    from visioncap.store import CaptionStore, create_db_engine
    from visioncap.store.embeddings import TextEmbedder
    from visioncap.store.vectors import backfill

    settings = load_settings()
    store = CaptionStore(create_db_engine(settings.resolved_database_url()))
    store.create_schema()
    # Every core: a backfill is the one thing this process does.
    typer.echo(f"embed: {backfill(store.engine, TextEmbedder(threads=None), batch)} captions embedded")


@app.command("make-demo-video")
def make_demo_video_command(
    path: Annotated[Path, typer.Argument(help="Where to write the video (.mp4).")] = Path("data/demo.mp4"),
) -> None:
    """Write the demo video: photos with people from the ultralytics wheel between empty stretches."""
    from visioncap.demo_video import FPS, make_demo_video

    segments = make_demo_video(path)
    people = [f"{s.start / FPS:.1f}-{s.end / FPS:.1f} s" for s in segments if s.has_people]
    typer.echo(f"{path}: {segments[-1].end} frames at {FPS} fps; people at {', '.join(people)}")


def report_error(exc: VisioncapError) -> int:
    """Say what went wrong in one line on stderr (one per problem, when it names several); the exit code for it."""
    for line in str(exc).splitlines() or [""]:
        err.print(f"error: {line}", markup=False, highlight=False, soft_wrap=True)
    return exc.exit_code


def main() -> None:
    try:
        app()
    except VisioncapError as exc:
        sys.exit(report_error(exc))
    except KeyboardInterrupt:
        sys.exit(130)
