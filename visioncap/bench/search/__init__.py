"""The search benchmarks: the REST API on a million captions (`api`, `python -m visioncap.bench.search.api`) and
retrieval quality (`quality`, `python -m visioncap.bench.search.quality`); `visioncap bench search quality|api ARGS`
runs either with its own options."""

from __future__ import annotations

import typer

# The benchmarks keep their own argparse options; `bench search` (mounted in visioncap/bench/cli.py with these
# settings) hands them over untouched.
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def search_command(ctx: typer.Context, which: str = typer.Argument(help="quality or api")) -> None:
    """Search quality on the labelled sets and latency at scale (`quality`), or the REST API's (`api`)."""
    # Imported here: they load the embedder's stack, which `visioncap --help` should not pay for.
    if which == "quality":
        from visioncap.bench.search.quality import main
    elif which == "api":
        from visioncap.bench.search.api import main
    else:
        raise typer.BadParameter("quality or api", param_hint="WHICH")
    raise typer.Exit(main(ctx.args))
