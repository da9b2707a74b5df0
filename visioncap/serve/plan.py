"""Which GPU class serves, and how much of the GPU vLLM may take beside the detector.

vLLM refuses to start when another process already holds memory it wants, and the YOLO detector shares the
GPU, so `gpu_memory_utilization` is computed on purpose: (total - detector reservation - headroom) / total,
then checked against the model's weights, overhead and the KV cache of at least one full-length sequence.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from visioncap.config.profiles import GPU_CLASSES, ModelProfile, ServingArgs
from visioncap.config.serve import ServeOptions
from visioncap.errors import ConfigError

MIB_PER_GIB = 1024
DEFAULTS = ServeOptions.model_fields

# Memory nvidia-smi reports (memory.total, MiB) for each class's common model, for dry runs on machines
# without the GPU. The A100 class assumes the 80 GB card; set gpu_memory_gib for the 40 GB one.
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


class Naming(Protocol):
    """How a message names a ServeOptions field, and a value for it when one goes with the name."""

    def __call__(self, field: str, value: object = None, /) -> str: ...


def field_naming(field: str, value: object = None, /) -> str:
    """The library's way: the field itself (`gpu`, `gpu=CLASS`)."""
    return field if value is None else f"{field}={value}"


class PlanError(ConfigError):
    """A serving choice that cannot work. The message names ServeOptions fields; `naming` says it again with
    each field named another way, so the command line can say its flags."""

    def __init__(self, say: Callable[[Naming], str]) -> None:
        self.say = say
        super().__init__(say(field_naming))

    def naming(self, name: Naming) -> str:
        """The message with every field named by `name`."""
        return self.say(name)


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
    gpu: str = DEFAULTS["gpu"].default,
    gpu_memory_gib: float | None = DEFAULTS["gpu_memory_gib"].default,
    detector_gib: float = DEFAULTS["detector_gib"].default,
    headroom_gib: float = DEFAULTS["headroom_gib"].default,
    dry_run: bool = DEFAULTS["dry_run"].default,
    gpus: list[GpuInfo] | None = None,
) -> ServingPlan:
    """Choose the GPU class, compute gpu_memory_utilization and check the model fits.

    The arguments are the ServeOptions fields of the same names; a bad one is a PlanError naming it. `gpu` is a
    class name or `auto` (nvidia-smi; `cpu` without a GPU). `gpus` replaces detection (tests, callers that
    already asked). A dry run without a GPU shows the profile's first GPU class at its nominal memory instead of
    failing, and says so.
    """
    _check_choices(gpu, gpu_memory_gib, detector_gib, headroom_gib)
    found = detect_gpus() if gpus is None else gpus
    device = found[0] if found else None
    report = [_device_line(found)]
    gpu_class = _choose_class(profile, gpu, device, dry_run, report)
    serving = profile.serving_for(gpu_class)
    if gpu_class == "cpu":
        report.append("memory: vLLM on the CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE; no GPU check")
        return ServingPlan(gpu_class, None, None, profile.command_args(gpu_class), report)
    total = _total_memory(gpu, gpu_class, gpu_memory_gib, device, report)
    utilization = _utilization(serving, total, detector_gib, headroom_gib, report)
    _check_fit(profile, serving, gpu_class, total, total * utilization, report)
    return ServingPlan(gpu_class, utilization, total, profile.command_args(gpu_class, utilization), report)


def _check_choices(gpu: str, gpu_memory_gib: float | None, detector_gib: float, headroom_gib: float) -> None:
    if detector_gib < 0 or headroom_gib < 0:
        raise PlanError(lambda n: f"{n('detector_gib')} and {n('headroom_gib')} must not be negative")
    if gpu_memory_gib is not None and gpu_memory_gib <= 0:
        raise PlanError(lambda n: f"{n('gpu_memory_gib')} must be positive, not {gpu_memory_gib}")
    if gpu != "auto" and gpu not in GPU_CLASSES:
        raise PlanError(lambda n: f"{n('gpu')} must be auto or one of {', '.join(GPU_CLASSES)}, not {gpu!r}")


def _device_line(found: list[GpuInfo]) -> str:
    if not found:
        return "GPU: none found (no nvidia-smi or no GPU listed)"
    more = f" (first of {len(found)}; vLLM uses CUDA_VISIBLE_DEVICES)" if len(found) > 1 else ""
    return f"GPU: {found[0].name}, {_gib(found[0].total_gib)} (nvidia-smi){more}"


def _choose_class(profile: ModelProfile, gpu: str, device: GpuInfo | None, dry_run: bool, report: list[str]) -> str:
    """The GPU class: the one asked for, else the device's, else cpu or (dry runs only) the profile's first."""
    if gpu != "auto":
        report.append(f"GPU class: {gpu} (asked for)")
        return gpu
    if device is not None:
        detected = classify(device.name, device.total_mib)
        if detected is None:
            name = device.name
            raise PlanError(
                lambda n: (
                    f"no GPU class for {name!r}; pass {n('gpu')} with the closest of "
                    f"{', '.join(GPU_CLASSES[1:])} (and {n('gpu_memory_gib')} if its memory differs)"
                )
            )
        if profile.gpus and detected not in profile.gpus and "cpu" in profile.gpus:
            # A CPU-only profile (the test models) keeps working on a machine that happens to have a GPU.
            report.append(f"GPU class: cpu (the profile has no {detected} arguments, only cpu ones)")
            return "cpu"
        report.append(f"GPU class: {detected} (from the name)")
        return detected
    if "cpu" in profile.gpus or not profile.gpus:
        report.append("GPU class: cpu (no GPU)")
        return "cpu"
    if dry_run:
        first = next(c for c in profile.gpus if c != "cpu")
        report.append(f"GPU class: {first} (no GPU here: the profile's first class, for this dry run only)")
        return first
    raise PlanError(
        lambda n: (
            f"no NVIDIA GPU found and profile {profile.name!r} has no cpu class (it has: "
            f"{', '.join(profile.gpus)}); run it on a GPU, or pass {n('gpu', 'CLASS')} {n('dry_run', True)} to see "
            "its command"
        )
    )


def _total_memory(
    gpu: str, gpu_class: str, gpu_memory_gib: float | None, device: GpuInfo | None, report: list[str]
) -> float:
    """GiB of the GPU: as given, else nvidia-smi's when the device is of the class, else the class's nominal."""
    if gpu_memory_gib is not None:
        report.append(f"total memory: {_gib(gpu_memory_gib)} (given)")
        return gpu_memory_gib
    if device is not None and (gpu == "auto" or classify(device.name, device.total_mib) in (gpu, None)):
        report.append(f"total memory: {_gib(device.total_gib)} (nvidia-smi memory.total)")
        return device.total_gib
    total = NOMINAL_MIB[gpu_class] / MIB_PER_GIB
    report.append(f"total memory: {_gib(total)} (nominal for {gpu_class}; gpu_memory_gib sets it)")
    return total


def _utilization(
    serving: ServingArgs, total: float, detector_gib: float, headroom_gib: float, report: list[str]
) -> float:
    """The profile's fixed fraction, or what is left after the detector and the headroom."""
    reserved = detector_gib + headroom_gib
    setting = serving.gpu_memory_utilization
    if setting != "auto" and setting is not None:
        report.append(f"gpu_memory_utilization: {setting:.2f} (fixed in the profile)")
        left = total * (1 - setting)
        if left < reserved:
            report.append(
                f"warning: that leaves {_gib(left)} beside vLLM, less than the detector ({_gib(detector_gib)}) "
                f"plus headroom ({_gib(headroom_gib)})"
            )
        return setting
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
    return utilization


def _check_fit(
    profile: ModelProfile,
    serving: ServingArgs,
    gpu_class: str,
    total: float,
    budget: float,
    report: list[str],
) -> None:
    """Refuse a budget without room for the weights, the overhead and one full-length sequence's KV cache."""
    memory = profile.memory
    if memory is None:
        report.append("memory check: skipped (the profile has no memory estimate)")
        return
    kv_gib = budget - memory.weights_gib - memory.overhead_gib
    kv_tokens = int(max(kv_gib, 0) * MIB_PER_GIB * MIB_PER_GIB / memory.kv_cache_kib_per_token)
    longest = serving.max_model_len or 0
    if kv_tokens < max(longest, 1):
        one_sequence = longest * memory.kv_cache_kib_per_token / MIB_PER_GIB / MIB_PER_GIB
        needed = memory.weights_gib + memory.overhead_gib + one_sequence
        shortfall = (
            f"not enough GPU memory for profile {profile.name!r} on {gpu_class} ({_gib(total)} total): vLLM's share "
            f"{_gib(budget)} is less than the {_gib(needed)} it needs (weights {_gib(memory.weights_gib)} + overhead "
            f"{_gib(memory.overhead_gib)} + KV cache of one {longest}-token sequence {_gib(one_sequence)})"
        )
        raise PlanError(
            lambda n: (
                f"{shortfall}. Use a GPU with more memory, a smaller model, a lower max_model_len or less "
                f"{n('detector_gib')}/{n('headroom_gib')}"
            )
        )
    report.append(
        f"vLLM budget {_gib(budget)} = weights {_gib(memory.weights_gib)} + overhead {_gib(memory.overhead_gib)}"
        f" + KV cache {_gib(kv_gib)} (~{kv_tokens:,} tokens at {memory.kv_cache_kib_per_token:g} KiB each)"
    )
    if longest:
        seqs = serving.max_num_seqs
        report.append(
            f"KV cache holds {kv_tokens // longest} full-length ({longest}-token) sequences"
            + (f"; max_num_seqs {seqs}" if seqs else "")
        )
