"""Every malformed pipeline file is refused with one line naming the file, the field and the problem (exit 2).

Each case is checked through `load_pipeline` (fast, in-process); cases marked `cli` also run the real
`visioncap run FILE` in a child process, which must exit 2 with exactly one line on stderr before it loads
the detector or contacts the VLM (whose URL here is a closed port: reaching it would exit 1, not 2).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import missing, pipeline_dict, start_cli, write_pipeline

from visioncap.config import load_pipeline
from visioncap.errors import ConfigError

PASSWORD = "s3cret-pw"


def _video(tmp: Path) -> Path:
    # Only the file's existence and readability are checked before any frame is read.
    path = tmp / "clip.mp4"
    path.write_bytes(b"not decoded by these tests")
    return path


def _with(**sections: Any) -> Callable[[Path], Path]:
    """A builder for the test pipeline with `sections` merged over it (see helpers.pipeline_dict)."""

    def make(tmp: Path) -> Path:
        return write_pipeline(tmp, pipeline_dict(_video(tmp), **sections))

    return make


def _source(**fields: Any) -> Callable[[Path], Path]:
    """A builder for the test pipeline whose only source is `fields` (camera cam-1 unless given)."""
    return _with(sources=[{"camera": "cam-1", **fields}])


def _text(content: str | bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "pipeline.yaml"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return make


def _missing(tmp: Path) -> Path:
    return tmp / "nowhere.yaml"


def _directory(tmp: Path) -> Path:
    path = tmp / "pipeline.yaml"
    path.mkdir()
    return path


def _fifo(tmp: Path) -> Path:
    # Reading a FIFO blocks until a writer appears: even root cannot read it, so it stands for "unreadable".
    path = tmp / "pipeline.yaml"
    os.mkfifo(path)
    return path


def _dangling_link(tmp: Path) -> Path:
    path = tmp / "pipeline.yaml"
    path.symlink_to(tmp / "deleted.yaml")
    return path


def _video_is_directory(tmp: Path) -> Path:
    (tmp / "videos").mkdir()
    return write_pipeline(tmp, pipeline_dict(Path("videos")))


def _empty_video(tmp: Path) -> Path:
    (tmp / "empty.mp4").touch()
    return write_pipeline(tmp, pipeline_dict(Path("empty.mp4")))


def _folder_is_file(tmp: Path) -> Path:
    _video(tmp)
    return write_pipeline(
        tmp, pipeline_dict(Path("x"), sources=[{"camera": "c", "kind": "folder", "path": "clip.mp4"}])
    )


def _duplicate_cameras(tmp: Path) -> Path:
    data = pipeline_dict(_video(tmp))
    data["sources"] = [data["sources"][0], {"camera": "cam-1", "kind": "rtsp", "url": "rtsp://cam/x"}]
    return write_pipeline(tmp, data)


def _duplicate_key(tmp: Path) -> Path:
    path = _with()(tmp)
    # A second `vlm:` section at the end: YAML would silently drop the first one.
    path.write_text(path.read_text() + "vlm:\n  model: other\n", encoding="utf-8")
    return path


_BILLION_LAUGHS = (
    "name: x\nvlm: {model: m}\nsources: [{camera: c, path: clip.mp4}]\n"
    + "a0: &a0 [x, x, x, x, x, x, x, x]\n"
    + "".join(
        f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]\n"
        for i in range(1, 9)
    )
)


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], Path]
    expected: tuple[str, ...]  # each must be in the message, besides the file's path
    cli: bool = False  # also run `visioncap run FILE` as a child process
    cli_only: bool = False  # would block an in-process read on code that lacks the check (a FIFO)
    absent: tuple[str, ...] = ()  # must not be in the message (a password)


CASES = [
    # The file itself.
    Case("missing_file", _missing, ("cannot read pipeline file: no such file",)),
    Case("directory_as_file", _directory, ("cannot read pipeline file: it is a directory",), cli=True),
    Case("fifo", _fifo, ("cannot read pipeline file: it is a FIFO",), cli=True, cli_only=True),
    Case("dangling_symlink", _dangling_link, ("cannot read pipeline file: it is a broken symbolic link",)),
    Case("empty", _text(""), ("the pipeline file is empty",), cli=True),
    Case("only_comments", _text("# nothing yet\n\n"), ("the pipeline file is empty",)),
    Case("top_level_list", _text("- name: x\n- vlm: y\n"), ("must be a mapping of fields", "got a list")),
    Case("top_level_scalar", _text("just some words\n"), ("must be a mapping of fields", "got a string")),
    Case("top_level_number", _text("42\n"), ("must be a mapping of fields", "got a number")),
    Case(
        "random_bytes",
        _text(random.Random(11).randbytes(4096)),
        ("must be UTF-8 text", "is not UTF-8 (is it a binary file?)"),
        cli=True,
    ),
    Case("latin1_text", _text("name: caf\xe9\n".encode("latin-1")), ("byte 0xe9 at line 1, column 10 is not UTF-8",)),
    Case("nul_character", _text("name: a\x00b\n"), ("invalid YAML at line 1, column 8: character U+0000",)),
    Case("too_large", _text("#" * (1024 * 1024 + 1)), ("a pipeline file is at most 1024 KiB",)),
    # YAML.
    Case("unclosed_bracket", _text("name: x\nsources: [unclosed\n"), ("invalid YAML at line 3, column 1",)),
    Case("bad_indentation", _text("name: x\n  vlm: y\n"), ("invalid YAML at line 2", "mapping values are not allowed")),
    Case("two_documents", _text("name: a\n---\nname: b\n"), ("invalid YAML", "expected a single document")),
    Case("unknown_tag", _text("name: !!python/name:os.system x\n"), ("invalid YAML at line 1", "constructor")),
    Case("bad_explicit_int", _text("name: !!int abc\n"), ("invalid YAML value",)),
    Case("undefined_alias", _text("name: *nothing\n"), ("invalid YAML at line 1", "undefined alias")),
    Case("duplicate_key", _duplicate_key, ("vlm: key given twice (lines", "silently keep only the last")),
    Case("alias_bomb", _text(_BILLION_LAUGHS), ("a5: more than 100000 values once YAML aliases are expanded",)),
    Case("recursive_alias", _text("name: x\nvlm: &v {model: m, extra_body: *v}\n"), ("vlm.extra_body", "recursive")),
    Case("deep_nesting", _text("vlm:\n  extra_body: {a: " + "[" * 100 + "]" * 100 + "}\n"), ("nested more than 64",)),
    # Fields.
    Case("unknown_key", _with(detector={"wieghts": "x.pt"}), ("detector.wieghts: Extra inputs are not permitted",)),
    Case("wrong_type", _with(caption={"max_tokens": "many"}), ("caption.max_tokens: Input should be a valid integer",)),
    Case("sources_not_a_list", _with(sources="rtsp://cam/x"), ("sources: Input should be a valid list",)),
    Case("source_not_a_mapping", _with(sources=["rtsp://cam/x"]), ("sources: item 0 must be a mapping",)),
    Case(
        "infinite_timeout", _with(vlm={"timeout_s": float("inf")}), ("vlm.timeout_s: Input should be a finite number",)
    ),
    Case("nan_rate", _source(path="clip.mp4", analyze_fps="nan"), ("sources.0.analyze_fps: Input should be a finite",)),
    Case("bad_camera_id", _source(camera="cam 1", path="clip.mp4"), ("sources.0.camera: String should match pattern",)),
    Case(
        "duplicate_camera",
        _duplicate_cameras,
        ("sources: camera id 'cam-1' is used by more than one source (sources.0 and sources.1)",),
        cli=True,
    ),
    Case("vlm_url_without_host", _with(vlm={"base_url": "http:///v1"}), ("vlm.base_url: has no host name",)),
    # Video files and image folders.
    Case(
        "video_is_directory",
        _video_is_directory,
        ("sources.0.path: video file", "is a directory, not a video file"),
        cli=True,
    ),
    Case("video_missing", _source(path="gone.mp4"), ("sources.0.path: video file", "gone.mp4 does not exist")),
    Case("video_empty", _empty_video, ("sources.0.path: video file", "empty.mp4 is empty")),
    Case("video_path_blank", _source(path=""), ("sources.0.path: must not be empty",)),
    Case("folder_is_file", _folder_is_file, ("sources.0.path: image folder", "is a file, not a folder")),
    Case("folder_missing", _source(kind="folder", path="frames"), ("sources.0.path: image folder", "does not exist")),
    # Stream URLs.
    Case(
        "rtsp_with_ftp_url",
        _source(kind="rtsp", url="ftp://cam/stream"),
        ("sources.0.url: scheme ftp:// is not accepted for kind rtsp, expected rtsp:// or rtsps://",),
        cli=True,
    ),
    Case("rtsp_with_http_url", _source(kind="rtsp", url="http://cam/mjpeg"), ("sources.0.url", "use `kind: http`")),
    Case("http_with_rtsp_url", _source(kind="http", url="rtsp://cam/x"), ("sources.0.url", "for kind http")),
    Case("http_with_file_url", _source(kind="http", url="file:///etc/passwd"), ("sources.0.url: scheme file://",)),
    Case("url_without_scheme", _source(kind="rtsp", url="192.0.2.1/stream"), ("sources.0.url: is not a URL",)),
    Case("url_without_host", _source(kind="rtsp", url="rtsp:///stream"), ("sources.0.url: has no host name",)),
    Case("url_port_range", _source(kind="rtsp", url="rtsp://cam:99999/x"), ("sources.0.url: has an invalid port",)),
    Case("url_with_space", _source(kind="http", url="http://cam/my stream"), ("sources.0.url: contains spaces",)),
    Case(
        "password_with_slash",
        _source(kind="rtsp", url=f"rtsp://admin:{PASSWORD}/x@cam/stream"),
        ("sources.0.url: has an invalid port", "percent-encode"),
        absent=(PASSWORD,),
    ),
    Case("webcam_with_url", _source(kind="webcam", url="rtsp://cam/x"), ("sources.0.url: a webcam is a device index",)),
    Case("unknown_kind", _source(kind="ftp", url="ftp://cam/x"), ("sources.0: kind must be one of file, rtsp",)),
]


def _check_message(message: str, path: Path, case: Case) -> None:
    assert "\n" not in message, message
    assert str(path) in message, message
    for fragment in case.expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    for fragment in case.absent:
        assert fragment not in message, message


@pytest.mark.parametrize("case", [c for c in CASES if not c.cli_only], ids=lambda c: c.id)
def test_load_pipeline_refuses_with_one_line(tmp_path: Path, case: Case) -> None:
    path = case.make(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_pipeline(path)
    assert info.value.exit_code == 2
    _check_message(str(info.value), path, case)


CLI_CASES = [c for c in CASES if c.cli]


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[Path, subprocess.Popen[str]]]]:
    """`visioncap run FILE` for every `cli` case, all started at once: start-up imports dominate and overlap."""
    runs = {}
    for case in CLI_CASES:
        tmp = tmp_path_factory.mktemp(case.id)
        path = case.make(tmp)
        env = {"VISIONCAP_DATA_DIR": str(tmp / "data"), "VISIONCAP_VLM_BASE_URL": "http://127.0.0.1:9/v1"}
        runs[case.id] = (path, start_cli("run", str(path), env=env))
    yield runs
    for _, process in runs.values():
        if process.poll() is None:  # a run that hung (reading a FIFO) and failed its test
            process.kill()
        process.communicate()


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.id)
def test_cli_exits_2_with_one_line(cli_runs: dict[str, tuple[Path, subprocess.Popen[str]]], case: Case) -> None:
    path, process = cli_runs[case.id]
    _, stderr = process.communicate(timeout=120)  # a loaded 2-core machine; a FIFO read never ends
    assert process.returncode == 2, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].strip(), stderr
    assert lines[0].startswith("error: "), stderr
    _check_message(lines[0], path, case)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    path = _with()(tmp_path)
    path.chmod(0)
    if os.geteuid() != 0:
        with pytest.raises(ConfigError, match="cannot read pipeline file: Permission denied"):
            load_pipeline(path)
        return
    # Root reads a chmod 000 file through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: the CLI runs without them (still
    # uid 0, so the environment stays reachable), where the permission bits bind as they do for any user.
    setpriv = "/usr/bin/setpriv"
    if not os.path.exists(setpriv):
        missing("setpriv", "apt-get install -y util-linux")
    done = subprocess.run(
        [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-m", "visioncap",
         "run", str(path)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "VISIONCAP_DATA_DIR": str(tmp_path / "data")},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {path}: cannot read pipeline file: Permission denied"], (
        done.stderr
    )


@pytest.mark.parametrize(
    ("source", "url"),
    [
        ({"kind": "rtsp", "url": "rtsp://viewer:pa%2Fss@192.0.2.10:554/stream1"}, None),
        ({"kind": "rtsp", "url": "rtsps://cam.example/live?channel=1"}, None),
        ({"kind": "rtsp", "url": "rtsp://[2001:db8::1]:8554/x"}, None),
        ({"kind": "rtsp", "url": "RTSP://cam/x"}, "rtsp://cam/x"),  # FFmpeg needs the scheme in lower case
        ({"kind": "http", "url": "https://cam.example:8443/mjpeg"}, None),
        ({"kind": "webcam", "url": "0"}, None),
        ({"kind": "webcam", "url": "/dev/video2"}, None),
    ],
)
def test_valid_stream_urls_are_kept(tmp_path: Path, source: dict[str, str], url: str | None) -> None:
    config = load_pipeline(_source(**source)(tmp_path))
    assert config.sources[0].url == (url or source["url"])  # type: ignore[union-attr]


def test_yaml_anchors_and_merge_keys_still_work(tmp_path: Path) -> None:
    # The alias and duplicate-key guards must leave ordinary anchors and `<<` merges (with overrides) alone.
    text = (
        "name: x\nvlm: {model: m}\nsources:\n"
        "  - &cam {kind: rtsp, camera: a, url: 'rtsp://cam/a', read_timeout_s: 3}\n"
        "  - {<<: *cam, camera: b, url: 'rtsp://cam/b'}\n"
    )
    config = load_pipeline(_text(text)(tmp_path))
    assert [(s.camera, s.url, s.read_timeout_s) for s in config.sources] == [  # type: ignore[union-attr]
        ("a", "rtsp://cam/a", 3),
        ("b", "rtsp://cam/b", 3),
    ]
