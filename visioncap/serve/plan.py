"""Which GPU class serves, and how much of the GPU vLLM may take beside the detector.

vLLM refuses to start when another process already holds memory it wants, and the YOLO detector shares the
GPU, so `gpu_memory_utilization` is computed on purpose: (total - detector reservation - headroom) / total,
then checked against the model's weights, overhead and the KV cache of at least one full-length sequence.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from visioncap.config.profiles import GPU_CLASSES, ModelProfile, ServingArgs
from visioncap.config.serve import ServeOptions
from visioncap.errors import ConfigError
from visioncap.serve.costmodel import CLASS_SPECS, GPU_SPECS
from visioncap.serve.gpu_cards import CardFigures, UnsupportedGpu, figures_for
from visioncap.serve.gpu_probe import MIB_PER_GIB, GpuInfo, GpuProbe, NvidiaSmi, detect_gpus

__all__ = ["GpuInfo", "GpuProbe", "PlanError", "ServingPlan", "classify", "detect_gpus", "plan_serving"]

DEFAULTS = ServeOptions.model_fields

# Memory nvidia-smi reports (memory.total, MiB) for each class's common model, for dry runs on machines
# without the GPU. The A100 class assumes the 80 GB card; set gpu_memory_gib for the 40 GB one.
NOMINAL_MIB: dict[str, int] = {"l4": 23034, "a10": 23028, "a100": 81920, "h100": 81559, "h200": 143771}
# A derived chunk budget is a multiple of this (vLLM needs none; round numbers read as the estimates they are).
BUDGET_STEP = 64
NVIDIA_SMI = NvidiaSmi()


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
    # A card outside the classes: the figures assumed for it, the serving values derived for it (written over
    # gpus.<gpu_class>, the class they start from) and each assumption in a sentence. Empty for a known class.
    card: CardFigures | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    assumed: list[str] = field(default_factory=list)

    def served_profile(self, profile: ModelProfile) -> ModelProfile:
        """The profile as planned: with the derived serving values for a card outside the classes."""
        return profile.with_serving(self.gpu_class, **self.overrides) if self.overrides else profile


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
    probe: GpuProbe = NVIDIA_SMI,
) -> ServingPlan:
    """Choose the GPU class, compute gpu_memory_utilization and check the model fits.

    The arguments are the ServeOptions fields of the same names; a bad one is a PlanError naming it. `gpu` is a
    class name or `auto` (nvidia-smi; `cpu` without a GPU). `gpus` replaces detection (tests, callers that
    already asked), `probe` is how detection asks. A dry run without a GPU shows the profile's first GPU class at
    its nominal memory instead of failing, and says so. A card outside the classes is served with values derived
    from its memory, its figures (visioncap.serve.gpu_cards) and the nearest classes; the plan lists what it
    assumed.
    """
    _check_choices(gpu, gpu_memory_gib, detector_gib, headroom_gib)
    found = probe() if gpus is None else gpus
    device = found[0] if found else None
    report = [_device_line(found)]
    gpu_class, card = _choose_class(profile, gpu, device, dry_run, report)
    overrides: dict[str, Any] = {}
    assumed: list[str] = []
    if card is not None:
        gpu_class, overrides, assumed = _derive(profile, card)
        report.append(
            f"GPU class: {gpu_class} (none for {card.name!r}: the serving values start from the nearest classes and "
            "are derived as the assumed lines say)"
        )
    served = profile.with_serving(gpu_class, **overrides) if overrides else profile
    serving = served.serving_for(gpu_class)
    if gpu_class == "cpu":
        report.append("memory: vLLM on the CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE; no GPU check")
        return ServingPlan(gpu_class, None, None, profile.command_args(gpu_class), report)
    total = _total_memory(gpu, gpu_class, gpu_memory_gib, device, report)
    utilization = _utilization(serving, total, detector_gib, headroom_gib, report)
    _check_fit(profile, serving, card.name if card else gpu_class, total, total * utilization, report)
    args = served.command_args(gpu_class, utilization)
    if card is not None and not card.bf16:
        args = _float16(args, card, assumed)
    report.extend(f"assumed: {line}" for line in assumed)
    return ServingPlan(gpu_class, utilization, total, args, report, card, overrides, assumed)


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


def _choose_class(
    profile: ModelProfile, gpu: str, device: GpuInfo | None, dry_run: bool, report: list[str]
) -> tuple[str, CardFigures | None]:
    """The GPU class: the one asked for, else the device's, else cpu or (dry runs only) the profile's first. A
    device outside the classes gives its figures instead, for _derive to choose the class from."""
    if gpu != "auto":
        report.append(f"GPU class: {gpu} (asked for)")
        return gpu, None
    if device is not None:
        detected = classify(device.name, device.total_mib)
        gpu_classes = [c for c in profile.gpus if c != "cpu"]
        if profile.gpus and detected not in profile.gpus and "cpu" in profile.gpus and (detected or not gpu_classes):
            # A CPU-only profile (the test models) keeps working on a machine that happens to have a GPU.
            report.append(f"GPU class: cpu (the profile has no {detected or device.name} arguments, only cpu ones)")
            return "cpu", None
        if detected is None:
            return "", _card_figures(device)
        report.append(f"GPU class: {detected} (from the name)")
        return detected, None
    if "cpu" in profile.gpus or not profile.gpus:
        report.append("GPU class: cpu (no GPU)")
        return "cpu", None
    if dry_run:
        first = next(c for c in profile.gpus if c != "cpu")
        report.append(f"GPU class: {first} (no GPU here: the profile's first class, for this dry run only)")
        return first, None
    raise PlanError(
        lambda n: (
            f"no NVIDIA GPU found and profile {profile.name!r} has no cpu class (it has: "
            f"{', '.join(profile.gpus)}); run it on a GPU, or pass {n('gpu', 'CLASS')} {n('dry_run', True)} to see "
            "its command"
        )
    )


def _card_figures(device: GpuInfo) -> CardFigures:
    try:
        return figures_for(device)
    except UnsupportedGpu as exc:
        reason = str(exc)
        if not exc.runnable:
            raise PlanError(lambda _n: reason) from None
        raise PlanError(
            lambda n: (
                f"{reason}. To serve anyway, pass {n('gpu')} with the closest of {', '.join(GPU_CLASSES[1:])} "
                f"(and {n('gpu_memory_gib')} if its memory differs)"
            )
        ) from None


def _class_tflops(gpu_class: str) -> float:
    return GPU_SPECS[CLASS_SPECS[gpu_class]].peak_bf16_tflops


def _derive(profile: ModelProfile, card: CardFigures) -> tuple[str, dict[str, Any], list[str]]:
    """The class a card outside the classes starts from, the serving values derived for it and the assumptions.

    Memory sets what the KV cache must hold (max_model_len, max_num_seqs, a fixed gpu_memory_utilization): from
    the class with the most memory that is not more than the card's. Compute sets how long a chunk stalls chat
    (max_num_batched_tokens, long_prefill_token_threshold): from the fastest class not faster than the card. Ties
    take the smaller values; a card below every class scales the smallest class's values down by the ratio.
    """
    classes = [c for c in (profile.gpus or GPU_CLASSES) if c != "cpu"]
    serving = {c: profile.serving_for(c) for c in classes}
    assumed = [
        f"{card.name} (compute capability {card.compute_cap or 'from the table'}, {card.architecture}): "
        f"{card.spec.peak_bf16_tflops:g} TFLOP/s {'bf16' if card.bf16 else 'fp16'} dense, "
        f"{card.spec.bandwidth_tb_s:g} TB/s, from {card.basis}; efficiencies as measured on an H200"
    ]
    memory_mib = card.total_gib * MIB_PER_GIB
    fitting = [c for c in classes if NOMINAL_MIB[c] <= memory_mib]
    memory_ratio = 1.0
    if fitting:
        largest = max(NOMINAL_MIB[c] for c in fitting)
        by_memory = [c for c in fitting if NOMINAL_MIB[c] == largest]
    else:
        smallest = min(NOMINAL_MIB[c] for c in classes)
        by_memory = [c for c in classes if NOMINAL_MIB[c] == smallest]
        memory_ratio = memory_mib / smallest
    # The class name: of the tied ones, the slowest (its tuned values are the cautious ones).
    base = min(by_memory, key=_class_tflops)
    slower = [c for c in classes if _class_tflops(c) <= card.spec.peak_bf16_tflops]
    compute_ratio = 1.0
    if slower:
        fastest = max(_class_tflops(c) for c in slower)
        by_compute = [c for c in slower if _class_tflops(c) == fastest]
    else:
        slowest = min(_class_tflops(c) for c in classes)
        by_compute = [c for c in classes if _class_tflops(c) == slowest]
        compute_ratio = card.spec.peak_bf16_tflops / slowest

    def least(candidates: list[str], name: str) -> Any:
        values = [getattr(serving[c], name) for c in candidates if getattr(serving[c], name) is not None]
        return min(values, key=lambda v: (isinstance(v, str), v)) if values else None

    values: dict[str, Any] = {}
    for name in ("max_model_len", "max_num_seqs"):
        values[name] = least(by_memory, name)
    utilization = least(by_memory, "gpu_memory_utilization")
    if isinstance(utilization, float):
        values["gpu_memory_utilization"] = utilization
    for name in ("max_num_batched_tokens", "long_prefill_token_threshold"):
        values[name] = least(by_compute, name)
    if memory_ratio < 1 and values["max_num_seqs"] is not None:
        values["max_num_seqs"] = max(int(values["max_num_seqs"] * memory_ratio), 1)
    if compute_ratio < 1:
        for name in ("max_num_batched_tokens", "long_prefill_token_threshold"):
            if values[name]:
                values[name] = max(int(values[name] * compute_ratio) // BUDGET_STEP * BUDGET_STEP, BUDGET_STEP)
    length, tokens, threshold = (
        values["max_model_len"],
        values["max_num_batched_tokens"],
        values["long_prefill_token_threshold"],
    )
    if threshold and length is not None and threshold > length:
        values["long_prefill_token_threshold"] = length
    if tokens is not None and values["max_num_seqs"] is not None and values["max_num_seqs"] > tokens:
        values["max_num_seqs"] = tokens  # vLLM refuses a batch larger than the step budget
    memory_names = "/".join(by_memory)
    if memory_ratio < 1:
        memory_why = f"{memory_names}, the smallest class ({_gib(NOMINAL_MIB[by_memory[0]] / MIB_PER_GIB)}), "
        memory_why += f"max_num_seqs scaled by {memory_ratio:.2f} for {_gib(card.total_gib)}"
    else:
        memory_why = f"{memory_names} ({_gib(NOMINAL_MIB[by_memory[0]] / MIB_PER_GIB)}, the most memory not above "
        memory_why += f"this card's {_gib(card.total_gib)})"
    compute_names = "/".join(by_compute)
    if compute_ratio < 1:
        compute_why = f"{compute_names}, the slowest class ({_class_tflops(by_compute[0]):g} TFLOP/s), scaled by "
        compute_why += f"{compute_ratio:.2f} and rounded down to a multiple of {BUDGET_STEP}"
    else:
        compute_why = f"{compute_names} ({_class_tflops(by_compute[0]):g} TFLOP/s, the fastest class not above this "
        compute_why += f"card's {card.spec.peak_bf16_tflops:g})"

    def said(names: tuple[str, ...]) -> str:
        return ", ".join(f"{n} {values[n]}" for n in names if values.get(n) is not None)

    memory_values = said(("max_model_len", "max_num_seqs", "gpu_memory_utilization"))
    compute_values = said(("max_num_batched_tokens", "long_prefill_token_threshold"))
    if memory_values:
        assumed.append(f"{memory_values} from {memory_why}")
    if compute_values:
        assumed.append(f"{compute_values} from {compute_why}")
    overrides = {name: value for name, value in values.items() if value is not None}
    return base, overrides, assumed


def _float16(args: list[str], card: CardFigures, assumed: list[str]) -> list[str]:
    """Turing has no bf16, which vLLM refuses there: the model runs in float16, which the plan says."""
    dtype = _flag_value(args, "--dtype")
    if dtype in ("bfloat16", "bf16"):
        name = card.name
        raise PlanError(lambda n: f"{name!r} has no bf16 but the profile sets --dtype {dtype}")
    if dtype is not None:
        return args
    assumed.append(
        f"{card.name} has no bf16 (compute capability {card.compute_cap or 'below 8.0'}): --dtype float16, as vLLM "
        "asks; a model trained in bf16 may overflow in fp16, so check its captions"
    )
    return [*args, "--dtype", "float16"]


def _flag_value(args: list[str], flag: str) -> str | None:
    for index, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag:
            return args[index + 1] if index + 1 < len(args) else ""
    return None


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
    gpu_class: str,  # or the card's name, for a card outside the classes
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
