"""`visioncap cameras`: add, list, change, pause, resume and remove the cameras workers run.

It writes the database directly (VISIONCAP_DATABASE_URL, like `visioncap captions`), through the same checks as
the API: a running worker picks the change up within 5 s. Cameras added here are network cameras (rtsp, http; file,
folder and webcam sources come from a pipeline file), at a host VISIONCAP_CAMERA_ALLOWED_HOSTS allows when it is
set. URLs may not hold secrets inline; reference them as `${VISIONCAP_CAMERA_SECRET_NAME}`, an environment variable
of the worker, as the whole password or the whole value of a credential parameter.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from visioncap.config.cameras import CameraChange, CameraConfig, SubmittedCamera
from visioncap.config.loading import describe
from visioncap.config.settings import load_settings
from visioncap.config.sources import SourceConfig, field_path
from visioncap.errors import ConfigError
from visioncap.redact import mask_credentials

if TYPE_CHECKING:
    from sqlalchemy import Engine

cameras_app = typer.Typer(help="Cameras as data: what running workers read (changes apply within 5 s).")

Settings = Annotated[
    list[str] | None,
    typer.Option("--set", help="Another source field, KEY=VALUE (repeatable): --set read_timeout_s=2."),
]
Selection = Annotated[list[str] | None, typer.Option("--selection", help="Selection override KEY=VALUE (repeatable).")]
Caption = Annotated[
    list[str] | None,
    typer.Option("--caption", help="Image override KEY=VALUE (repeatable): --caption jpeg_quality=70."),
]
Kind = Annotated[str | None, typer.Option(help="Source kind: rtsp or http (others only from a pipeline file).")]
Url = Annotated[
    str | None,
    typer.Option(help="Stream URL; a password as ${VISIONCAP_CAMERA_SECRET_NAME}, the worker's environment variable."),
]
SourcePath = Annotated[
    str | None,
    typer.Option("--path", help="A video file or image folder: refused (those come from a pipeline file only)."),
]
Fps = Annotated[
    float | None,
    typer.Option(help="Frames per second to analyse; left out: as fast as the detector keeps up."),
]


def _engine() -> Engine:
    from visioncap.store import create_db_engine
    from visioncap.store.schema import ensure_schema

    engine = create_db_engine(load_settings().resolved_database_url())
    ensure_schema(engine)
    return engine


def _pairs(option: str, items: list[str] | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items or []:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"{option} {mask_credentials(item)!r}: expected KEY=VALUE")
        # YAML scalars, as in a pipeline file: 2 is a number, true a boolean, null nothing.
        values[key.strip()] = yaml.safe_load(value) if value.strip() else value
    return values


def _source(
    kind: str | None, url: str | None, path: str | None, fps: float | None, extra: list[str] | None
) -> dict[str, Any]:
    fields: dict[str, Any] = {"kind": kind, "url": url, "path": path, "analyze_fps": fps}
    return {key: value for key, value in fields.items() if value is not None} | _pairs("--set", extra)


def _invalid(exc: ValidationError, model: type[CameraConfig] = SubmittedCamera) -> ConfigError:
    return ConfigError(describe(exc.errors()[0], field_path, model))  # a typo's key answered with the closest


def _check_host(url: str | None) -> None:
    problem: str | None = load_settings().camera_hosts().url_problem(url) if url is not None else None
    if problem:
        raise ConfigError(f"--url: {problem}")


def known_pipelines(engine: Engine) -> list[str]:
    """The pipelines this database knows: each that seeded it (every `visioncap run` and `visioncap worker` seeds
    its file's cameras at start, none included; so does `visioncap cameras apply`), and each that has cameras."""
    from sqlalchemy import select, union
    from sqlalchemy.orm import Session

    from visioncap.store.records import CameraConfigRecord, PipelineSeedRecord

    names = union(select(PipelineSeedRecord.pipeline), select(CameraConfigRecord.pipeline))
    with Session(engine) as session:
        return sorted(session.scalars(select(names.subquery().c.pipeline)))


def _check_pipeline(engine: Engine, pipeline: str) -> None:
    """A camera for a pipeline no worker runs would never run: a typo, most likely."""
    known = known_pipelines(engine)
    if pipeline in known:
        return
    close = difflib.get_close_matches(pipeline, known, n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    raise ConfigError(
        f"--pipeline: no pipeline {pipeline!r} has run against this database (known: {', '.join(known) or 'none'}); "
        f"{hint}start its worker first, or pass --new-pipeline to add the camera for its first worker"
    )


def _show(config: CameraConfig, version: int, what: str) -> None:
    typer.echo(f"camera {config.camera} {what} (pipeline {config.pipeline}, config version {version})")


@cameras_app.command("add")
def add(
    camera: Annotated[str, typer.Argument(help="Camera id.")],
    pipeline: Annotated[str, typer.Option(help="Name of the pipeline whose worker runs it.")],
    kind: Kind = None,
    url: Url = None,
    path: SourcePath = None,
    analyze_fps: Fps = None,
    option: Settings = None,
    selection: Selection = None,
    caption: Caption = None,
    paused: Annotated[bool, typer.Option(help="Add it paused.")] = False,
    new_pipeline: Annotated[
        bool,
        typer.Option(help="The pipeline has not run against this database yet: its first worker will run the camera."),
    ] = False,
) -> None:
    """Add a camera; the pipeline's running worker starts it within 5 s."""
    from visioncap.store.camera_configs import CameraExists, add_camera

    source = {"camera": camera, **_source(kind, url, path, analyze_fps, option)}
    try:
        config = SubmittedCamera.model_validate(
            {
                "pipeline": pipeline,
                "source": source,
                "selection": _pairs("--selection", selection),
                "caption": _pairs("--caption", caption),
                "paused": paused,
            }
        )
    except ValidationError as exc:
        raise _invalid(exc) from None
    _check_host(url)
    engine = _engine()
    if not new_pipeline:
        _check_pipeline(engine, pipeline)
    try:
        stored = add_camera(engine, config)
    except CameraExists:
        raise ConfigError(f"camera {camera} exists; change it with `visioncap cameras update`") from None
    _show(stored.config, stored.version, "added")


def _change(camera: str, change: CameraChange, what: str) -> None:
    from visioncap.store.camera_configs import get_camera, update_camera

    engine = _engine()
    current = get_camera(engine, camera)
    if current is None:
        raise ConfigError(f"no camera {camera} is configured")
    try:
        config = change.applied_to(current.config)
    except ValidationError as exc:
        raise _invalid(exc, CameraConfig) from None
    stored = update_camera(engine, config, expected_version=current.version)
    if stored is None:
        raise ConfigError(f"camera {camera} was changed or removed meanwhile; try again")
    _show(stored.config, stored.version, what)


@cameras_app.command("update")
def update(
    camera: Annotated[str, typer.Argument(help="Camera id.")],
    kind: Kind = None,
    url: Url = None,
    path: SourcePath = None,
    analyze_fps: Fps = None,
    option: Settings = None,
    selection: Selection = None,
    caption: Caption = None,
) -> None:
    """Change a camera's source fields or replace its overrides; its worker restarts it alone within 5 s."""
    source = _source(kind, url, path, analyze_fps, option)
    _check_host(source.get("url"))
    change = CameraChange(
        source=source or None,
        selection=_pairs("--selection", selection) if selection else None,
        caption=_pairs("--caption", caption) if caption else None,
    )
    _change(camera, change, "changed")


@cameras_app.command("pause")
def pause(camera: Annotated[str, typer.Argument(help="Camera id.")]) -> None:
    """Stop reading a camera but keep it configured."""
    _change(camera, CameraChange(paused=True), "paused")


@cameras_app.command("resume")
def resume(camera: Annotated[str, typer.Argument(help="Camera id.")]) -> None:
    """Read a paused camera again."""
    _change(camera, CameraChange(paused=False), "resumed")


@cameras_app.command("remove")
def remove(camera: Annotated[str, typer.Argument(help="Camera id.")]) -> None:
    """Remove a camera's configuration (its captions stay); its worker stops it within 5 s."""
    from visioncap.store.camera_configs import remove_camera

    if not remove_camera(_engine(), camera):
        raise ConfigError(f"no camera {camera} is configured")
    typer.echo(f"camera {camera} removed")


@cameras_app.command("apply")
def apply(
    pipeline_file: Annotated[Path, typer.Argument(help="The pipeline file whose cameras to apply.")],
) -> None:
    """Make this pipeline file's cameras the ones its workers follow, whatever version of it they started with.

    Workers seed their file's cameras when they start, and skip a version older than the newest one seen (a pod
    still on the old file must not revert a rollout). Going back to an older version on purpose is this command."""
    from visioncap.config.pipeline import load_pipeline
    from visioncap.store.camera_configs import seed_cameras

    config = load_pipeline(pipeline_file)
    outcome = seed_cameras(_engine(), config.name, list(config.sources), force=True)
    typer.echo(f"pipeline {config.name}: {len(config.sources)} file cameras {outcome}")


def _fps(source: SourceConfig) -> str:
    """The analysis rate as it is run: without `analyze_fps`, a file or folder is analysed frame by frame and a
    stream as fast as the detector keeps up (StreamSourceConfig.analyze_fps)."""
    if source.analyze_fps is not None:
        return f"{source.analyze_fps:g}"
    return "every frame" if source.kind in ("file", "folder") else "detector's pace"


@cameras_app.command("list")
def list_command(
    pipeline: Annotated[str | None, typer.Option(help="Only this pipeline's cameras.")] = None,
) -> None:
    """Print the configured cameras, URLs masked."""
    from visioncap.store.camera_configs import list_cameras

    cameras = list_cameras(_engine(), pipeline)
    table = Table(title=f"{len(cameras)} configured cameras")
    for column in ("camera", "pipeline", "kind", "source", "fps", "paused", "origin", "version"):
        table.add_column(column, overflow="fold")
    for stored in cameras:
        source = stored.config.source
        table.add_row(
            stored.camera,
            stored.config.pipeline,
            source.kind,
            source.description,
            _fps(source),
            "yes" if stored.config.paused else "no",
            stored.origin,
            str(stored.version),
        )
    Console(width=160).print(table)
