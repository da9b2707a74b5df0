"""`python -m visioncap.serve --profile NAME`: the launcher without the application's other dependencies.

docker-compose runs this inside the official vLLM image (the package folder mounted read-only), so the
container computes its memory split on the GPU it gets, exactly as `visioncap serve` does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from visioncap.errors import VisioncapError
from visioncap.serve.command import FORMATS, ServeOptions, describe, planned_server, print_report, serve_foreground
from visioncap.serve.plan import DEFAULT_DETECTOR_GIB, DEFAULT_HEADROOM_GIB
from visioncap.serve.profiles import GPU_CLASSES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m visioncap.serve", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", required=True, help="model profile name (models/NAME.yaml) or a profile file")
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=Path(os.environ.get("VISIONCAP_MODELS_DIR", "models")),
        help="where profiles are looked up (VISIONCAP_MODELS_DIR)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--gpu", default="auto", choices=["auto", *GPU_CLASSES], help="GPU class (auto: nvidia-smi)")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="total GPU memory instead of nvidia-smi's")
    parser.add_argument("--detector-gib", type=float, default=DEFAULT_DETECTOR_GIB, help="GPU memory kept for YOLO")
    parser.add_argument("--headroom-gib", type=float, default=DEFAULT_HEADROOM_GIB, help="GPU memory kept free")
    parser.add_argument(
        "--served-model-alias",
        action="append",
        default=[],
        help="a further model name clients may send (repeatable); lets a pipeline name `vlm` whatever the profile",
    )
    parser.add_argument("--dry-run", action="store_true", help="print the vLLM command and the plan, start nothing")
    parser.add_argument("--format", choices=FORMATS, default="shell", help="dry-run output")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = ServeOptions(
        profile=args.profile,
        models_dir=args.models_dir,
        # In the vLLM image the server environment is this interpreter's.
        python=Path(os.environ.get("VISIONCAP_SERVER_PYTHON", sys.executable)),
        host=args.host,
        port=args.port,
        gpu=args.gpu,
        gpu_memory_gib=args.gpu_memory_gib,
        detector_gib=args.detector_gib,
        headroom_gib=args.headroom_gib,
        dry_run=args.dry_run,
        aliases=tuple(args.served_model_alias),
    )
    try:
        server = planned_server(options)
        print_report(server)
        if args.dry_run:
            print(describe(server, args.format))
            return 0
        return serve_foreground(server)
    except VisioncapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
