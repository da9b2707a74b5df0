"""The source registry (config kind -> source class) and what every source reports through the interface:
its description (credentials masked), its time anchor and its analysis rate, on real files, folders and streams."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import cv2
import numpy as np
import pytest
from pydantic import Field
from servers.mjpeg_server import MjpegServer

from visioncap.config.sources import (
    SOURCE_CONFIGS,
    SOURCE_KINDS,
    FileSourceConfig,
    FolderSourceConfig,
    SourceConfigBase,
    StreamSourceConfig,
    config_kinds,
)
from visioncap.errors import ConfigError
from visioncap.sources import FrameSource, ImageFolderSource, StreamSource, VideoFileSource
from visioncap.sources.registry import open_source, registered_kinds, source_class
from visioncap.store.records import CameraState

SECRET = "s3cret-Rg4"
FPS, FRAMES = 8, 24
# A file time well in the past, so that an anchor taken from "now" cannot pass for one taken from the file.
MTIME = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 s at 8 fps, modified at MTIME."""
    path = tmp_path_factory.mktemp("registry-video") / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, (96, 64))
    assert writer.isOpened()
    for i in range(FRAMES):
        writer.write(np.full((64, 96, 3), 10 * i, np.uint8))
    writer.release()
    os.utime(path, (MTIME.timestamp(), MTIME.timestamp()))
    return path


def image_folder(folder: Path, count: int) -> Path:
    """`count` PNGs; the newest modified at MTIME, the others earlier."""
    folder.mkdir()
    for i in range(count):
        image = folder / f"img{i}.png"
        assert cv2.imwrite(str(image), np.full((32, 48, 3), 20 * i, np.uint8))
        stamp = (MTIME - timedelta(seconds=count - 1 - i)).timestamp()
        os.utime(image, (stamp, stamp))
    return folder


def stream(
    kind: str = "http", url: str = f"http://viewer:{SECRET}@cam.local/video.cgi?pwd={SECRET}", **extra: Any
) -> StreamSourceConfig:
    return StreamSourceConfig(camera="cam-live", kind=kind, url=url, **extra)


# --- registry ----------------------------------------------------------------------------------------------------


def test_every_config_kind_has_a_registered_source_class() -> None:
    assert set(registered_kinds()) == set(SOURCE_KINDS)
    for model in SOURCE_CONFIGS:
        for kind in config_kinds(model):
            source = source_class(kind)
            assert issubclass(source, FrameSource)
            assert not getattr(source, "__abstractmethods__", None), f"{source.__name__} leaves methods abstract"
        # Where a camera reads from is shown (CLI, API, logs) from its config too, before any source is opened.
        assert model.description is not SourceConfigBase.description, f"{model.__name__} has no description"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (FileSourceConfig(camera="a", path=Path("x.mp4")), VideoFileSource),
        (FolderSourceConfig(camera="a", kind="folder", path=Path("frames")), ImageFolderSource),
        (stream("rtsp", "rtsp://cam.local/live"), StreamSource),
        (stream("http", "http://cam.local/video.mjpg"), StreamSource),
        (stream("webcam", "0"), StreamSource),
    ],
    ids=lambda value: getattr(value, "kind", None),
)
def test_open_source_picks_the_class_by_kind(config: Any, expected: type[FrameSource]) -> None:
    source = open_source(config)
    assert type(source) is expected
    assert source.camera == config.camera
    assert source.frames_read == 0


class _PigeonConfig(SourceConfigBase):
    kind: Literal["pigeon"] = Field(default="pigeon", description="A kind no source reads.")


def test_an_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"kind 'pigeon'.*file, folder, http, rtsp, webcam"):
        open_source(_PigeonConfig(camera="roof"))
    with pytest.raises(ConfigError, match="kind 'ftp'"):
        source_class("ftp")


# --- interface, per kind -----------------------------------------------------------------------------------------


def test_video_file_reports_path_anchor_and_rate(clip: Path) -> None:
    source = open_source(FileSourceConfig(camera="cam-file", path=clip))
    assert source.description == str(clip)
    # The recording ended at the file's modification time, so offset 0 is its duration earlier.
    assert source.time_anchor() == MTIME - timedelta(seconds=FRAMES / FPS)
    assert source.analyse_rate() == pytest.approx(FPS)
    assert open_source(FileSourceConfig(camera="cam-file", path=clip, analyze_fps=2)).analyse_rate() == 2
    assert len(list(source.frames())) == FRAMES
    assert source.frames_read == FRAMES


def test_image_folder_reports_path_anchor_and_rate(tmp_path: Path) -> None:
    folder = image_folder(tmp_path / "images", 6)
    source = open_source(FolderSourceConfig(camera="cam-dir", kind="folder", path=folder, fps=3.0))
    assert source.description == str(folder)
    # The newest image is the last frame: offset 0 is count / fps before it.
    assert source.time_anchor() == MTIME - timedelta(seconds=6 / 3.0)
    assert source.analyse_rate() == 3.0
    config = FolderSourceConfig(camera="cam-dir", kind="folder", path=folder, fps=3.0, analyze_fps=1.5)
    assert open_source(config).analyse_rate() == 1.5
    assert len(list(source.frames())) == 6
    assert source.frames_read == 6


def test_stream_reports_its_url_masked_and_a_default_rate() -> None:
    source = open_source(stream())
    assert source.description == "http://viewer:***@cam.local/video.cgi?pwd=***"
    assert SECRET not in source.description
    assert source.analyse_rate() == 10.0
    assert open_source(stream(analyze_fps=4)).analyse_rate() == 4
    assert open_source(stream("webcam", "/dev/video0")).description == "/dev/video0"
    assert stream().description == source.description  # the config says it alike, for cameras not running


def test_a_kind_that_does_not_say_where_it_reads_from_is_a_clear_error() -> None:
    with pytest.raises(NotImplementedError, match="_PigeonConfig does not say where its frames come from"):
        _ = _PigeonConfig(camera="roof").description


def test_stream_anchor_is_when_it_was_first_read(clip: Path) -> None:
    states: list[CameraState] = []
    with MjpegServer(clip) as server:
        source = open_source(stream(url=server.url), on_state=lambda _camera, state: states.append(state))
        before = datetime.now(UTC)
        frames = source.frames()
        next(frames)
        anchor = source.time_anchor()
        assert before <= anchor <= datetime.now(UTC)
        next(frames)
        assert source.time_anchor() == anchor  # stable once reading started
        source.stop()
        assert list(frames) == []
    assert source.frames_read >= 2
    # The state listener given to open_source hears the stream's states.
    assert states[:2] == [CameraState.STARTING, CameraState.ONLINE] and states[-1] is CameraState.FINISHED


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_stop_ends_a_finite_source_early_without_an_error(clip: Path, tmp_path: Path, kind: str) -> None:
    if kind == "file":
        source = open_source(FileSourceConfig(camera="cam-file", path=clip))
    else:
        source = open_source(
            FolderSourceConfig(camera="cam-dir", kind="folder", path=image_folder(tmp_path / "images", 6))
        )
    frames = source.frames()
    next(frames)
    # From another thread, as the frame hub stops its sources.
    stopper = threading.Thread(target=source.stop)
    stopper.start()
    stopper.join()
    assert list(frames) == []  # neither "truncated" nor "no readable images"
