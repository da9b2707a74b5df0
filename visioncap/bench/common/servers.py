"""Starting vLLM for a measurement: one way for `bench mixed`, `bench fidelity` and `tune`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from visioncap.config.profiles import ModelProfile
from visioncap.serve import VllmServer, free_port

log = logging.getLogger(__name__)


@contextlib.contextmanager
def measured_vllm(
    profile: ModelProfile, python: Path, work_dir: Path, label: str, gpu_class: str | None = None
) -> Iterator[VllmServer]:
    """vLLM for `profile` on a free port, its log under WORK_DIR/logs; stopped (with its workers) on exit.

    With `gpu_class`, the server is planned for that class as `visioncap serve --gpu CLASS` would plan it;
    without, the profile's own arguments are used as they are.
    """
    plan = None
    if gpu_class is not None:
        from visioncap.serve.plan import plan_serving

        plan = plan_serving(profile, gpu=gpu_class)
    log_file = work_dir / "logs" / f"vllm-{profile.name}-{label}.log"
    started = time.monotonic()
    with VllmServer(profile, python=python, port=free_port(), log_file=log_file, plan=plan) as server:
        log.info("vLLM (%s) ready in %.1f s at %s", label, time.monotonic() - started, server.base_url)
        yield server


def without_prefix_cache(profile: ModelProfile) -> ModelProfile:
    """The profile with vLLM's prefix cache off, for measurements that send the same prompts again (the pairs of
    `bench overhead`, fidelity runs one after another on one server): a cached prompt costs next to nothing."""
    if "--no-enable-prefix-caching" in profile.vllm_args:
        return profile
    return profile.model_copy(update={"vllm_args": [*profile.vllm_args, "--no-enable-prefix-caching"]})
