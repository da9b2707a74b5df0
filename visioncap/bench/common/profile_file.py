"""A model profile's file as the benchmarks that write into it see it: `visioncap tune`'s generated block at its
end (between marker lines) and a write that happens only when the edited text still loads as a profile. Shared
by `tune` (the tuned values) and `standin` (the generated stand_in block, placed before tune's block)."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from visioncap.config.profiles import ModelProfile
from visioncap.errors import ConfigError

BLOCK_START = (
    "# --- tuned by `visioncap tune` (generated: re-run it rather than editing; the rest of the file is yours) ---"
)
BLOCK_END = "# --- end of tuned ---"


def split_block(text: str) -> tuple[str, str]:
    """(the file without the generated block, the block); the block is everything from its start marker."""
    at = text.find(BLOCK_START)
    if at < 0:
        return text, ""
    return text[:at], text[at:]


def replace_profile(profile_path: Path, new_text: str) -> None:
    """Write a profile's new text in one step, only if it still loads as a profile (else nothing is written)."""
    try:
        ModelProfile.model_validate(yaml.safe_load(new_text))
    except ValidationError as exc:
        raise ConfigError(f"{profile_path}: the edited profile would not load, so it was not written: {exc}") from exc
    temporary = profile_path.with_suffix(profile_path.suffix + ".tmp")
    temporary.write_text(new_text, encoding="utf-8")
    temporary.replace(profile_path)
