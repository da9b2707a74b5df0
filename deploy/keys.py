"""Write the keys a docker-compose deployment needs: `python3 deploy/keys.py` (any Python 3.11, standard library).

Makes .env from .env.example when there is none, and fills in, with new random values, every key that is empty
there: vLLM's key, the pipeline's captions key, Ask's key, the alerts service's key, an API key for the web page
(its sha256 in VISIONCAP_API_KEYS; the key itself is printed once), and with --postgres the PostgreSQL password
and the database URL. The gateway file (a copy of pipelines/compose-gateway.yaml with the published demo keys'
hashes replaced by those of the captions, Ask and alerts keys) goes to data/compose/gateway.yaml, named by
VISIONCAP_GATEWAY_FILE. Keys already set are kept: running it again changes nothing but what a newer release
added (after an upgrade: its new keys, and the gateway file made again from its template with the same keys).
--json prints every new key (for scripts, tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import secrets
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# The demo keys' hashes in pipelines/compose-gateway.yaml, and the .env variable whose key replaces each.
GATEWAY_HASHES = {
    "f1eefe40ea727c7199f969578bf94bbc10411d36d7c70e62d4af33ba17964972": "VISIONCAP_ASK_KEY",  # chat-ui
    "88c69c6d477631a08faa10a34e7848e791473a3855bd11684ef3ff59c8ba9a9b": "VISIONCAP_CAPTIONS_KEY",  # captions
    "1f172170bcde18843f0a8fb2d066d5578f7d96f9357af642efe171b1cf4572cc": "VISIONCAP_ALERTS_KEY",  # alerts
}
_LINE = re.compile(r"^#?\s?([A-Z][A-Z0-9_]*)=(.*)$")


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_env(text: str) -> dict[str, str]:
    """The variables an env file sets (commented lines left out)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and not line.startswith("#"):
            values[match.group(1)] = match.group(2)
    return values


def set_env(text: str, name: str, value: str) -> str:
    """`text` with NAME=value: the set line replaced, else the first commented one, else a line appended."""
    for pattern in (rf"^{name}=.*$", rf"^#\s?{name}=.*$"):
        new, count = re.subn(pattern, lambda _: f"{name}={value}", text, count=1, flags=re.MULTILINE)
        if count:
            return new
    return text.rstrip("\n") + f"\n{name}={value}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-file", type=Path, default=REPO / ".env")
    parser.add_argument("--gateway-file", type=Path, default=REPO / "data" / "compose" / "gateway.yaml")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL (profile postgres) instead of SQLite")
    parser.add_argument("--json", action="store_true", help="print the new keys as JSON")
    args = parser.parse_args(argv)

    env_file: Path = args.env_file
    text = env_file.read_text() if env_file.exists() else (REPO / ".env.example").read_text()
    current = read_env(text)
    new: dict[str, str] = {}

    def ensure(name: str, make: str) -> str:
        nonlocal text
        if current.get(name):
            return current[name]
        new[name] = make
        text = set_env(text, name, make)
        return make

    ensure("VLLM_API_KEY", secrets.token_hex(32))
    ensure("VISIONCAP_CAPTIONS_KEY", "vc-" + secrets.token_urlsafe(24))
    ensure("VISIONCAP_ASK_KEY", "vc-" + secrets.token_urlsafe(24))
    ensure("VISIONCAP_ALERTS_KEY", "vc-" + secrets.token_urlsafe(24))
    if not current.get("VISIONCAP_API_KEYS") or current["VISIONCAP_API_KEYS"] == "[]":
        api_key = "vca-" + secrets.token_urlsafe(24)
        entry = [{"name": "ui", "sha256": sha256(api_key), "scopes": ["read", "write"]}]
        new["VISIONCAP_API_KEY"] = api_key  # printed, never written: only its hash is configured
        # Single-quoted: the value is JSON, with double quotes of its own.
        text = set_env(text, "VISIONCAP_API_KEYS", "'" + json.dumps(entry, separators=(",", ":")) + "'")
    if args.postgres:
        text = set_env(text, "COMPOSE_PROFILES", "postgres")
        # Hex: it goes into the database URL, where it needs no escaping.
        password = ensure("POSTGRES_PASSWORD", secrets.token_hex(24))
        url = f"postgresql+psycopg://visioncap:{password}@postgres:5432/visioncap"
        text = set_env(text, "VISIONCAP_DATABASE_URL", url)

    gateway: Path = args.gateway_file
    keys = read_env(text)
    template = (REPO / "pipelines" / "compose-gateway.yaml").read_text()
    for demo_hash, name in GATEWAY_HASHES.items():
        template = template.replace(demo_hash, sha256(keys[name]))
    template = re.sub(r'   # "demo-[a-z]+-key"', "   # made by deploy/keys.py", template)
    gateway.parent.mkdir(parents=True, exist_ok=True)
    gateway.write_text(template)
    # Relative to the checkout (compose's project folder, where compose resolves relative paths) when it lies in
    # it, as .env.example's paths are.
    named = gateway.resolve()
    shown = f"./{named.relative_to(REPO)}" if named.is_relative_to(REPO) else str(named)
    text = set_env(text, "VISIONCAP_GATEWAY_FILE", shown)

    env_file.parent.mkdir(parents=True, exist_ok=True)
    env_file.write_text(text)
    env_file.chmod(0o600)
    if args.json:
        print(json.dumps(new))
    else:
        print(f"{env_file}: {', '.join(sorted(new)) or 'every key was already set'}; gateway file: {gateway}")
        if "VISIONCAP_API_KEY" in new:
            print(
                "API key for the web page (shown once; its sha256 is in VISIONCAP_API_KEYS):", new["VISIONCAP_API_KEY"]
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
