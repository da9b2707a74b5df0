"""What a phase cost the host: vLLM's own inter-token latency and the CPU seconds of each process taking part.

Why: on the 2-core benchmark machine the gateway's hop competes with vLLM's processes for the cores. Chat's
gaps measured at the client cannot tell a token that vLLM produced late from one that was relayed late.
vLLM's own `vllm:inter_token_latency_seconds` is stamped where the engine's outputs are processed, before any
relay, so the two side by side say which it was. The CPU seconds per process (vLLM's API server, its engine
core, its model worker, the gateway, the load generator) say who used the cores meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import psutil

from visioncap.serve.ports import holders

ENGINE_ITL = "vllm:inter_token_latency_seconds"
# vLLM names its processes (`setproctitle`); everything else in the server's tree is its API server (and the
# launcher and multiprocessing helpers, which use next to no CPU).
VLLM_GROUPS = {"VLLM::EngineCore": "vllm_engine_core", "VLLM::Worker": "vllm_worker"}
VLLM_API = "vllm_api_server"


@dataclass(frozen=True, slots=True)
class EngineItl:
    """The running sum and count of vLLM's inter-token latency histogram, over all its label sets."""

    sum_s: float
    count: float


@dataclass(frozen=True, slots=True)
class CostSnapshot:
    """Counters read at one moment: vLLM's inter-token histogram (None: not exported) and CPU seconds per group."""

    engine_itl: EngineItl | None
    cpu_s: dict[str, float]


def engine_itl(text: str) -> EngineItl | None:
    """vLLM's inter-token latency sum and count from its Prometheus page; None where the page lacks them."""
    totals = {"_sum": 0.0, "_count": 0.0}
    seen = set()
    for line in text.splitlines():
        if not line.startswith(ENGINE_ITL):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        suffix = name.removeprefix(ENGINE_ITL)
        if suffix in totals:
            try:
                totals[suffix] += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen.add(suffix)
    return EngineItl(totals["_sum"], totals["_count"]) if len(seen) == 2 else None


def vllm_group(process_name: str) -> str:
    return VLLM_GROUPS.get(process_name, VLLM_API)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_by_group(vllm_pids: Iterable[int], others: Mapping[str, int], own: str = "load_generator") -> dict[str, float]:
    """User + system CPU seconds of the live processes: vLLM's trees grouped by process name, each of `others`
    (group -> pid) with its descendants, and this process alone as `own` (its children are the servers above).
    Processes that ended are left out."""
    totals: dict[str, float] = {}
    members: list[tuple[psutil.Process, str | None]] = [(p, None) for pid in vllm_pids for p in _tree(pid)]
    members += [(p, group) for group, pid in others.items() for p in _tree(pid)]
    members.append((psutil.Process(), own))
    seen: set[int] = set()
    for process, group in members:
        if process.pid in seen:
            continue
        seen.add(process.pid)
        try:
            name = group or vllm_group(process.name())
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        totals[name] = totals.get(name, 0.0) + times.user + times.system
    return totals


def vllm_pids(root_url: str) -> set[int]:
    """The processes listening on vLLM's port (its API server); their descendants are the rest of vLLM."""
    port = urlsplit(root_url).port
    return holders(port) if port is not None else set()


def snapshot(client: httpx.Client, root_url: str, pids: Iterable[int], others: Mapping[str, int]) -> CostSnapshot:
    """Read both counters now. The whole /metrics page, once (its ~9 ms of the API server's CPU per read is
    why the probes during a phase ask for two gauges only)."""
    try:
        response = client.get(f"{root_url}/metrics", timeout=10)
        itl = engine_itl(response.text) if response.status_code == 200 else None
    except httpx.HTTPError:
        itl = None
    return CostSnapshot(itl, cpu_by_group(pids, others))


def phase_costs(before: CostSnapshot, after: CostSnapshot) -> dict[str, object]:
    """Between two snapshots: vLLM's mean inter-token latency (ms) and its sample count, and CPU seconds per
    group (groups present in both)."""
    mean_ms = count = None
    if before.engine_itl is not None and after.engine_itl is not None:
        count = after.engine_itl.count - before.engine_itl.count
        if count > 0:
            mean_ms = round(1000 * (after.engine_itl.sum_s - before.engine_itl.sum_s) / count, 3)
    cpu = {
        group: round(after.cpu_s[group] - before.cpu_s[group], 2)
        for group in sorted(after.cpu_s)
        if group in before.cpu_s
    }
    return {"vllm_itl_mean_ms": mean_ms, "vllm_itl_count": count, "cpu_s": cpu}
