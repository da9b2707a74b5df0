"""Checks of a pipeline's inputs that run before its slow parts load (vLLM, the VLM check, the detector): a
video file that is not a video is reported in one line in well under a second, instead of after them."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

from visioncap.config.pipeline import PipelineConfig
from visioncap.config.sources import FileSourceConfig
from visioncap.errors import ConfigError

# FFmpeg's lines start with the demuxer and its context's address: "[mov,mp4,m4a @ 0x55d0c] moov atom not found".
_FFMPEG_PREFIX = re.compile(r"^\[[^]]*@ 0x[0-9a-f]+\]\s*")


@contextlib.contextmanager
def _stderr_captured() -> Iterator[list[str]]:
    """What native code writes to file descriptor 2 meanwhile (FFmpeg's complaints, which no setting of OpenCV's
    silences), as lines in the list yielded, instead of on the terminal. For the single-threaded start only: the
    descriptor is the whole process's."""
    lines: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read(65536).decode(errors="replace").splitlines())


def check_video_files(config: PipelineConfig) -> list[str]:
    """Opens every video file the pipeline reads and decodes its first frame, with FFmpeg's reason for each that
    cannot be read (a file that is not a video, or not one OpenCV can decode).

    When nothing of the run could be read (every source is such a file), ConfigError naming them: the run stops
    before anything slow loads. Otherwise the problems come back, one line each, for the caller to say at once;
    the run goes on with the sources that work, as it does for a camera that fails later (the summary names them).
    """
    files = [source for source in config.sources if isinstance(source, FileSourceConfig)]
    if not files:
        return []
    import cv2  # only when there are files: a pipeline of live cameras does not pay for the import here

    problems: list[str] = []
    for source in files:
        with _stderr_captured() as said:
            capture = cv2.VideoCapture(str(source.path))
            try:
                readable = capture.isOpened() and capture.read()[0]
            finally:
                capture.release()
        if not readable:
            reasons = [_FFMPEG_PREFIX.sub("", line).strip() for line in said if line.strip()]
            reason = reasons[-1][:200] if reasons else "no frame could be decoded"
            problems.append(
                f"pipeline {config.name}: camera {source.camera}: {source.path} is not a video file that can be "
                f"read ({reason})"
            )
    if len(problems) == len(config.sources):
        raise ConfigError("; ".join(problems))
    return problems
