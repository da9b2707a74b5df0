"""`visioncap tune`: the command line around `run_tune`."""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichBar
from rich.table import Table

from visioncap.bench.tune.progress import TuneProgress

if TYPE_CHECKING:
    from visioncap.bench.tune.run import TuneOptions

err = Console(stderr=True)


class BarProgress(TuneProgress):
    """A rich progress bar over candidates x steps, with a line per measured candidate."""

    def __init__(self, bar: RichBar, total: int) -> None:
        self.bar = bar
        self.task = bar.add_task("starting", total=total)

    def step(self, description: str) -> None:
        self.bar.update(self.task, description=description)

    def advance(self) -> None:
        self.bar.advance(self.task)

    def more(self, steps: int) -> None:
        total = self.bar.tasks[self.task].total or 0
        self.bar.update(self.task, total=total + steps)

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
    columns = ("candidate", "captions/s", "ITL p50", "ITL p99", "ITL p99 CI", "TTFT p50", "TTFT p99", "chats", "meets")
    for column in columns:
        table.add_column(column, justify="left" if column == "candidate" else "right")
    for c in results["candidates"]:
        m = c.get("measurement")
        label = c["label"] + (" (chosen)" if c["label"] == results["chosen"]["label"] else "")
        if m is None:
            table.add_row(label, "failed: " + (c.get("error") or "?").splitlines()[0][:60], *[""] * 7)
            continue
        table.add_row(
            label,
            _f(m["captions_per_s"], 2),
            _f(m["itl_p50_ms"], 1),
            _f(m["itl_p99_ms"], 1),
            "-" if not m.get("itl_p99_interval_ms") else "{:.1f}-{:.1f}".format(*m["itl_p99_interval_ms"]),
            _f(m["ttft_p50_ms"]),
            _f(m["ttft_p99_ms"]),
            str(m["chat_requests"]),
            "yes" if m["meets_objectives"] else "no",
        )
    return table


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
    from visioncap.bench.tune.arguments import TuneArgs, announcement, tune_options, tune_subject
    from visioncap.config.settings import load_settings

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    settings = load_settings()
    args = TuneArgs(
        profile=profile,
        gpu=gpu,
        budgets=budgets,
        thresholds=thresholds,
        ttft_p99_ms=ttft_p99_ms,
        itl_p99_ms=itl_p99_ms,
        duration_s=duration_s,
        quick=quick,
        chat_rate=chat_rate,
        flood_rate=flood_rate,
        flood_concurrency=flood_concurrency,
        image_size=image_size,
        out=out,
        no_write=no_write,
        seed=seed,
        fidelity_target=fidelity_target,
        fidelity_gpu=fidelity_gpu,
        stand_in=stand_in,
        level=level,
    )
    subject = tune_subject(args, settings.models_dir)
    options = tune_options(args, subject, settings.models_dir, settings.server_python, settings.data_dir)
    err.print(announcement(subject, options.candidates))
    results = _run_with_bar(options)
    print_results(results)
    _exit_unless_tuned(results, options.work_dir)


def _run_with_bar(options: TuneOptions) -> dict[str, Any]:
    """run_tune under a progress bar on stderr; SIGTERM unwinds like Ctrl-C, so the candidate's vLLM (a process
    group of its own) is stopped, not orphaned."""
    from visioncap.bench.tune.run import run_tune, total_steps

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
            return run_tune(options, BarProgress(bar, total_steps(options)))
    finally:
        signal.signal(signal.SIGTERM, previous)


def print_results(results: dict[str, Any]) -> None:
    """The candidates' table, the choice and its margins on stdout; warnings on stderr; the files written."""
    # A pipe or a file gets the whole table, not 80 columns.
    Console(width=None if sys.stdout.isatty() else 140).print(results_table(results))
    chosen = results["chosen"]
    margins = results["margins"]
    lines = [f"chosen: {chosen['label']} ({chosen['captions_per_s']} captions/s, ITL p99 {chosen['itl_p99_ms']} ms)"]
    tied = [label for label in results.get("tied") or () if label != chosen["label"]]
    if tied:
        why = "the cost model's shortest worst step on the target" if chosen.get("estimate") else "its lower p99"
        lines.append(f"tied with {', '.join(tied)} (inter-token p99 95 % intervals overlap): chosen for {why}")
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


def _exit_unless_tuned(results: dict[str, Any], work_dir: Path) -> None:
    """Exit 1, saying why, when the profile was left as it was or no candidate met the objectives."""
    if not results["complete"]:
        err.print(
            "[red]fewer than two candidates could be measured[/] (see the failures above and the vLLM logs in "
            f"{work_dir / 'logs'}); the profile was left as it was"
        )
        raise typer.Exit(1)
    if results.get("not_judged"):
        err.print(f"[red]not judged[/]: {results['not_judged']}; the profile was left as it was", highlight=False)
        raise typer.Exit(1)
    if not results["objectives_met"]:
        err.print(
            "[red]no candidate met the objectives[/]: the lowest inter-token p99 (or one tied with it) was "
            "chosen and recorded with objectives_met: false; relax --ttft-p99-ms/--itl-p99-ms or lighten the workload"
        )
        raise typer.Exit(1)
