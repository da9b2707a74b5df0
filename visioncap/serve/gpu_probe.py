"""Which GPUs this machine has, as nvidia-smi reports them: name, memory and compute capability.

One small interface (`GpuProbe`: a callable that lists GPUs) with one real implementation (`NvidiaSmi`), so the
serving plan can be given another list (tests, callers that already asked). No nvidia-smi, a failing one or
output it cannot read all mean "no GPU": the plan then falls back to the CPU as it always has.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Protocol

MIB_PER_GIB = 1024
QUERY = "name,memory.total,compute_cap"
# Drivers before compute_cap was a query field (R510) refuse the whole query; the two older fields still work.
LEGACY_QUERY = "name,memory.total"
_CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")
_MEMORY = re.compile(r"^(\d+)(?:\s*MiB)?$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as nvidia-smi names it."""

    name: str
    total_mib: int
    compute_cap: str | None = None  # "8.9"; None when the driver does not report it

    @property
    def total_gib(self) -> float:
        return self.total_mib / MIB_PER_GIB

    @property
    def capability(self) -> tuple[int, int] | None:
        """(major, minor) of the compute capability, None when unknown."""
        if self.compute_cap is None:
            return None
        major, minor = self.compute_cap.split(".")
        return int(major), int(minor)


class GpuProbe(Protocol):
    """Lists the machine's GPUs; empty when there are none or they cannot be read."""

    def __call__(self) -> list[GpuInfo]: ...


def parse_query(text: str) -> list[GpuInfo]:
    """GPUs from `nvidia-smi --query-gpu=name,memory.total[,compute_cap] --format=csv,noheader,nounits`.

    Fields are taken from the right, since only the name could hold a comma. A line that does not read as a GPU
    (a warning, `[N/A]` memory, a header, blank) is skipped rather than guessed at; a compute capability that is
    not MAJOR.MINOR (`[N/A]`, `[Not Supported]`) is unknown, not an error.
    """
    gpus = []
    for line in text.splitlines():
        fields = [part.strip() for part in line.split(",")]
        capability = None
        if len(fields) >= 3 and (_CAPABILITY.match(fields[-1]) or fields[-1].startswith("[")):
            # Memory is whole MiB, so a MAJOR.MINOR (or an `[N/A]`) in last place is the third field.
            last = fields.pop()
            capability = last if _CAPABILITY.match(last) else None
        memory = _MEMORY.match(fields[-1]) if len(fields) >= 2 else None
        name = ", ".join(fields[:-1]).strip()
        if memory is None or not name:
            continue
        total_mib = int(memory.group(1))
        if total_mib <= 0:
            continue
        gpus.append(GpuInfo(name=name, total_mib=total_mib, compute_cap=capability))
    return gpus


@dataclass(frozen=True)
class NvidiaSmi:
    """The real probe: runs nvidia-smi from PATH."""

    binary: str = "nvidia-smi"
    timeout_s: float = 30.0

    def __call__(self) -> list[GpuInfo]:
        found = shutil.which(self.binary)
        if found is None:
            return []
        for query in (QUERY, LEGACY_QUERY):
            output = self._run(found, query)
            if output is not None:
                return parse_query(output)
        return []

    def _run(self, binary: str, query: str) -> str | None:
        try:
            result = subprocess.run(
                [binary, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return result.stdout if result.returncode == 0 else None


def detect_gpus(nvidia_smi: str = "nvidia-smi") -> list[GpuInfo]:
    """The GPUs nvidia-smi lists; empty when there is no nvidia-smi or it finds no GPU."""
    return NvidiaSmi(nvidia_smi)()
