"""Which GPU class serves, and how much of the GPU vLLM may take beside the detector.

vLLM refuses to start when another process already holds memory it wants, and the YOLO detector shares the
GPU, so `gpu_memory_utilization` is computed on purpose: (total - detector reservation - headroom) / total,
then checked against the model's weights, overhead and the KV cache of at least one full-length sequence.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from dataclasses import dataclass, field

from visioncap.errors import ConfigError
from visioncap.serve.profiles import GPU_CLASSES, ModelProfile

DEFAULT_DETECTOR_GIB = 1.5
DEFAULT_HEADROOM_GIB = 1.0
MIB_PER_GIB = 1024

# Memory nvidia-smi reports (memory.total, MiB) for each class's common model, for dry runs on machines
# without the GPU. The A100 class assumes the 80 GB card; pass --gpu-memory-gib for the 40 GB one.
NOMINAL_MIB: dict[str, int] = {"l4": 23034, "a10": 23028, "a100": 81920, "h100": 81559, "h200": 143771}


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi names it."""

    name: str
    total_mib: int

    @property
    def total_gib(self) -> float:
        return self.total_mib / MIB_PER_GIB


def classify(name: str, total_mib: int) -> str | None:
    """The GPU class of an nvidia-smi product name, None when no class fits."""
    upper = name.upper()
    if "GH200" in upper:
        # Grace Hopper ships with H100-class (96 GB) or H200-class (144 GB) memory under one name.
        return "h200" if total_mib > 100 * MIB_PER_GIB else "h100"
    for marker, gpu_class in (("H200", "h200"), ("H100", "h100"), ("H800", "h100"), ("A100", "a100"), ("A800", "a100")):
        if marker in upper:
            return gpu_class
    words = upper.replace("-", " ").split()
    if "L4" in words:
        return "l4"
    if "A10" in words or "A10G" in words:
        return "a10"
    return None


def detect_gpus(nvidia_smi: str = "nvidia-smi") -> list[GpuInfo]:
    """The GPUs nvidia-smi lists; empty when there is no nvidia-smi or it finds no GPU."""
    binary = shutil.which(nvidia_smi)
    if binary is None:
        return []
    try:
        result = subprocess.run(
            [binary, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if result.returncode != 0:
        return []
    gpus = []
    for line in result.stdout.splitlines():
        name, _, memory = line.rpartition(",")
        try:
            gpus.append(GpuInfo(name=name.strip(), total_mib=int(float(memory.strip()))))
        except ValueError:
            continue
    return gpus


@dataclass
class ServingPlan:
    """What `visioncap serve` decided, with the reasons it prints."""

    gpu_class: str
    gpu_memory_utilization: float | None
    total_gib: float | None
    args: list[str]
    report: list[str] = field(default_factory=list)


def _gib(value: float) -> str:
    return f"{value:.1f} GiB"


def plan_serving(
    profile: ModelProfile,
    gpu: str = "auto",
    gpu_memory_gib: float | None = None,
    detector_gib: float = DEFAULT_DETECTOR_GIB,
    headroom_gib: float = DEFAULT_HEADROOM_GIB,
    dry_run: bool = False,
    gpus: list[GpuInfo] | None = None,
) -> ServingPlan:
    """Choose the GPU class, compute gpu_memory_utilization and check the model fits.

    `gpu` is a class name or `auto` (nvidia-smi; `cpu` without a GPU). `gpus` replaces detection (tests,
    callers that already asked). A dry run without a GPU shows the profile's first GPU class at its nominal
    memory instead of failing, and says so.
    """
    if detector_gib < 0 or headroom_gib < 0:
        raise ConfigError("--detector-gib and --headroom-gib must not be negative")
    if gpu_memory_gib is not None and gpu_memory_gib <= 0:
        raise ConfigError(f"--gpu-memory-gib must be positive, not {gpu_memory_gib}")
    if gpu != "auto" and gpu not in GPU_CLASSES:
        raise ConfigError(f"--gpu must be auto or one of {', '.join(GPU_CLASSES)}, not {gpu!r}")
    found = detect_gpus() if gpus is None else gpus
    report: list[str] = []
    device = found[0] if found else None
    if device is not None:
        more = f" (first of {len(found)}; vLLM uses CUDA_VISIBLE_DEVICES)" if len(found) > 1 else ""
        report.append(f"GPU: {device.name}, {_gib(device.total_gib)} (nvidia-smi){more}")
    else:
        report.append("GPU: none found (no nvidia-smi or no GPU listed)")

    if gpu != "auto":
        gpu_class = gpu
        report.append(f"GPU class: {gpu_class} (--gpu)")
    elif device is not None:
        detected = classify(device.name, device.total_mib)
        if detected is None:
            raise ConfigError(
                f"no GPU class for {device.name!r}; pass --gpu with the closest of {', '.join(GPU_CLASSES[1:])} "
                "(and --gpu-memory-gib if its memory differs)"
            )
        if profile.gpus and detected not in profile.gpus and "cpu" in profile.gpus:
            # A CPU-only profile (the test models) keeps working on a machine that happens to have a GPU.
            gpu_class = "cpu"
            report.append(f"GPU class: cpu (the profile has no {detected} arguments, only cpu ones)")
        else:
            gpu_class = detected
            report.append(f"GPU class: {gpu_class} (from the name)")
    elif "cpu" in profile.gpus or not profile.gpus:
        gpu_class = "cpu"
        report.append("GPU class: cpu (no GPU)")
    elif dry_run:
        gpu_class = next(c for c in profile.gpus if c != "cpu")
        report.append(f"GPU class: {gpu_class} (no GPU here: the profile's first class, for this dry run only)")
    else:
        raise ConfigError(
            f"no NVIDIA GPU found and profile {profile.name!r} has no cpu class (it has: "
            f"{', '.join(profile.gpus)}); run it on a GPU, or pass --gpu CLASS --dry-run to see its command"
        )

    serving = profile.serving_for(gpu_class)
    if gpu_class == "cpu":
        report.append("memory: vLLM on the CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE; no GPU check")
        return ServingPlan(gpu_class, None, None, profile.command_args(gpu_class), report)

    if gpu_memory_gib is not None:
        total = gpu_memory_gib
        report.append(f"total memory: {_gib(total)} (--gpu-memory-gib)")
    elif device is not None and (gpu == "auto" or classify(device.name, device.total_mib) in (gpu, None)):
        total = device.total_gib
        report.append(f"total memory: {_gib(total)} (nvidia-smi memory.total)")
    else:
        total = NOMINAL_MIB[gpu_class] / MIB_PER_GIB
        report.append(f"total memory: {_gib(total)} (nominal for {gpu_class}; --gpu-memory-gib sets it)")

    reserved = detector_gib + headroom_gib
    setting = serving.gpu_memory_utilization
    if setting == "auto" or setting is None:
        available = total - reserved
        if available <= 0:
            raise ConfigError(
                f"not enough GPU memory: {_gib(total)} total leaves nothing after the detector ({_gib(detector_gib)}) "
                f"and headroom ({_gib(headroom_gib)})"
            )
        # Rounded down: rounding up would eat into the detector's share.
        utilization = math.floor(available / total * 100) / 100
        report.append(
            f"gpu_memory_utilization: {utilization:.2f} = ({_gib(total)} total - {_gib(detector_gib)} detector - "
            f"{_gib(headroom_gib)} headroom) / {_gib(total)}, rounded down"
        )
    else:
        utilization = setting
        report.append(f"gpu_memory_utilization: {utilization:.2f} (fixed in the profile)")
        left = total * (1 - utilization)
        if left < reserved:
            report.append(
                f"warning: that leaves {_gib(left)} beside vLLM, less than the detector ({_gib(detector_gib)}) "
                f"plus headroom ({_gib(headroom_gib)})"
            )
    budget = total * utilization

    memory = profile.memory
    if memory is None:
        report.append("memory check: skipped (the profile has no memory estimate)")
    else:
        kv_gib = budget - memory.weights_gib - memory.overhead_gib
        kv_tokens = int(max(kv_gib, 0) * MIB_PER_GIB * MIB_PER_GIB / memory.kv_cache_kib_per_token)
        longest = serving.max_model_len or 0
        if kv_tokens < max(longest, 1):
            one_sequence = longest * memory.kv_cache_kib_per_token / MIB_PER_GIB / MIB_PER_GIB
            needed = memory.weights_gib + memory.overhead_gib + one_sequence
            raise ConfigError(
                f"not enough GPU memory for profile {profile.name!r} on {gpu_class} ({_gib(total)} total): vLLM's "
                f"share {_gib(budget)} is less than the {_gib(needed)} it needs (weights {_gib(memory.weights_gib)}"
                f" + overhead {_gib(memory.overhead_gib)} + KV cache of one {longest}-token sequence "
                f"{_gib(one_sequence)}). Use a GPU with more memory, a smaller model, a lower max_model_len or "
                "less --detector-gib/--headroom-gib"
            )
        line = (
            f"vLLM budget {_gib(budget)} = weights {_gib(memory.weights_gib)} + overhead {_gib(memory.overhead_gib)}"
            f" + KV cache {_gib(kv_gib)} (~{kv_tokens:,} tokens at {memory.kv_cache_kib_per_token:g} KiB each)"
        )
        report.append(line)
        if longest:
            seqs = serving.max_num_seqs
            report.append(
                f"KV cache holds {kv_tokens // longest} full-length ({longest}-token) sequences"
                + (f"; max_num_seqs {seqs}" if seqs else "")
            )
    args = profile.command_args(gpu_class, utilization)
    return ServingPlan(gpu_class, utilization, total, args, report)
