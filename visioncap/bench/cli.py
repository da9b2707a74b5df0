"""`visioncap bench ...`: benchmarks against real servers (not tests: they measure, they do not assert)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from visioncap.bench.common.machine import portable
from visioncap.bench.search import PASS_THROUGH, search_command

bench_app = typer.Typer(help="Benchmarks against a real vLLM server.", no_args_is_help=True, add_completion=False)


@bench_app.callback()
def bench() -> None:
    """Benchmarks against a real vLLM server; results go under benchmarks/."""


# The options `bench fidelity` and `bench standin` share.
StandInProfile = Annotated[str, typer.Option(help="The stand-in's model profile (models/NAME.yaml), served here.")]
TargetProfile = Annotated[str, typer.Option(help="The profile it stands in for (its cost model is the target).")]


def _frame_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise typer.BadParameter(f"{text!r}: comma-separated whole numbers, e.g. 1,2,3") from None
    if not counts or not all(1 <= count <= 6 for count in counts):
        raise typer.BadParameter(f"{text!r}: each count between 1 and 6")
    return counts


# `bench mixed` options whose None is a setting of its own (the objective from S0, the ceiling's start rate), not
# "the default".
_NONE_IS_A_VALUE = {"gw_start_per_s", "gw_active_max_image_tokens", "ttft_objective_ms", "itl_objective_ms"}


@bench_app.command("mixed")
def mixed_command(
    ctx: typer.Context,
    quick: Annotated[bool, typer.Option("--quick", help="Short phases and one vLLM start (~3 min).")] = False,
    profile: Annotated[str, typer.Option(help="Model profile (models/NAME.yaml).")] = "standin",
    out_dir: Annotated[Path, typer.Option(help="Where the results files go.")] = Path("benchmarks/mixed"),
    duration: Annotated[float | None, typer.Option(help="Seconds per set-up with chat (default 40; quick 15).")] = None,
    chat_rate: Annotated[float, typer.Option(help="Chat requests per second (Poisson arrivals).")] = 1.0,
    flood_rate: Annotated[
        float, typer.Option(help="Camera frames offered per second (more than any set-up serves beside chat).")
    ] = 16.0,
    flood_max_outstanding: Annotated[
        int, typer.Option(help="Caption requests in flight at most (frames beyond are skipped at the camera).")
    ] = 8,
    fcfs_restart: Annotated[
        bool | None,
        typer.Option(
            "--fcfs-restart/--no-fcfs-restart",
            help="S1 on its own FCFS vLLM (default) or on the priority server with equal priorities (--quick).",
        ),
    ] = None,
    gw_max_concurrency: Annotated[int, typer.Option(help="Gateway: background.max_concurrency.")] = 8,
    gw_min_concurrency: Annotated[int, typer.Option(help="Gateway: background.min_concurrency.")] = 0,
    gw_idle_after: Annotated[float, typer.Option(help="Gateway: controller.idle_after_s.")] = 5.0,
    gw_pacing: Annotated[
        bool,
        typer.Option(
            "--gw-pacing/--gw-no-pacing",
            help="S3's gateway paces background starts (default) or uses the concurrency-limit policy.",
        ),
    ] = True,
    gw_start_per_s: Annotated[
        float | None,
        typer.Option(help="Gateway: pacing.start_per_s; default: this run's cost-model ceiling at 1.25x."),
    ] = None,
    gw_active_max_image_tokens: Annotated[
        int, typer.Option(help="S3-downscale: gateway's background.active_max_image_tokens; 0 skips S3-downscale.")
    ] = 64,
    ttft_objective_ms: Annotated[
        float | None, typer.Option(help="Gateway TTFT p99 objective; default: S0's p99 x 1.5.")
    ] = None,
    itl_objective_ms: Annotated[
        float | None, typer.Option(help="Gateway inter-token p99 objective; default: S0's p99 x 1.25.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    frames_per_caption: Annotated[
        int,
        typer.Option(
            min=1,
            max=16,
            help="Frames each caption request carries (events described from several frames); the flood rate "
            "counts requests.",
        ),
    ] = 1,
    verify_rate: Annotated[
        float,
        typer.Option(
            min=0,
            help="Watch rules' questions a second (the third class, 1-3 frames each) in V-alone, S2-alerts and "
            "S3-alerts; 0 leaves those phases out.",
        ),
    ] = 0.5,
    verify_frames: Annotated[
        str, typer.Option(help="Frames of the questions in turn, comma-separated (each 1-6).")
    ] = "1,2,3",
) -> None:
    """Interactive chat beside a camera caption flood: S0-S3 in one run, written as JSON, Markdown and a PNG."""
    from visioncap.bench.mixed.main import run_mixed
    from visioncap.bench.mixed.report import goals_table, table
    from visioncap.bench.mixed.run import BOOLEAN_FLAGS, FLAGS, MixedOptions

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("visioncap.bench").setLevel(logging.INFO)

    # The flags' values by the one table that also writes a run's command line (run.FLAGS), so that the command a
    # run records is the command that made it.
    def flag_value(flag: str) -> Any:
        return ctx.params[flag.removeprefix("--").replace("-", "_")]

    overrides: dict[str, Any] = {name: flag_value(flag) for name, flag in FLAGS.items()}
    overrides |= {name: flag_value(on) for name, (on, _) in BOOLEAN_FLAGS.items()}
    overrides["gw_active_max_image_tokens"] = gw_active_max_image_tokens or None
    overrides["verify_frames"] = _frame_counts(verify_frames)
    overrides["out_dir"] = out_dir
    # Unset: the profile's own defaults (quick or full).
    overrides = {name: value for name, value in overrides.items() if value is not None or name in _NONE_IS_A_VALUE}
    options = MixedOptions.quick(**overrides) if quick else MixedOptions(**overrides)
    results = run_mixed(options)
    typer.echo(table(results))
    typer.echo("")
    typer.echo(goals_table(results))
    typer.echo(f"\nwrote {', '.join(results.get('files', {}).values())} in {results['wall_s']:.0f} s")


@bench_app.command("mixed-series")
def mixed_series_command(
    runs: Annotated[list[Path], typer.Argument(help="Consecutive runs' mixed.json files, oldest first.")],
    out: Annotated[
        Path | None, typer.Option(help="Write the judgement here as JSON, and as Markdown beside it (.md).")
    ] = None,
) -> None:
    """Judge consecutive `bench mixed` runs together (#46 item 4): every goal met in each of three, S3's captions/s
    within 20 % of their mean. Exits 1 when not met."""
    from visioncap.bench.mixed.consistency import judge_series, load_runs, series_report

    try:
        loaded = load_runs(runs)
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"a run's file could not be read: {exc}") from None
    judged = judge_series(loaded, [path.name for path in runs])
    _echo_and_write(series_report(judged), judged, out)
    raise typer.Exit(0 if judged["met"] else 1)


def _echo_and_write(report: str, found: dict[str, Any], out: Path | None) -> None:
    """Print a judgement's Markdown; with `out`, write it there as JSON and as Markdown beside it (.md)."""
    typer.echo(report)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(found, indent=2) + "\n")
        out.with_suffix(".md").write_text(report)


@bench_app.command("mixed-misses")
def mixed_misses_command(
    run: Annotated[Path, typer.Argument(help="A run's mixed.json; its -raw.json beside it is read too.")],
    out: Annotated[
        Path | None, typer.Option(help="Write the split here as JSON, and as Markdown beside it (.md).")
    ] = None,
) -> None:
    """Where a `bench mixed` run's chat gaps above the objective fell: beside a frame at vLLM or beside none (the
    host's own), per set-up, against chat alone's (#46 item 4). Also in every newer run's mixed.json."""
    from visioncap.bench.mixed.misses import misses_table, run_miss_sources

    raw_path = run.with_name(f"{run.stem}-raw.json")
    try:
        summary = json.loads(run.read_text())
        raw = json.loads(raw_path.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"a run's file could not be read: {exc}") from None
    found = run_miss_sources(raw, summary.get("setups") or {}, summary.get("gateway_objectives"))
    if found is None:
        raise typer.BadParameter(f"{run} has no gateway inter-token objective to judge the gaps by")
    _echo_and_write(misses_table(found), found, out)


@bench_app.command("fidelity")
def fidelity_command(
    profile: StandInProfile = "standin",
    target: TargetProfile = "qwen2.5-vl-7b",
    gpu: Annotated[str, typer.Option(help="The target's GPU class (h200, l4, ...).")] = "h200",
    frame_width: Annotated[int, typer.Option(help="The stand-in's camera frame width.")] = 640,
    frame_height: Annotated[int, typer.Option(help="The stand-in's camera frame height.")] = 480,
    chat_tokens: Annotated[int, typer.Option(help="The stand-in's chat prompt length in tokens.")] = 256,
    filler_words: Annotated[
        int, typer.Option(help="Words of text after the frame's image (a sized stand-in's frame_filler_words).")
    ] = 0,
    repeats: Annotated[
        int,
        typer.Option(help="Injections of each kind (prompts: their lower quartile; encoder: median of pairs)."),
    ] = 9,
    base_url: Annotated[
        str | None, typer.Option(help="Measure an idle running vLLM (its /v1) instead of starting the profile.")
    ] = None,
    out_dir: Annotated[Path, typer.Option(help="Where the JSON result goes.")] = Path("benchmarks/fidelity"),
) -> None:
    """Does the stand-in cost what the target costs? Frame encoder, frame prefill and chat prefill in decode steps."""
    import contextlib

    from visioncap.bench.common.servers import measured_vllm, without_prefix_cache
    from visioncap.bench.standin.fidelity import FidelityProbe, measure, report_lines, target_for, to_json
    from visioncap.config.profiles import load_profile
    from visioncap.config.settings import load_settings

    settings = load_settings()
    models = settings.models_dir
    goal = target_for(target, gpu, models)
    served = without_prefix_cache(load_profile(profile, models))
    probe = FidelityProbe(
        frame_width=frame_width,
        frame_height=frame_height,
        chat_prompt_tokens=chat_tokens,
        frame_filler_words=filler_words,
        repeats=repeats,
    )
    with contextlib.ExitStack() as stack:
        url = base_url
        if url is None:
            work_dir = Path("data/bench-fidelity")
            server = stack.enter_context(measured_vllm(served, settings.server_python, work_dir, "fidelity"))
            url = server.base_url
        result = measure(url, served.served_model_name, goal, probe)
    typer.echo("\n".join(report_lines(result)))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{served.name}-as-{target}-{gpu}.json"
    path.write_text(to_json(result) + "\n")
    typer.echo(f"wrote {path}")
    if not result.faithful:
        raise typer.Exit(1)


@bench_app.command("standin")
def standin_command(
    profile: StandInProfile = "standin",
    target: TargetProfile = "qwen2.5-vl-7b",
    gpu: Annotated[list[str] | None, typer.Option(help="Target GPU classes (repeat the option).")] = None,
    calibrate: Annotated[
        list[str] | None,
        typer.Option(help="Calibration sizes WIDTHxHEIGHT:CHAT_TOKENS (two at least; repeat the option)."),
    ] = None,
    repeats: Annotated[int, typer.Option(help="Injections of each kind per measurement.")] = 15,
    out_dir: Annotated[Path, typer.Option(help="Where the JSON result goes.")] = Path("benchmarks/fidelity"),
    write: Annotated[
        bool, typer.Option("--write", help="Write the sized workloads into the profile's stand_in block.")
    ] = False,
) -> None:
    """Size the stand-in's frames, chat prompts and budget for each target GPU class, and measure the result."""
    import contextlib
    import json
    import re
    import shlex
    import sys

    from visioncap.bench.common.machine import machine_facts
    from visioncap.bench.common.servers import measured_vllm, without_prefix_cache
    from visioncap.bench.standin.sizing import (
        size_stand_in,
        stand_in_spec,
        target_shape,
        with_vllm_flag,
        write_stand_in,
    )
    from visioncap.config.profiles import load_profile
    from visioncap.config.settings import load_settings

    sizes = []
    for text in calibrate or ["640x480:256", "252x196:64"]:
        match = re.fullmatch(r"(\d+)x(\d+):(\d+)", text)
        if match is None:
            raise typer.BadParameter(f"{text!r} is not WIDTHxHEIGHT:CHAT_TOKENS", param_hint="--calibrate")
        sizes.append((int(match[1]), int(match[2]), int(match[3])))
    settings = load_settings()
    targets = [target_shape(target, name, settings.models_dir) for name in gpu or ["h200", "l4"]]
    # One chunk for every prompt measured, as the target's frame and chat prompts take at its budget: a prompt
    # split in two would pay a second step that the target does not.
    served = with_vllm_flag(
        without_prefix_cache(load_profile(profile, settings.models_dir)),
        "--max-num-batched-tokens",
        str(max(target.budget for target in targets)),
    )
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            measured_vllm(served, settings.server_python, Path("data/bench-fidelity"), "standin")
        )
        result = size_stand_in(server.base_url, served.served_model_name, targets, sizes, repeats, typer.echo)
    command = shlex.join(["visioncap", *sys.argv[1:]])
    result = {"profile": profile, "target": target, "command": command, "machine": machine_facts(), **result}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{served.name}-sized-for-{target}.json"
    path.write_text(json.dumps(portable(result), indent=2) + "\n")
    typer.echo(f"wrote {path}")
    if write:
        assert served.path is not None
        write_stand_in(served.path, stand_in_spec(target, result, f"{result['machine']['date']} ({path})"))
        typer.echo(f"wrote the stand_in block of {served.path}")


@bench_app.command("events")
def events_command(
    quick: Annotated[bool, typer.Option("--quick", help="Three events per count and 12 s phases (~3 min).")] = False,
) -> None:
    """Events described from 1, 3 and 6 frames: image tokens (ours, vLLM's, the gateway's), latency alone, and
    what the gateway's pacing does with them beside chat; benchmarks/results/events_multiframe.{json,md}."""
    from visioncap.bench.events.run import main

    raise typer.Exit(main(["--quick"] if quick else []))


@bench_app.command("overhead")
def overhead_command(
    profile: Annotated[str, typer.Option(help="Model profile (models/NAME.yaml).")] = "tiny-bench",
    rate: Annotated[float, typer.Option(help="Chats per second (Poisson arrivals), as `vllm bench serve`.")] = 4.0,
    prompts: Annotated[int, typer.Option(help="Chats per block.")] = 60,
    pairs: Annotated[int, typer.Option(help="ABBA pairs of blocks (direct and gateway once each per pair).")] = 4,
    input_len: Annotated[int, typer.Option(help="Prompt tokens per chat (random dataset).")] = 128,
    output_len: Annotated[int, typer.Option(help="Output tokens per chat (EOS ignored).")] = 32,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    out_dir: Annotated[Path, typer.Option(help="Where overhead.json and overhead.md go.")] = Path(
        "benchmarks/overhead"
    ),
) -> None:
    """The gateway's cost to chat: `vllm bench serve` through it against direct, ABBA-paired in one run."""
    import json
    import shlex
    import sys

    from visioncap.bench.overhead.run import OverheadOptions, report_lines, run_overhead
    from visioncap.config.profiles import load_profile
    from visioncap.config.settings import load_settings

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("visioncap.bench").setLevel(logging.INFO)
    settings = load_settings()
    options = OverheadOptions(
        profile=load_profile(profile, settings.models_dir),
        server_python=settings.server_python,
        work_dir=Path("data/bench-overhead"),
        request_rate=rate,
        prompts_per_block=prompts,
        pairs=pairs,
        input_len=input_len,
        output_len=output_len,
        seed=seed,
    )
    results = run_overhead(options)
    results["command"] = "visioncap bench " + shlex.join(sys.argv[sys.argv.index("overhead") :])
    lines = report_lines(results)
    typer.echo("\n".join(lines))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "overhead.json").write_text(json.dumps(portable(results), indent=2) + "\n")
    (out_dir / "overhead.md").write_text(f"`{results['command']}`\n\n" + "\n".join(lines) + "\n")
    typer.echo(f"wrote {out_dir}/overhead.json and overhead.md")


bench_app.command("search", context_settings=PASS_THROUGH)(search_command)
