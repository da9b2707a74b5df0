"""What `make demo` prints last: the command that opens the web page on the demo's captions, with a new key.

The key is made here as `visioncap api-key` makes one and shown once; the command carries only its SHA-256
(VISIONCAP_API_KEYS). Run as `python -m visioncap.demo_page DATA_DIR [VISIONCAP]` (the Makefile's `demo`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from visioncap.config.keys import generate_key

API_PORT = 8090  # `visioncap api`'s default port
DEMO_DATABASE = "demo.db"


def page_command(data_dir: Path, visioncap: str = "visioncap") -> tuple[str, str]:
    """A new read key, and the command that serves the API and web page on the demo's database with it."""
    key, digest = generate_key("vca-")
    keys = json.dumps([{"name": "demo-page", "sha256": digest, "scopes": ["read"]}], separators=(",", ":"))
    data_dir = data_dir.resolve()
    env = {
        "VISIONCAP_DATA_DIR": str(data_dir),  # the frames the captions' thumbnails show
        "VISIONCAP_DATABASE_URL": f"sqlite:///{data_dir / DEMO_DATABASE}",
        "VISIONCAP_API_KEYS": keys,
    }
    assignments = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return key, f"{assignments} {shlex.quote(visioncap)} api --port {API_PORT}"


def lines(data_dir: Path, visioncap: str = "visioncap") -> list[str]:
    key, command = page_command(data_dir, visioncap)
    return [
        "",
        "The demo's captions in the web page: run",
        f"  {command}",
        f"then open http://127.0.0.1:{API_PORT}/ and enter the key {key} (printed only here).",
        "To ask about them in the page (Ask), the VLM must be up too; from this folder, in another terminal:",
        f"  {shlex.quote(visioncap)} serve --profile tiny",
    ]


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print("usage: python -m visioncap.demo_page DATA_DIR [VISIONCAP]", file=sys.stderr)
        return 2
    print("\n".join(lines(Path(argv[0]), *argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
