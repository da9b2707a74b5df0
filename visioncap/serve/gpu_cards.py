"""Figures for a GPU outside the serving classes: memory bandwidth and bf16 FLOP/s from the card's name, else
estimated from its architecture (compute capability) and memory, and whether vLLM can run on it at all.

The serving classes (l4, a10, a100, h100, h200) keep their own figures (visioncap.serve.costmodel.CLASS_SPECS);
this is for every other card nvidia-smi may name. Named cards use their datasheet rows (docs/gpu-reference.md).
An unnamed card of a known architecture gets per-GB figures: the lowest bandwidth and FLOP/s per GB of memory
among that architecture's rows, times its memory, and never above the architecture's fastest row. Conservative
on purpose: an overestimate would size chunk budgets that stall chat for longer than the plan says.
"""

from __future__ import annotations

from dataclasses import dataclass

from visioncap.serve.costmodel import GPU_SPECS, GpuSpec
from visioncap.serve.gpu_probe import GpuInfo

# PyTorch's CUDA 12.8 and 13 builds, which vLLM's wheels and images use, start at Turing (7.5).
MINIMUM_CAPABILITY = (7, 5)
BF16_CAPABILITY = (8, 0)  # vLLM refuses bfloat16 below Ampere and asks for --dtype half


@dataclass(frozen=True)
class Architecture:
    """One compute capability family and the table rows its per-GB estimate is drawn from."""

    name: str
    major: int
    minor: int | None  # None: every minor of the major (Blackwell 10.x, 12.x)
    rows: tuple[str, ...]  # GPU_SPECS keys

    def covers(self, capability: tuple[int, int]) -> bool:
        return capability[0] == self.major and self.minor in (None, capability[1])


ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("Turing", 7, 5, ("t4",)),
    Architecture("Ampere (data centre)", 8, 0, ("a100", "a100-40gb")),
    Architecture("Ampere", 8, 6, ("a10", "rtx3090", "a6000", "a40")),
    Architecture("Ampere (Jetson Orin)", 8, 7, ("jetson-agx-orin",)),
    Architecture("Ada Lovelace", 8, 9, ("l4", "rtx4090", "l40", "l40s")),
    Architecture("Hopper", 9, 0, ("h100", "h100-pcie", "h200")),
    Architecture("Blackwell (data centre)", 10, None, ("b200",)),
    Architecture("Blackwell (RTX)", 12, None, ("rtx5090",)),
)


@dataclass(frozen=True)
class Card:
    """A card known by name: the words of its nvidia-smi name, its figures' row and its compute capability."""

    words: tuple[str, ...]
    row: str | None  # GPU_SPECS key; None for a card vLLM cannot run (refused by capability)
    capability: tuple[int, int]


CARDS: tuple[Card, ...] = (
    Card(("RTX", "3090"), "rtx3090", (8, 6)),
    Card(("RTX", "4090"), "rtx4090", (8, 9)),
    Card(("RTX", "5090"), "rtx5090", (12, 0)),
    Card(("A6000",), "a6000", (8, 6)),
    Card(("A40",), "a40", (8, 6)),
    Card(("L40S",), "l40s", (8, 9)),
    Card(("L40",), "l40", (8, 9)),
    Card(("T4",), "t4", (7, 5)),
    Card(("B200",), "b200", (10, 0)),
    Card(("V100",), None, (7, 0)),
    Card(("P100",), None, (6, 0)),
    Card(("P40",), None, (6, 1)),
)
# Same name, smaller chip: a laptop "RTX 4090" is not the desktop card.
NOT_THE_DESKTOP_CARD = ("LAPTOP", "MOBILE", "MAX-Q")


class UnsupportedGpu(ValueError):
    """A card the plan has no figures for, or that vLLM cannot run (`runnable` False); the message says why."""

    def __init__(self, message: str, runnable: bool = True) -> None:
        super().__init__(message)
        self.runnable = runnable


@dataclass(frozen=True)
class CardFigures:
    """What the plan assumes about a card outside the serving classes."""

    name: str  # nvidia-smi's
    total_gib: float
    compute_cap: str | None
    architecture: str
    spec: GpuSpec  # bandwidth and FLOP/s the cost model and the budgets use
    basis: str  # where the figures come from, one sentence
    bf16: bool  # False: vLLM runs float16 (Turing)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "total_gib": round(self.total_gib, 2),
            "compute_cap": self.compute_cap,
            "architecture": self.architecture,
            "bf16_tflops": self.spec.peak_bf16_tflops,
            "bandwidth_tb_s": self.spec.bandwidth_tb_s,
            "dtype": "bfloat16" if self.bf16 else "float16",
            "figures_from": self.basis,
        }


def _words(name: str) -> list[str]:
    return name.upper().replace("-", " ").replace("_", " ").split()


def named_card(name: str) -> Card | None:
    """The table's card for an nvidia-smi name, None when none is named (or it is a smaller namesake)."""
    words = _words(name)
    if any(marker in name.upper() for marker in NOT_THE_DESKTOP_CARD):
        return None
    for card in CARDS:
        size = len(card.words)
        if any(tuple(words[i : i + size]) == card.words for i in range(len(words) - size + 1)):
            return card
    return None


def architecture(capability: tuple[int, int]) -> Architecture | None:
    return next((arch for arch in ARCHITECTURES if arch.covers(capability)), None)


def _text(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def figures_for(gpu: GpuInfo) -> CardFigures:
    """The figures the plan assumes for `gpu`; UnsupportedGpu when it has none or vLLM cannot run there."""
    card = named_card(gpu.name)
    capability = gpu.capability or (card.capability if card else None)
    if capability is None:
        raise UnsupportedGpu(
            f"no figures for {gpu.name!r}: it is not in the table of cards and nvidia-smi gave no compute "
            "capability (a driver before R510) to estimate from"
        )
    if capability < MINIMUM_CAPABILITY:
        raise UnsupportedGpu(
            f"{gpu.name!r} has compute capability {_text(capability)}: vLLM's CUDA builds (PyTorch with CUDA 12.8 "
            f"or 13) start at Turing, {_text(MINIMUM_CAPABILITY)}, so vLLM cannot run this model there; use a newer "
            "GPU, or the CPU (a profile with a cpu class)",
            runnable=False,
        )
    arch = architecture(capability)
    if arch is None:
        known = ", ".join(f"{a.name} {a.major}.{'x' if a.minor is None else a.minor}" for a in ARCHITECTURES)
        raise UnsupportedGpu(
            f"no figures for {gpu.name!r}, compute capability {_text(capability)}: no architecture in the table "
            f"({known})"
        )
    bf16 = capability >= BF16_CAPABILITY
    if card is not None and card.row is not None:
        spec = GPU_SPECS[card.row]
        basis = f"the table's {spec.name} row ({spec.source})"
        return CardFigures(gpu.name, gpu.total_gib, gpu.compute_cap, arch.name, spec, basis, bf16)
    return CardFigures(
        gpu.name, gpu.total_gib, gpu.compute_cap, arch.name, _per_gb(gpu, arch), _per_gb_basis(arch), bf16
    )


def _per_gb(gpu: GpuInfo, arch: Architecture) -> GpuSpec:
    rows = [GPU_SPECS[key] for key in arch.rows]
    # A datasheet's "24 GB" is what nvidia-smi reports as ~24,000 MiB: compare GiB with it, not decimal GB.
    memory_gb = gpu.total_gib
    tflops = min(memory_gb * min(r.peak_bf16_tflops / r.memory_gb for r in rows), max(r.peak_bf16_tflops for r in rows))
    bandwidth = min(memory_gb * min(r.bandwidth_tb_s / r.memory_gb for r in rows), max(r.bandwidth_tb_s for r in rows))
    return GpuSpec(gpu.name, round(tflops, 1), round(bandwidth, 3), round(memory_gb, 1), source=_per_gb_basis(arch))


def _per_gb_basis(arch: Architecture) -> str:
    names = ", ".join(GPU_SPECS[key].name for key in arch.rows)
    return f"estimated for {arch.name}: the lowest TFLOP/s and TB/s per GB of memory among {names}, times its memory"
