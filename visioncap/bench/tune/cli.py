"""`visioncap tune`: the command line around `run_tune`."""

from __future__ import annotations

import logging
import shlex
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar
from rich.table import Table

from visioncap.bench.tune.progress import Progress
from visioncap.errors import ConfigError

if TYPE_CHECKING:
    from visioncap.bench.tune.run import StandInTarget
    from visioncap.config.profiles import ModelProfile

err = Console(stderr=True)


class BarProgress(Progress):
    """A rich progress bar over candidates x steps, with a line per measured candidate."""

    def __init__(self, bar: RichBar, total: int) -> None:
        self.bar = bar
        self.task = bar.add_task("starting", total=total)

    def step(self, description: str) -> None:
        self.bar.update(self.task, description=description)

    def advance(self) -> None:
        self.bar.advance(self.task)

    def note(self, line: str) -> None:
        self.bar.console.print(line, highlight=False)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def results_table(results: dict[str, Any]) -> Table:
    o = results["objectives"]
    table = Table(
        title=f"{results['profile']} on {results['gpu_class']}: objectives TTFT p99 <= {o['ttft_p99_ms']:g} ms, "
        f"inter-token p99 <= {o['itl_p99_ms']:g} ms"
    )
    for column in ("candidate", "captions/s", "ITL p50", "ITL p99", "TTFT p50", "TTFT p99", "chats", "meets"):
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for c in results["candidates"]:
        m = c.get("measurement")
        label = c["label"] + (" (chosen)" if c["label"] == results["chosen"]["label"] else "")
        if m is None:
            table.add_row(label, "failed: " + (c.get("error") or "?").splitlines()[0][:60], *[""] * 6)
            continue
        table.add_row(
            label,
            _f(m["captions_per_s"], 2),
            _f(m["itl_p50_ms"], 1),
            _f(m["itl_p99_ms"], 1),
            _f(m["ttft_p50_ms"]),
            _f(m["ttft_p99_ms"]),
            str(m["chat_requests"]),
            "yes" if m["meets_objectives"] else "no",
        )
    return table


def target_budgets(current: int | None) -> list[int]:
    """A GPU profile's budgets to try on a stand-in: a quarter, half, once and twice its current one."""
    base = current or 2048
    return sorted({max(64, base // 4), max(64, base // 2), base, base * 2})


def _stand_in(
    name: str, target: ModelProfile, gpu: str | None, gpu_class: str, models_dir: Path
) -> tuple[ModelProfile, StandInTarget]:
    """The stand-in profile and what it is measured for; ConfigError when it does not stand in for `target`."""
    from visioncap.bench.tune.run import StandInTarget
    from visioncap.config.profiles import load_profile

    if gpu is None or gpu_class == "cpu":
        raise ConfigError("--stand-in: name the GPU class to tune for with --gpu (e.g. --gpu h200)")
    served = load_profile(name, models_dir)
    spec = served.stand_in
    if spec is None or spec.target != target.name:
        raise ConfigError(f"--stand-in: {served.name} does not stand in for {target.name} (its stand_in.target)")
    workload = spec.workloads.get(gpu_class)  # type: ignore[call-overload]
    if workload is None:
        raise ConfigError(
            f"--stand-in: {served.name} has no workload for {gpu_class} (visioncap bench standin --write sizes one)"
        )
    return served, StandInTarget(target, gpu_class, workload.token_scale)


def tune_command(
    profile: Annotated[str, typer.Option(help="Model profile name (models/NAME.yaml) or a profile file.")],
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="GPU class (cpu, l4, a10, a100, h100, h200) to tune; default: detected as `visioncap serve` does.",
        ),
    ] = None,
    budgets: Annotated[
        str | None,
        typer.Option(
            help="Candidate max_num_batched_tokens, comma-separated (default: 128,256,512,1024 on cpu, "
            "2048,4096,8192,16384 on a GPU)."
        ),
    ] = None,
    thresholds: Annotated[
        str | None,
        typer.Option(
            help="Candidate long_prefill_token_threshold values, crossed with the budgets (default: not tuned)."
        ),
    ] = None,
    ttft_p99_ms: Annotated[
        float | None, typer.Option(help="Chat TTFT p99 objective (default: 1.5 x the best candidate's).")
    ] = None,
    itl_p99_ms: Annotated[
        float | None, typer.Option(help="Chat inter-token p99 objective (default: 1.25 x the best candidate's).")
    ] = None,
    duration_s: Annotated[
        float | None, typer.Option(help="Seconds of chat + flood per candidate (default 40; --quick 14).")
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="Short phases (about a minute per candidate here).")] = False,
    chat_rate: Annotated[float, typer.Option(help="Chat requests per second (Poisson arrivals).")] = 1.0,
    flood_rate: Annotated[
        float | None,
        typer.Option(
            help="Camera frames offered per second (default 12, more than served; with --stand-in 4, the rate "
            "`bench mixed` offers beside chat)."
        ),
    ] = None,
    flood_concurrency: Annotated[int, typer.Option(help="Caption requests in flight at most.")] = 8,
    image_size: Annotated[str, typer.Option(help="Camera frame size WIDTHxHEIGHT.")] = "640x480",
    out: Annotated[Path, typer.Option(help="Folder for the results (JSON and PNG).")] = Path("benchmarks/tune"),
    no_write: Annotated[bool, typer.Option("--no-write", help="Measure and report; leave the profile alone.")] = False,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 0,
    fidelity_target: Annotated[
        str | None,
        typer.Option(
            help="The profile this one stands in for (e.g. qwen2.5-vl-7b): its cost in decode steps is measured "
            "first, and an off-target stand-in is not judged and the profile not written."
        ),
    ] = None,
    fidelity_gpu: Annotated[str, typer.Option(help="The GPU class of --fidelity-target.")] = "h200",
    stand_in: Annotated[
        str | None,
        typer.Option(
            help="Tune --profile for --gpu on this CPU stand-in (a profile whose stand_in.target is --profile): "
            "the budgets are --profile's, served scaled by the stand-in's token ratio with its workload for --gpu; "
            "the choice is written into --profile's gpus.GPU with the cost model's figures beside it, unless the "
            "stand-in's fidelity, measured first, is off target."
        ),
    ] = None,
    level: Annotated[
        float | None,
        typer.Option(
            help="Objectives relative to chat alone: inter-token p99 <= LEVEL x chat alone's and TTFT p99 <= 1.5x "
            "(the frontier objective of `bench mixed`; default 1.25 with --stand-in, else the best candidate's)."
        ),
    ] = None,
) -> None:
    """Measure candidate chunked-prefill budgets under interactive chat + a camera flood and tune the profile.

    Starts vLLM once per candidate, measures chat inter-token and first-token latency (p50/p99) and caption
    throughput, picks the highest throughput that meets the latency objectives and writes it into the
    profile for the GPU class, with the date, hardware and every measurement; results go to OUT as
    PROFILE-GPU.json and .png. Exit 0 when a candidate met the objectives, 1 when none did (the lowest
    inter-token p99 is then written, marked objectives_met: false), 2 for bad options or profile.
    """
    from visioncap.bench.tune.candidates import build_candidates, default_budgets, parse_int_list
    from visioncap.bench.tune.run import TuneOptions, frame_size, run_tune, total_steps
    from visioncap.config.profiles import load_profile
    from visioncap.config.settings import Settings
    from visioncap.serve.plan import plan_serving

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        settings = Settings()
    except Exception as exc:  # pydantic's ValidationError, already naming the variable
        raise ConfigError(f"invalid VISIONCAP_* setting: {exc}") from exc
    loaded = load_profile(profile, settings.models_dir)
    # The class as `visioncap serve` picks it (nvidia-smi, else cpu); a class the profile lacks is refused here.
    gpu_class = plan_serving(loaded, gpu=gpu or "auto").gpu_class
    serving = loaded.serving_for(gpu_class)
    target: StandInTarget | None = None
    served = loaded
    if stand_in is not None:
        served, target = _stand_in(stand_in, loaded, gpu, gpu_class, settings.models_dir)
        gpu_class = plan_serving(served, gpu="auto").gpu_class  # where the stand-in runs: this machine
        if level is None and ttft_p99_ms is None and itl_p99_ms is None:
            level = 1.25
    if level is not None and (ttft_p99_ms is not None or itl_p99_ms is not None):
        raise ConfigError("--level: objectives relative to chat alone exclude --ttft-p99-ms/--itl-p99-ms")
    if level is not None and level <= 0:
        raise ConfigError(f"--level: must be above 0, not {level}")
    if budgets is not None:
        budget_list = parse_int_list(budgets, "--budgets")
    elif target is not None:
        budget_list = target_budgets(serving.max_num_batched_tokens)
    else:
        budget_list = default_budgets(gpu_class)
    threshold_list = parse_int_list(thresholds, "--thresholds") if thresholds is not None else None
    candidates = build_candidates(budget_list, threshold_list, serving.max_model_len, serving.max_num_seqs)
    try:
        width, height = (int(v) for v in image_size.lower().split("x"))
    except ValueError as exc:
        raise ConfigError(f"--image-size: {image_size!r} is not WIDTHxHEIGHT (e.g. 640x480)") from exc
    if width < 28 or height < 28:
        raise ConfigError(f"--image-size: {image_size!r} is smaller than one image token (28x28)")
    width, height = frame_size(width, height, loaded.image.max_pixels)
    if flood_rate is None:
        flood_rate = 4.0 if target is not None else 12.0
    for name, value in (
        ("--chat-rate", chat_rate),
        ("--flood-rate", flood_rate),
        ("--flood-concurrency", flood_concurrency),
    ):
        if value <= 0:
            raise ConfigError(f"{name}: must be above 0, not {value}")
    for name, value in (("--ttft-p99-ms", ttft_p99_ms), ("--itl-p99-ms", itl_p99_ms), ("--duration-s", duration_s)):
        if value is not None and value <= 0:
            raise ConfigError(f"{name}: must be above 0, not {value}")
    values: dict[str, Any] = TuneOptions.quick_defaults() if quick else {}
    if duration_s is not None:
        values["duration_s"] = duration_s
    if level is not None:
        # The objectives rest on chat alone: as long a reference as a candidate's phase.
        values["reference_s"] = values.get("duration_s", TuneOptions.duration_s)
    options = TuneOptions(
        profile=served.name if target is not None else profile,
        gpu_class=gpu_class,
        candidates=candidates,
        models_dir=settings.models_dir,
        server_python=settings.server_python,
        out_dir=out,
        work_dir=settings.data_dir / "tune",
        ttft_p99_ms=ttft_p99_ms,
        itl_p99_ms=itl_p99_ms,
        chat_rate_per_s=chat_rate,
        flood_rate_per_s=flood_rate,
        flood_concurrency=flood_concurrency,
        image_width=width,
        image_height=height,
        seed=seed,
        fidelity_target=fidelity_target,
        fidelity_gpu=fidelity_gpu,
        stand_in_for=target,
        objective_level=level,
        write=not no_write,
        command=shlex.join(["visioncap", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else "visioncap tune",
        **values,
    )
    if options.duration_s <= options.warmup_s + 1:
        raise ConfigError(f"--duration-s: must be above the {options.warmup_s:g} s warm-up plus 1 s")
    on = f" on the stand-in {served.name} ({gpu_class}, x{target.token_scale:g} tokens)" if target else ""
    err.print(
        f"tuning {loaded.name} for {target.gpu_class if target else gpu_class}{on}: {len(candidates)} candidates "
        f"({', '.join(c.label for c in candidates)})"
    )
    # SIGTERM unwinds like Ctrl-C, so the candidate's vLLM (a process group of its own) is stopped, not orphaned.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with RichBar(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            transient=False,
        ) as bar:
            results = run_tune(options, BarProgress(bar, total_steps(options)))
    finally:
        signal.signal(signal.SIGTERM, previous)
    # A pipe or a file gets the whole table, not 80 columns.
    Console(width=None if sys.stdout.isatty() else 140).print(results_table(results))
    chosen = results["chosen"]
    margins = results["margins"]
    lines = [f"chosen: {chosen['label']} ({chosen['captions_per_s']} captions/s, ITL p99 {chosen['itl_p99_ms']} ms)"]
    low = margins.get("lowest_throughput")
    if low and low["candidate"] != chosen["label"]:
        lines.append(f"vs the lowest throughput ({low['candidate']}): {low['throughput_gain_pct']:+} % captions/s")
    high = margins.get("highest_itl_p99")
    if high and high["candidate"] != chosen["label"]:
        lines.append(f"vs the highest ITL p99 ({high['candidate']}): {high['itl_p99_reduction_pct']} % lower ITL p99")
    for line in lines:
        typer.echo(line)
    for warning in results.get("warnings") or ():
        err.print(f"[yellow]warning[/]: {warning}", highlight=False)
    written = results.get("profile_written")
    typer.echo(f"wrote {results['files']['json']}, {results['files']['png']}" + (f", {written}" if written else ""))
    if not results["complete"]:
        err.print(
            "[red]fewer than two candidates could be measured[/] (see the failures above and the vLLM logs in "
            f"{options.work_dir / 'logs'}); the profile was left as it was"
        )
        raise typer.Exit(1)
    if results.get("not_judged"):
        err.print(f"[red]not judged[/]: {results['not_judged']}; the profile was left as it was", highlight=False)
        raise typer.Exit(1)
    if not results["objectives_met"]:
        err.print(
            "[red]no candidate met the objectives[/]: the lowest inter-token p99 was chosen and recorded with "
            "objectives_met: false; relax --ttft-p99-ms/--itl-p99-ms or lighten the workload"
        )
        raise typer.Exit(1)
