"""Where does chat's TTFT tail through the gateway come from while camera frames flow?

`visioncap bench mixed` shows chat TTFT p99 through the gateway well above chat straight to vLLM whenever frames
flow. Three arms, 60 s each, in the order A B C C B A (one vLLM, one gateway process, the faithful stand-in):

- direct:       chat straight to vLLM, frames straight to vLLM (priority 10);
- chat-via-gw:  chat through the gateway, frames straight to vLLM: the hop alone, under the same load;
- both-via-gw:  chat and frames through the gateway (pacing out of the way: 50 starts/s).

If chat-via-gw shows the tail, the hop does (not the gateway's handling of frames). Results: TTFT p50/p99 per arm
pooled over its two blocks, and p99 ratios against `direct` with bootstrap 95 % intervals (whole chats resampled).

    .venv/bin/python -m visioncap.bench.mixed.hop_ttft     # ~8 min; writes benchmarks/mixed/hop-ttft.json
"""

from __future__ import annotations

import argparse
import json
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from visioncap.bench.common.gateway_proc import GatewayProcess, gateway_config, new_key
from visioncap.bench.common.load import Target
from visioncap.bench.common.machine import REPO, machine_facts, portable
from visioncap.bench.common.servers import measured_vllm
from visioncap.bench.common.stats import bootstrap_ratio_interval, percentile
from visioncap.bench.mixed.run import (
    MixedOptions,
    Run,
    as_stand_in,
    max_model_pixels_tokens,
    ttft_clusters,
    with_policy,
)
from visioncap.config.profiles import load_profile

if TYPE_CHECKING:
    from visioncap.config.profiles import ModelProfile

OUT = REPO / "benchmarks" / "mixed" / "hop-ttft.json"
ARMS = ("direct", "chat-via-gw", "both-via-gw")


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help, no options
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("visioncap.bench").setLevel(logging.INFO)
    started_at = datetime.now(UTC)
    options = MixedOptions(
        duration_s=60, warmup_s=4, flood_rate_per_s=3.0, work_dir=REPO / "data" / "bench-hop", out_dir=OUT.parent
    )
    options, profile = as_stand_in(options, load_profile(options.profile, options.models_dir))
    options.work_dir.mkdir(parents=True, exist_ok=True)
    run = Run(options, profile)
    blocks = _run_arms(run, profile)
    arms = _arm_figures(run, blocks)
    results = {
        "benchmark": "visioncap.bench.mixed.hop_ttft",
        "command": ".venv/bin/python -m visioncap.bench.mixed.hop_ttft",
        "started_at": started_at.isoformat(timespec="seconds"),
        "what": __doc__.split("\n\n")[1],
        "machine": machine_facts(),
        "workload": {"chat_per_s": options.chat_rate_per_s, "frames_per_s": options.flood_rate_per_s, "block_s": 60},
        "arms": arms,
    }
    OUT.write_text(json.dumps(portable(results), indent=1) + "\n", encoding="utf-8")
    for arm, row in arms.items():
        print(arm, json.dumps(row))


def _run_arms(run: Run, profile: ModelProfile) -> dict[str, list[str]]:
    """Each arm's blocks in ABCCBA order on one priority server and one gateway; the phase names per arm."""
    options = run.options
    chat_key, caption_key = new_key(), new_key()
    blocks: dict[str, list[str]] = {arm: [] for arm in ARMS}
    with measured_vllm(with_policy(profile, "priority"), options.server_python, options.work_dir, "hop") as server:
        run.warm(server)
        config = gateway_config(
            server.base_url,
            chat_key,
            caption_key,
            options.background_priority,
            objectives={"ttft_p99_ms": 1000, "itl_p99_ms": 1000},
            background={"max_concurrency": options.gw_max_concurrency, "queue_size": 256},
            controller={"idle_after_s": options.gw_idle_after_s},
            max_tokens_per_image=max_model_pixels_tokens(profile),
            pacing={"start_per_s": 50, "min_per_s": 50, "max_per_s": 50},
        )
        direct = Target(server.base_url)
        with GatewayProcess(config, options.work_dir, name="gateway-hop") as gateway:
            through = {
                "chat": Target(gateway.base_url, {"authorization": f"Bearer {chat_key}"}),
                "frames": Target(gateway.base_url, {"authorization": f"Bearer {caption_key}"}),
            }
            for index, arm in enumerate((*ARMS, *reversed(ARMS))):
                name = f"{arm}-{index + 1}"
                run.phase(
                    name,
                    server.root_url,
                    chat=direct if arm == "direct" else through["chat"],
                    flood=through["frames"] if arm == "both-via-gw" else direct,
                    flood_priority=None if arm == "both-via-gw" else options.background_priority,
                    gateway=gateway,
                )
                blocks[arm].append(name)
    return blocks


def _arm_figures(run: Run, blocks: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """Each arm's chat TTFT (p50, p99, the highest) and captions/s; beside direct, its p99 ratio and interval."""
    ttfts = {arm: [c for name in names for c in ttft_clusters(run.phases[name])] for arm, names in blocks.items()}
    arms: dict[str, dict[str, Any]] = {}
    for arm, clusters in ttfts.items():
        values = [v[0] * 1000 for v in clusters]
        arms[arm] = {
            "chats": len(values),
            "ttft_ms_p50": round(percentile(values, 50) or 0, 1),
            "ttft_ms_p99": round(percentile(values, 99) or 0, 1),
            "ttft_ms_top": sorted(round(v) for v in values)[-8:],
            "captions_per_s": [run.summaries[name]["captions"]["throughput_per_s"] for name in blocks[arm]],
            "blocks": blocks[arm],
        }
        if arm != "direct":
            ratio = (
                (arms[arm]["ttft_ms_p99"] / arms["direct"]["ttft_ms_p99"]) if arms["direct"]["ttft_ms_p99"] else None
            )
            interval = bootstrap_ratio_interval(clusters, ttfts["direct"], 99, 2000, 0)
            arms[arm]["ttft_p99_over_direct"] = None if ratio is None else round(ratio, 3)
            arms[arm]["interval_95"] = None if interval is None else [round(v, 3) for v in interval]
    return arms


if __name__ == "__main__":
    main()
