"""A CLI that answers in one line (issue #43 item 5): the version, bad settings, a busy port, a mistyped key, an
unknown pipeline, and what an unset `analyze_fps` means. The version and the busy port run `visioncap` as a process
(what a user sees on stderr, uvicorn's output included); the others run the same Typer app in this process."""

from __future__ import annotations

import socket
from importlib.metadata import version
from pathlib import Path

import pytest
from helpers import invoke_cli, pipeline_dict, run_cli, write_pipeline
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from visioncap.config.loading import load_yaml_model
from visioncap.config.pipeline import PipelineConfig, load_pipeline
from visioncap.config.settings import load_settings
from visioncap.errors import ConfigError
from visioncap.store import create_db_engine
from visioncap.store.camera_configs import get_camera, list_cameras, seed_cameras
from visioncap.store.schema import ensure_schema

TIMEOUT = 120  # seconds; a bound on a broken test, never a measurement


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A fresh SQLite database and data folder of this test's own, and no .env (the working directory's)."""
    return {"VISIONCAP_DATA_DIR": str(tmp_path / "data"), "VISIONCAP_DATABASE_URL": f"sqlite:///{tmp_path / 'v.db'}"}


def test_version_is_the_installed_package_version() -> None:
    done = run_cli("--version", timeout=TIMEOUT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"visioncap {version('visioncap')}"


def test_bad_settings_are_one_line_per_variable(env: dict[str, str]) -> None:
    bad = {**env, "VISIONCAP_RETENTION_DAYS": "-1", "VISIONCAP_RETENTION_INTERVAL_S": "soon"}
    done = invoke_cli("captions", env=bad)
    assert done.returncode == 2
    lines = error_lines(done.stderr)
    assert len(lines) == 2, done.stderr  # pydantic's dump: a title, then 2 lines per field and a link each
    assert all(line.startswith("error: invalid VISIONCAP_* setting VISIONCAP_RETENTION_") for line in lines), lines
    assert "VISIONCAP_RETENTION_DAYS: Input should be greater than 0 (got '-1')" in lines[0]
    assert "VISIONCAP_RETENTION_INTERVAL_S:" in lines[1] and "'soon'" in lines[1]
    assert "pydantic.dev" not in done.stderr and "validation error" not in done.stderr


class TokenSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VISIONCAP_TEST_")

    upstream_token: SecretStr = Field(min_length=12, description="A credential.")
    label: str = Field(max_length=3, description="Not one.")


def test_a_secret_setting_is_named_but_its_value_is_not_repeated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIONCAP_TEST_UPSTREAM_TOKEN", "hunter2")
    monkeypatch.setenv("VISIONCAP_TEST_LABEL", "toolong")
    with pytest.raises(ConfigError) as caught:
        load_settings(TokenSettings)  # type: ignore[type-var]
    lines = str(caught.value).splitlines()
    assert len(lines) == 2 and "VISIONCAP_TEST_UPSTREAM_TOKEN: " in lines[0] and "hunter2" not in str(caught.value)
    assert "VISIONCAP_TEST_LABEL: " in lines[1] and "(got 'toolong')" in lines[1]


def test_api_on_a_busy_port_says_so_in_one_line(env: dict[str, str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = run_cli("api", "--port", str(port), env=env, timeout=TIMEOUT)
    assert done.returncode != 0
    lines = error_lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and f"port {port} on 127.0.0.1: address already in use" in lines[0]
    assert "--port" in lines[0]


@pytest.mark.parametrize(
    ("sections", "typo", "meant"),
    [
        ({"sources": [{"camera": "cam-1", "path": "VIDEO", "analyse_fps": 2}]}, "sources.0.analyse_fps", "analyze_fps"),
        ({"detector": {"wieghts": "x.pt"}}, "detector.wieghts", "weights"),
        ({"caption": {"max_token": 8}}, "caption.max_token", "max_tokens"),
        ({"sorces": []}, "sorces", "sources"),
    ],
)
def test_an_unknown_key_is_answered_with_the_closest_known_one(
    tmp_path: Path, sections: dict[str, object], typo: str, meant: str
) -> None:
    video = tmp_path / "door.mp4"
    video.write_bytes(b"not decoded here")
    data = pipeline_dict(video)
    for key, value in sections.items():
        if key == "sources":
            value = [{**source, "path": str(video)} for source in value]  # type: ignore[attr-defined]
        data[key] = {**data[key], **value} if isinstance(value, dict) else value
    path = write_pipeline(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_pipeline(path)
    assert f"{typo}: Extra inputs are not permitted; did you mean `{meant}`?" in str(caught.value)
    done = invoke_cli("run", str(path))
    assert done.returncode == 2 and f"did you mean `{meant}`?" in done.stderr, done.stderr
    assert len(error_lines(done.stderr)) == 1, done.stderr


def test_a_key_with_nothing_close_gets_no_guess(tmp_path: Path) -> None:
    video = tmp_path / "door.mp4"
    video.write_bytes(b"")
    path = write_pipeline(tmp_path, {**pipeline_dict(video), "zzzzzz": 1})
    with pytest.raises(ConfigError, match="zzzzzz: Extra inputs are not permitted") as caught:
        load_yaml_model(path, PipelineConfig, "pipeline file")
    assert "did you mean" not in str(caught.value)


def test_cameras_add_answers_a_mistyped_key_with_the_closest(env: dict[str, str]) -> None:
    args = ["cameras", "add", "yard", "--pipeline", "main", "--new-pipeline", "--kind", "rtsp"]
    done = invoke_cli(*args, "--url", "rtsp://cam.local/yard", "--set", "analyse_fps=2", env=env)
    assert done.returncode == 2
    assert error_lines(done.stderr) == [
        "error: source.analyse_fps: Extra inputs are not permitted; did you mean `analyze_fps`?"
    ]


def test_cameras_add_refuses_a_pipeline_the_database_does_not_know(env: dict[str, str], tmp_path: Path) -> None:
    engine = create_db_engine(env["VISIONCAP_DATABASE_URL"])
    ensure_schema(engine)
    url = ["--kind", "rtsp", "--url", "rtsp://cam.local/yard"]
    nothing = invoke_cli("cameras", "add", "yard", "--pipeline", "nosuch", *url, env=env)
    assert nothing.returncode == 2
    assert error_lines(nothing.stderr) == [
        "error: --pipeline: no pipeline 'nosuch' has run against this database (known: none); start its worker "
        "first, or pass --new-pipeline to add the camera for its first worker"
    ]
    assert list_cameras(engine) == []
    # What a worker of pipeline `main` does at start (none of its file's cameras, here): `main` is now known.
    seed_cameras(engine, "main", [])
    typo = invoke_cli("cameras", "add", "yard", "--pipeline", "mian", *url, env=env)
    assert typo.returncode == 2 and "(known: main); did you mean `main`?" in typo.stderr, typo.stderr
    assert list_cameras(engine) == []
    added = invoke_cli("cameras", "add", "yard", "--pipeline", "main", *url, env=env)
    assert added.returncode == 0, added.stderr
    # Before any worker of it ran, on purpose: the camera waits for its first worker.
    early = invoke_cli("cameras", "add", "door", "--pipeline", "lobby", "--new-pipeline", *url, env=env)
    assert early.returncode == 0, early.stderr
    stored = get_camera(engine, "door")
    assert stored is not None and stored.config.pipeline == "lobby"
    # A pipeline with cameras is known too.
    second = invoke_cli("cameras", "add", "gate", "--pipeline", "lobby", *url, env=env)
    assert second.returncode == 0, second.stderr


def test_cameras_list_says_what_an_unset_analyze_fps_means(env: dict[str, str], tmp_path: Path) -> None:
    engine = create_db_engine(env["VISIONCAP_DATABASE_URL"])
    ensure_schema(engine)
    video = tmp_path / "door.mp4"
    video.write_bytes(b"not decoded here")
    sources = [{"camera": "door", "path": str(video)}]
    seed_cameras(engine, "main", list(load_pipeline(write_pipeline(tmp_path, pipeline_dict(video))).sources))
    seed_cameras(
        engine,
        "files",
        list(load_pipeline(write_pipeline(tmp_path, {**pipeline_dict(video), "sources": sources})).sources),
    )
    url = ["--kind", "rtsp", "--url", "rtsp://cam.local/yard"]
    assert invoke_cli("cameras", "add", "yard", "--pipeline", "main", *url, env=env).returncode == 0
    listed = invoke_cli("cameras", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") > 2}
    assert "every frame" in rows["door"], listed.stdout  # a file: frame by frame
    assert "detector's pace" in rows["yard"], listed.stdout  # a stream: as fast as the detector keeps up
    assert "│ 5 " in rows["cam-1"], listed.stdout  # a rate that is set is shown as it is
    assert " all " not in listed.stdout
