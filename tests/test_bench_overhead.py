"""`visioncap bench overhead`'s arithmetic: pooled percentiles, paired bootstrap, goals (no servers: the run itself
is a benchmark, not a test)."""

from __future__ import annotations

from pathlib import Path

from visioncap.bench.overhead.run import Block, OverheadOptions, bench_command, bootstrap_interval, summarize
from visioncap.config.profiles import load_profile


def options(**overrides: object) -> OverheadOptions:
    profile = load_profile("tiny-bench", Path("models"))
    return OverheadOptions(profile=profile, server_python=Path("python"), work_dir=Path("/tmp"), **overrides)  # type: ignore[arg-type]


def block(arm: str, pair: int, ttft_ms: float, itl_ms: float, n: int = 100) -> Block:
    ttfts = [ttft_ms / 1000 * (1 + i / n) for i in range(n)]
    gaps = [itl_ms / 1000 * (1 + i / n) for i in range(n * 10)]
    return Block(arm, pair, pair, ttfts, gaps, 0, 1.0)


def test_a_gateway_that_adds_ten_to_fifteen_percent_is_judged_by_the_ratio_of_pooled_percentiles() -> None:
    blocks = []
    for pair in range(4):
        blocks += [block("direct", pair, 50, 10), block("gateway", pair, 55, 11.5)]
    results = summarize(blocks, options())
    goals = results["goals"]
    assert goals["overhead_ttft_p50"]["value"] == 1.1 and not goals["overhead_ttft_p50"]["met"]
    assert goals["overhead_ttft_p99"]["value"] == 1.1 and goals["overhead_ttft_p99"]["met"]
    assert goals["overhead_itl_p99"]["value"] == 1.15 and not goals["overhead_itl_p99"]["met"]
    assert results["arms"]["direct"]["chats"] == 400 and results["arms"]["gateway"]["gaps"] == 4000
    assert [p["ttft_p50"] for p in results["pairs"]] == [1.1] * 4
    assert results["arms"]["gateway"]["client_policies"] == ["other"]  # the blocks here say how they were run


def test_the_bootstrap_interval_is_wide_when_pairs_disagree_and_tight_when_they_agree() -> None:
    agreeing = [b for pair in range(4) for b in (block("direct", pair, 50, 10), block("gateway", pair, 50, 10))]
    assert bootstrap_interval(agreeing, "ttft", 50, 200, 0) == (1.0, 1.0)
    spread = [
        b
        for pair, slow in enumerate((1.0, 1.0, 2.0, 0.5))
        for b in (block("direct", pair, 50, 10), block("gateway", pair, 50 * slow, 10))
    ]
    interval = bootstrap_interval(spread, "ttft", 50, 200, 0)
    assert interval is not None and interval[0] < 1.0 < interval[1]
    assert bootstrap_interval(agreeing[:2], "ttft", 50, 200, 0) is None  # one pair: no interval


def test_the_vllm_bench_command_sends_the_key_only_to_the_gateway() -> None:
    o = options(request_rate=4.0, prompts_per_block=60)
    direct = bench_command(o, "http://127.0.0.1:1", 7, Path("/tmp/r.json"), None)
    through = bench_command(o, "http://127.0.0.1:2", 7, Path("/tmp/r.json"), "secret")
    assert direct[2:4] == ["bench", "serve"] and "--header" not in direct
    assert through[-2:] == ["--header", "Authorization=Bearer secret"]
    for flag, value in (("--request-rate", "4.0"), ("--num-prompts", "60"), ("--seed", "7")):
        assert direct[direct.index(flag) + 1] == value
    assert "--ignore-eos" in direct and "--save-detailed" in direct
