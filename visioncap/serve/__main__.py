"""`python -m visioncap.serve --profile NAME`: the launcher without the application's other dependencies.

docker-compose runs this inside the official vLLM image (the package folder mounted read-only), so the
container computes its memory split on the GPU it gets, exactly as `visioncap serve` does: both run
visioncap.serve.command.main. The image lacks pydantic-settings, so the two settings it needs are read here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from visioncap.serve.command import main

if __name__ == "__main__":
    sys.exit(
        main(
            sys.argv[1:],
            prog="python -m visioncap.serve",
            models_dir=Path(os.environ.get("VISIONCAP_MODELS_DIR", "models")),
            # In the vLLM image the server environment is this interpreter's.
            python=Path(os.environ.get("VISIONCAP_SERVER_PYTHON", sys.executable)),
        )
    )
