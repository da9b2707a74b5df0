"""A VLM that is down or hung gives a clear error within bounded time, never a hang.

Both faults are real: nothing listening on a port, and a listening socket that never answers.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from helpers import pipeline_dict, run_cli, write_pipeline

from visioncap.caption.client import TransientCaptionError, VlmCaptioner
from visioncap.caption.encode import encode_jpeg
from visioncap.config import CaptionConfig, VlmConfig
from visioncap.serve import free_port
from visioncap.store import CaptionStore, create_db_engine

# The captioner's client imports PyTorch (seconds of CPU): under `make test-unit` (xdist, --dist loadgroup) these
# tests share one worker, so only one imports it.
pytestmark = pytest.mark.xdist_group("captioner-imports-torch")


def test_run_against_a_dead_endpoint_exits_with_a_clear_error(tmp_path: Path, demo_video: tuple[Path, object]) -> None:
    video, _ = demo_video
    dead = f"http://127.0.0.1:{free_port()}/v1"
    database = f"sqlite:///{tmp_path / 'c.db'}"
    # Without the readiness check the run would keep its frames pending for the 600 s drain: run_cli's timeout
    # fails the test then. Nothing tighter: a loaded 2-core machine has taken 20 s to start the CLI (before the check
    # came ahead of the captioner's PyTorch import).
    result = run_cli(
        "run",
        str(write_pipeline(tmp_path, pipeline_dict(video))),
        env={"VISIONCAP_DATABASE_URL": database, "VISIONCAP_VLM_BASE_URL": dead},
        timeout=180,
    )
    assert result.returncode == 1
    assert f"error: VLM endpoint {dead} is unreachable" in result.stderr
    assert "Traceback" not in result.stderr
    assert CaptionStore(create_db_engine(database)).count() == 0


def test_hung_endpoint_fails_the_readiness_check(silent_vlm: str) -> None:
    captioner = VlmCaptioner(VlmConfig(model="m"), CaptionConfig(), silent_vlm, "k")
    with pytest.raises(Exception, match="is unreachable \\(ReadTimeout"):
        captioner.check_ready(timeout_s=0.5)


def test_hung_endpoint_caption_attempt_times_out(silent_vlm: str) -> None:
    captioner = VlmCaptioner(VlmConfig(model="m", timeout_s=0.5), CaptionConfig(), silent_vlm, "k")
    image = encode_jpeg(np.zeros((48, 64, 3), np.uint8), max_tokens=4)
    started = time.monotonic()
    # Transient: the outbox keeps the frame pending and tries again later.
    with pytest.raises(TransientCaptionError, match="APITimeoutError"):
        captioner.caption(image.jpeg)
    assert time.monotonic() - started < 10


def test_dead_endpoint_caption_attempt_is_transient() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    captioner = VlmCaptioner(VlmConfig(model="m", timeout_s=5), CaptionConfig(), dead, "k")
    with pytest.raises(TransientCaptionError, match="APIConnectionError"):
        captioner.caption(encode_jpeg(np.zeros((48, 64, 3), np.uint8), max_tokens=4).jpeg)
