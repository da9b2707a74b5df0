"""Parses `vllm serve` argument lists with vLLM's own parser, without starting a server.

Run by path with the server environment's Python (vLLM is not importable from the app environment):

    .venv-vllm/bin/python tests/vllm_args_check.py < commands.json

stdin: a JSON object {label: [model, --flag, value, ...]} (what follows `vllm serve`); stdout: a JSON object
{label: null | "problem"}. Besides argparse (unknown flags, bad choices, malformed JSON values) it runs vLLM's
serve-argument validation, builds the engine arguments and the scheduler config, whose checks catch
combinations vLLM would refuse at start-up (budget below max_num_seqs, a threshold above max_model_len).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path

ENTRY = Path(__file__).resolve().parents[1] / "visioncap" / "serve" / "vllm_entry.py"


def _install_cpu_alias() -> None:
    # The project's entry module makes `import vllm` work in the CPU build (see its docstring).
    spec = importlib.util.spec_from_file_location("visioncap_vllm_entry", ENTRY)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


def main() -> int:
    commands: dict[str, list[str]] = json.load(sys.stdin)
    _install_cpu_alias()
    from vllm.config import SchedulerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    serve = ServeSubcommand().subparser_init(parser.add_subparsers(dest="subparser"))
    results: dict[str, str | None] = {}
    for label, argv in commands.items():
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                args = serve.parse_args(argv)
            validate_parsed_serve_args(args)
            args.model = args.model_tag
            engine = AsyncEngineArgs.from_cli_args(args)
            if engine.max_num_batched_tokens is not None:
                SchedulerConfig(
                    max_model_len=engine.max_model_len or 8192,
                    is_encoder_decoder=False,
                    max_num_batched_tokens=engine.max_num_batched_tokens,
                    max_num_seqs=engine.max_num_seqs or 256,
                    long_prefill_token_threshold=engine.long_prefill_token_threshold,
                    policy=engine.scheduling_policy,
                    enable_chunked_prefill=True,
                )
            results[label] = None
        except SystemExit:
            results[label] = errors.getvalue().strip().splitlines()[-1] if errors.getvalue() else "argparse exit"
        except Exception as exc:  # every refusal is reported per command, not as a crash
            results[label] = f"{type(exc).__name__}: {exc}"
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
