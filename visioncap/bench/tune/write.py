"""Writing a tuning run's results: the JSON file and the tuned values in the profile YAML.

PyYAML would drop the profile's comments if the file were loaded and dumped again (ruamel.yaml is not a
dependency), so the profile is edited as text: the serving values are replaced where they stand, found by
the positions PyYAML's composer reports for each node, and the provenance record is one generated block at
the end of the file, between marker lines, rewritten whole on each run. Everything else stays byte for byte.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from visioncap.bench.common.machine import portable
from visioncap.bench.common.profile_file import BLOCK_END, BLOCK_START, replace_profile, split_block
from visioncap.config.tuned import TunedMeasurement, TunedObjectives, TunedRecord
from visioncap.errors import ConfigError


def write_results(results: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(results), indent=1) + "\n", encoding="utf-8")


# -- text edits located by PyYAML's node marks --------------------------------------------------------------


def _node_at(root: yaml.Node, path: list[str | int]) -> yaml.Node | None:
    node: yaml.Node | None = root
    for part in path:
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            node = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            return None
    return node


def _offsets(text: str) -> list[int]:
    """Character offset of each line's start (PyYAML marks give line and column)."""
    starts, total = [0], 0
    for line in text.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


def replace_scalar(text: str, path: list[str | int], value: str) -> str | None:
    """`text` with the scalar at `path` replaced by `value` (plain YAML), or None when there is none."""
    root = yaml.compose(text)
    node = _node_at(root, path) if root is not None else None
    if not isinstance(node, yaml.ScalarNode):
        return None
    starts = _offsets(text)
    begin = starts[node.start_mark.line] + node.start_mark.column
    end = starts[node.end_mark.line] + node.end_mark.column
    return text[:begin] + value + text[end:]


def _line_after(node: yaml.Node) -> int:
    """The line just after a node: a scalar or flow collection ends on its own line; a block collection's end
    mark is already the line of the next token."""
    block = isinstance(node, yaml.CollectionNode) and not node.flow_style
    line = int(node.end_mark.line)
    return line + 1 if not block and node.end_mark.column > 0 else line


def insert_key(text: str, path: list[str | int], key: str, value: str) -> str | None:
    """`text` with `key: value` added to the block mapping at `path`, after its last entry; None if not one."""
    root = yaml.compose(text)
    node = _node_at(root, path) if root is not None else None
    if not isinstance(node, yaml.MappingNode) or node.flow_style or not node.value:
        return None
    indent = node.value[0][0].start_mark.column
    after = _line_after(node.value[-1][1])
    lines = text.splitlines(keepends=True)
    if 0 < after <= len(lines) and not lines[after - 1].endswith("\n"):
        lines[after - 1] += "\n"
    return "".join([*lines[:after], " " * indent + f"{key}: {value}\n", *lines[after:]])


# -- the serving values --------------------------------------------------------------------------------------

_FLAGS = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
}


def set_serving_value(text: str, data: dict[str, Any], gpu_class: str, field: str, value: int) -> str:
    """The profile text with one tuned serving value set where the profile keeps it for the GPU class:
    `gpus.<class>.<field>` when the profile has per-class values, `serving.<field>` when one set serves any."""
    flag = _FLAGS[field]
    lists = [*(data.get("vllm_args") or [])]
    for section in [data.get("serving"), *((data.get("gpus") or {}).values())]:
        if isinstance(section, dict):
            lists += section.get("extra_args") or []
    if any(str(arg).split("=", 1)[0] == flag for arg in lists):
        raise ConfigError(
            f"the profile passes {flag} in an argument list; move it to the {field} field so `visioncap tune` "
            "can set it"
        )
    gpus = data.get("gpus")
    if isinstance(gpus, dict) and gpus:
        if not isinstance(gpus.get(gpu_class), dict):
            raise ConfigError(f"the profile has no gpus.{gpu_class} mapping to write the tuned {field} into")
        path: list[str | int] = ["gpus", gpu_class]
    elif isinstance(data.get("serving"), dict) and data["serving"]:
        path = ["serving"]
    else:
        # No serving values at all: a new section of its own, after everything else.
        return text.rstrip("\n") + f"\nserving:\n  {field}: {value}\n"
    edited = replace_scalar(text, [*path, field], str(value))
    if edited is None:
        edited = insert_key(text, path, field, str(value))
    if edited is None:
        raise ConfigError(f"cannot place {'.'.join(map(str, path))}.{field} in the profile (a flow-style mapping?)")
    return edited


# -- the generated provenance block ---------------------------------------------------------------------------


def render_block(records: dict[str, TunedRecord]) -> str:
    body = yaml.safe_dump(
        {"tuned": {gpu: record.model_dump(mode="json") for gpu, record in sorted(records.items())}},
        sort_keys=False,
        width=120,
        default_flow_style=None,
    )
    return f"{BLOCK_START}\n{body}{BLOCK_END}\n"


def write_tuned(
    profile_path: Path,
    gpu_class: str,
    results: dict[str, Any],
    marked: list[TunedMeasurement],
    target: TunedObjectives,
    met: bool,
    finished_at: datetime,
    workload: str,
    measured_on: str | None = None,
) -> TunedRecord:
    """Set the chosen values for the GPU class in the profile and record how they were chosen (`workload`: the
    run's, as `TuneOptions.workload_line` says it; `measured_on`: the stand-in that was served instead of the
    profile)."""
    text = profile_path.read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    chosen = results["chosen"]
    head, block = split_block(text)
    if "tuned" in data and not block:
        raise ConfigError(
            f"{profile_path}: its `tuned:` section is not the block `visioncap tune` generates; remove it first"
        )
    head = set_serving_value(head, data, gpu_class, "max_num_batched_tokens", chosen["max_num_batched_tokens"])
    if chosen.get("long_prefill_token_threshold") is not None:
        head = set_serving_value(
            head, data, gpu_class, "long_prefill_token_threshold", chosen["long_prefill_token_threshold"]
        )
    tuned = data.get("tuned")
    existing: dict[str, Any] = tuned if isinstance(tuned, dict) else {}
    try:  # records of the other GPU classes are kept as they are
        records = {gpu: TunedRecord.model_validate(value) for gpu, value in existing.items() if gpu != gpu_class}
    except ValidationError as exc:
        raise ConfigError(f"{profile_path}: the generated `tuned:` block no longer reads: {exc}") from exc
    records[gpu_class] = TunedRecord(
        date=finished_at.replace(microsecond=0),
        hardware=results["hardware"],
        max_num_batched_tokens=chosen["max_num_batched_tokens"],
        long_prefill_token_threshold=chosen.get("long_prefill_token_threshold"),
        objectives_met=met,
        objectives=target,
        workload=workload,
        measured_on=measured_on,
        candidates=marked,
    )
    replace_profile(profile_path, head.rstrip("\n") + "\n" + render_block(records))
    return records[gpu_class]
