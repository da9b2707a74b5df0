"""A broken pipeline file exits 2 with one line naming the file, the field and the problem."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import pipeline_dict, run_cli, write_pipeline

from visioncap.config import load_pipeline
from visioncap.config.api import ApiSettings
from visioncap.config.settings import Settings, load_settings
from visioncap.errors import ConfigError


@pytest.fixture
def video(tmp_path: Path) -> Path:
    # Only existence is checked before any frame is read.
    path = tmp_path / "clip.mp4"
    path.write_bytes(b"not decoded by these tests")
    return path


def test_valid_file_loads_and_anchors_relative_paths(tmp_path: Path, video: Path) -> None:
    data = pipeline_dict(Path("clip.mp4"))
    config = load_pipeline(write_pipeline(tmp_path, data))
    assert config.sources[0].path == video.resolve()
    assert config.detector.person_classes == [0, 1]
    assert config.vlm.extra_body == {"ignore_eos": True}


def test_shipped_demo_pipeline_is_valid(tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[1] / "pipelines" / "demo.yaml"
    text = demo.read_text().replace("../data/demo.mp4", "clip.mp4")
    (tmp_path / "clip.mp4").write_bytes(b"x")
    config = load_pipeline(write_pipeline(tmp_path, text))
    assert config.vlm.model == "visioncap-tiny"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"detector": {"weightz": "x.pt"}}, "detector.weightz: Extra inputs are not permitted"),
        ({"caption": {"max_tokens": "many"}}, "caption.max_tokens: Input should be a valid integer"),
        ({"detector": {"confidence": 1.5}}, "detector.confidence: Input should be less than or equal to 1"),
        ({"selection": {"min_interval_s": -1}}, "selection.min_interval_s: Input should be greater than or equal to 0"),
        ({"sources": [{"camera": "c", "kind": "ftp", "url": "x"}]}, "sources.0: kind must be one of file, rtsp"),
        ({"sources": [{"camera": "c", "kind": "rtsp"}]}, "sources.0.url: Field required"),
        ({"caption": {"image_mode": "zoom"}}, "caption.image_mode: Input should be 'full', 'boxes' or 'crop'"),
        ({"vlm": {"base_url": "ftp://x"}}, "vlm.base_url: String should match pattern"),
        ({"sources": []}, "sources: List should have at least 1 item"),
    ],
)
def test_invalid_fields_are_named(tmp_path: Path, video: Path, change: dict, expected: str) -> None:
    path = write_pipeline(tmp_path, pipeline_dict(video, **change))
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert str(path) in str(info.value)
    assert expected in str(info.value)


def test_missing_required_section(tmp_path: Path, video: Path) -> None:
    data = pipeline_dict(video)
    del data["vlm"]
    with pytest.raises(ConfigError, match="vlm: Field required"):
        load_pipeline(write_pipeline(tmp_path, data))


def test_duplicate_camera_ids(tmp_path: Path, video: Path) -> None:
    data = pipeline_dict(video)
    data["sources"] = data["sources"] * 2
    with pytest.raises(ConfigError, match="camera id 'cam-1' is used by more than one source"):
        load_pipeline(write_pipeline(tmp_path, data))


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("unknown", "unknown field"),
        ("wrong_type", "caption.max_tokens: Input should be a valid integer"),
        ("missing_video", "sources.0.path: video file"),
        ("bad_yaml", "invalid YAML at line 3, column 1"),
        ("not_a_mapping", "must be a mapping"),
        ("no_file", "cannot read pipeline file"),
    ],
)
def test_cli_exits_2_with_one_line(tmp_path: Path, video: Path, content: str, expected: str) -> None:
    path = tmp_path / "p.yaml"
    if content == "unknown":
        write_pipeline(tmp_path, pipeline_dict(video, selection={"every_frame": True}), "p.yaml")
        expected = "selection.every_frame: Extra inputs are not permitted"
    elif content == "wrong_type":
        write_pipeline(tmp_path, pipeline_dict(video, caption={"max_tokens": "lots"}), "p.yaml")
    elif content == "missing_video":
        write_pipeline(tmp_path, pipeline_dict(tmp_path / "nowhere.mp4"), "p.yaml")
    elif content == "bad_yaml":
        path.write_text("name: x\nsources: [unclosed\n")
    elif content == "not_a_mapping":
        path.write_text("- just\n- a list\n")
    result = run_cli("run", str(path))
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["production-example.yaml"])
def test_shipped_live_pipelines_are_valid(name: str) -> None:
    config = load_pipeline(Path(__file__).resolve().parents[1] / "pipelines" / name)
    assert all(source.kind in ("rtsp", "http") for source in config.sources)
    assert config.detector.weights == "yolo26n.pt"


@pytest.mark.parametrize(
    ("kind", "variable", "value"),
    [
        (Settings, "VISIONCAP_RETENTION_DAYS", "-1"),  # refused by the field's bound
        (ApiSettings, "VISIONCAP_API_KEYS", "not json"),  # refused before validation: not the JSON a list needs
    ],
)
def test_a_bad_setting_is_one_config_error_naming_the_setting(
    kind: type[Settings], variable: str, value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no .env
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match="invalid VISIONCAP_\\* setting") as caught:
        load_settings(kind)
    assert variable.removeprefix("VISIONCAP_").lower() in str(caught.value).lower()


def test_configuration_is_one_package_that_depends_on_no_other_part_of_visioncap() -> None:
    """Every configuration area is a module of visioncap.config, and they all load without the launcher, the
    benchmarks or the web stacks: those import configuration, never the other way round (the model profile's
    tuning record once pulled in visioncap.bench)."""
    code = (
        "import sys, pkgutil, importlib, visioncap.config as c\n"
        "names = sorted(m.name for m in pkgutil.iter_modules(c.__path__))\n"
        "for name in names: importlib.import_module('visioncap.config.' + name)\n"
        "print(' '.join(names))\n"
        "print(' '.join(sorted(n for n in sys.modules if n.startswith(('visioncap.bench', 'visioncap.serve', "
        "'visioncap.api', 'visioncap.gateway', 'visioncap.pipeline')))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    modules, imported = [*done.stdout.splitlines(), ""][:2]
    assert {"api", "gateway", "keys", "pipeline", "profiles", "serve", "settings", "tuned"} <= set(modules.split())
    assert imported == ""
