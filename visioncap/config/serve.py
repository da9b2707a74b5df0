"""What a `visioncap serve` (or `python -m visioncap.serve`) invocation asks for: the one place its defaults live.

The command line takes its defaults and help from these fields; callers that start a server themselves
(`visioncap run --serve`) build the same options. Values are checked where they are used
(visioncap.serve.plan), so that an error can name the field, and the command line its flag.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from visioncap.config.base import StrictModel

DEFAULT_PROFILE = "tiny"


class ServeOptions(StrictModel):
    """One launcher invocation: which profile, where it listens, and how the GPU is shared."""

    profile: str = Field(
        default=DEFAULT_PROFILE, description="Model profile name (MODELS_DIR/NAME.yaml) or a profile file."
    )
    models_dir: Path = Field(description="Folder searched for profile names (VISIONCAP_MODELS_DIR).")
    python: Path = Field(description="Python interpreter of the vLLM server environment (VISIONCAP_SERVER_PYTHON).")
    host: str = Field(default="127.0.0.1", description="Address vLLM listens on.")
    port: int = Field(default=8000, description="Port vLLM listens on.")
    gpu: str = Field(
        default="auto",
        description="GPU class: auto (from nvidia-smi's name; cpu without a GPU; another card served with values "
        "derived from its memory and compute capability, the plan saying what it assumed), cpu, l4, a10, a100, h100, "
        "h200.",
    )
    gpu_memory_gib: float | None = Field(
        default=None, description="Total GPU memory in GiB instead of nvidia-smi's (dry runs elsewhere)."
    )
    detector_gib: float = Field(default=1.5, description="GPU memory kept for the YOLO detector, GiB.")
    headroom_gib: float = Field(default=1.0, description="GPU memory kept free besides, GiB.")
    dry_run: bool = Field(
        default=False, description="Plan and describe the server without starting it (no GPU needed)."
    )
    aliases: tuple[str, ...] = Field(
        default=(),
        description="Further model names clients may send; lets a pipeline name `vlm` whatever the profile.",
    )
    log_file: Path | None = Field(
        default=None, description="Where vLLM's output goes; None: this process's own output (the foreground)."
    )
