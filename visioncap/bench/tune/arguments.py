"""`visioncap tune`'s command-line values, checked and turned into the `TuneOptions` of a run.

Every check runs before any server starts, in the order the options are read, so a bad value costs nothing.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from visioncap.errors import ConfigError

if TYPE_CHECKING:
    from visioncap.bench.tune.candidates import Candidate
    from visioncap.bench.tune.run import StandInTarget, TuneOptions
    from visioncap.config.profiles import ModelProfile


@dataclass(frozen=True)
class TuneArgs:
    """The command line's values as given (each one's help is on `tune_command`)."""

    profile: str
    gpu: str | None = None
    budgets: str | None = None
    thresholds: str | None = None
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    duration_s: float | None = None
    quick: bool = False
    chat_rate: float = 1.0
    flood_rate: float | None = None
    flood_concurrency: int = 8
    image_size: str = "640x480"
    out: Path = Path("benchmarks/tune")
    no_write: bool = False
    seed: int = 0
    fidelity_target: str | None = None
    fidelity_gpu: str = "h200"
    stand_in: str | None = None
    level: float | None = None


@dataclass(frozen=True)
class TuneSubject:
    """The profile tuned for a GPU class, and what vLLM serves to measure it."""

    profile: ModelProfile  # its gpus.<tuned_class> is what is tuned
    tuned_class: str
    served: ModelProfile  # the profile itself, or its CPU stand-in
    gpu_class: str  # where `served` runs
    stand_in: StandInTarget | None


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


def tune_subject(args: TuneArgs, models_dir: Path) -> TuneSubject:
    """--profile on its GPU class, and --stand-in when one is named."""
    from visioncap.config.profiles import load_profile
    from visioncap.serve.plan import plan_serving

    loaded = load_profile(args.profile, models_dir)
    # The class as `visioncap serve` picks it (nvidia-smi, else cpu); a class the profile lacks is refused here.
    gpu_class = plan_serving(loaded, gpu=args.gpu or "auto").gpu_class
    if args.stand_in is None:
        return TuneSubject(loaded, gpu_class, loaded, gpu_class, None)
    served, target = _stand_in(args.stand_in, loaded, args.gpu, gpu_class, models_dir)
    # The stand-in runs where it is: this machine.
    return TuneSubject(loaded, gpu_class, served, plan_serving(served, gpu="auto").gpu_class, target)


def objective_level(args: TuneArgs, on_stand_in: bool) -> float | None:
    """--level, 1.25 by default on a stand-in given no objective of its own; it excludes the absolute ones."""
    absolute = args.ttft_p99_ms is not None or args.itl_p99_ms is not None
    level = 1.25 if on_stand_in and args.level is None and not absolute else args.level
    if level is not None and absolute:
        raise ConfigError("--level: objectives relative to chat alone exclude --ttft-p99-ms/--itl-p99-ms")
    if level is not None and level <= 0:
        raise ConfigError(f"--level: must be above 0, not {level}")
    return level


def tune_candidates(args: TuneArgs, subject: TuneSubject) -> list[Candidate]:
    """--budgets (x --thresholds), by default the GPU profile's around its own on a stand-in, else the class's."""
    from visioncap.bench.tune.candidates import build_candidates, default_budgets, parse_int_list

    serving = subject.profile.serving_for(subject.tuned_class)
    if args.budgets is not None:
        budget_list = parse_int_list(args.budgets, "--budgets")
    elif subject.stand_in is not None:
        budget_list = target_budgets(serving.max_num_batched_tokens)
    else:
        budget_list = default_budgets(subject.gpu_class)
    threshold_list = parse_int_list(args.thresholds, "--thresholds") if args.thresholds is not None else None
    return build_candidates(budget_list, threshold_list, serving.max_model_len, serving.max_num_seqs)


def camera_frame(image_size: str, max_pixels: int | None) -> tuple[int, int]:
    """--image-size as WIDTH, HEIGHT, shrunk to the profile's largest image."""
    from visioncap.bench.tune.run import frame_size

    try:
        width, height = (int(v) for v in image_size.lower().split("x"))
    except ValueError as exc:
        raise ConfigError(f"--image-size: {image_size!r} is not WIDTHxHEIGHT (e.g. 640x480)") from exc
    if width < 28 or height < 28:
        raise ConfigError(f"--image-size: {image_size!r} is smaller than one image token (28x28)")
    return frame_size(width, height, max_pixels)


def _check_positive(args: TuneArgs, flood_rate: float) -> None:
    for name, value in (
        ("--chat-rate", args.chat_rate),
        ("--flood-rate", flood_rate),
        ("--flood-concurrency", args.flood_concurrency),
    ):
        if value <= 0:
            raise ConfigError(f"{name}: must be above 0, not {value}")
    for name, optional in (
        ("--ttft-p99-ms", args.ttft_p99_ms),
        ("--itl-p99-ms", args.itl_p99_ms),
        ("--duration-s", args.duration_s),
    ):
        if optional is not None and optional <= 0:
            raise ConfigError(f"{name}: must be above 0, not {optional}")


def tune_options(
    args: TuneArgs, subject: TuneSubject, models_dir: Path, server_python: Path, data_dir: Path
) -> TuneOptions:
    """The run's options from the checked command line; ConfigError naming the first bad option."""
    from visioncap.bench.tune.run import TuneOptions

    level = objective_level(args, subject.stand_in is not None)
    candidates = tune_candidates(args, subject)
    width, height = camera_frame(args.image_size, subject.profile.image.max_pixels)
    flood_rate = args.flood_rate
    if flood_rate is None:
        flood_rate = 4.0 if subject.stand_in is not None else 12.0
    _check_positive(args, flood_rate)
    values: dict[str, Any] = TuneOptions.quick_defaults() if args.quick else {}
    if args.duration_s is not None:
        values["duration_s"] = args.duration_s
    if level is not None:
        # The objectives rest on chat alone: as long a reference as a candidate's phase.
        values["reference_s"] = values.get("duration_s", TuneOptions.duration_s)
    options = TuneOptions(
        profile=subject.served.name if subject.stand_in is not None else args.profile,
        gpu_class=subject.gpu_class,
        candidates=candidates,
        models_dir=models_dir,
        server_python=server_python,
        out_dir=args.out,
        work_dir=data_dir / "tune",
        ttft_p99_ms=args.ttft_p99_ms,
        itl_p99_ms=args.itl_p99_ms,
        chat_rate_per_s=args.chat_rate,
        flood_rate_per_s=flood_rate,
        flood_concurrency=args.flood_concurrency,
        image_width=width,
        image_height=height,
        seed=args.seed,
        fidelity_target=args.fidelity_target,
        fidelity_gpu=args.fidelity_gpu,
        stand_in_for=subject.stand_in,
        objective_level=level,
        write=not args.no_write,
        command=shlex.join(["visioncap", *sys.argv[1:]]) if sys.argv[1:2] == ["tune"] else "visioncap tune",
        **values,
    )
    if options.duration_s <= options.warmup_s + 1:
        raise ConfigError(f"--duration-s: must be above the {options.warmup_s:g} s warm-up plus 1 s")
    return options


def announcement(subject: TuneSubject, candidates: list[Candidate]) -> str:
    """The line saying what is tuned, where, and with which candidates."""
    on = ""
    if subject.stand_in is not None:
        scale = subject.stand_in.token_scale
        on = f" on the stand-in {subject.served.name} ({subject.gpu_class}, x{scale:g} tokens)"
    return (
        f"tuning {subject.profile.name} for {subject.tuned_class}{on}: {len(candidates)} candidates "
        f"({', '.join(c.label for c in candidates)})"
    )
