"""Cutting a window's captions into parts that fit the model's context, the prompts, and the citations.

A window that fits one request is summarised in one; a longer one is cut into consecutive parts, each part is
summarised, and the parts' summaries are summarised in turn (cut again if they do not fit) until one remains.
Sizes are estimated from characters (no tokenizer at hand), or from the token count the model reported for a
text it wrote, whichever is larger.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

SYSTEM_PROMPT = (
    "You summarise what security cameras saw, for a person who was not watching. Use only the lines given. "
    "After each statement cite the caption ids it rests on in square brackets, like [c123]. Be brief and factual."
)
CITATION = re.compile(r"\bc(\d{1,18})\b")


@dataclass(frozen=True, slots=True)
class Item:
    """One line of a prompt: a caption, or the summary of a part; `ids`: the caption ids it stands for."""

    text: str
    tokens: int
    ids: tuple[int, ...]
    start: datetime
    end: datetime


def estimate_tokens(text: str, chars_per_token: float, reported: int = 0) -> int:
    # Digits and non-ASCII characters are counted a token each (Qwen's tokenizer splits numbers into digits, and
    # ids and times are most of a caption line's digits); the rest at `chars_per_token`.
    single = sum(1 for char in text if char.isdigit() or not char.isascii())
    estimate = single + math.ceil((len(text) - single) / chars_per_token)
    return max(estimate, reported) + 1  # +1: the line break


def caption_item(
    caption_id: int,
    camera: str,
    captured_at: datetime,
    text: str,
    zone: ZoneInfo,
    max_chars: int,
    chars_per_token: float,
) -> Item:
    words = " ".join(text.split())
    if len(words) > max_chars:
        words = words[: max_chars - 1] + "…"
    line = f"[c{caption_id}] {captured_at.astimezone(zone):%H:%M} {camera}: {words}"
    return Item(line, estimate_tokens(line, chars_per_token), (caption_id,), captured_at, captured_at)


def part_item(
    index: int,
    text: str,
    reported_tokens: int,
    ids: tuple[int, ...],
    start: datetime,
    end: datetime,
    zone: ZoneInfo,
    chars_per_token: float,
) -> Item:
    words = " ".join(text.split())
    line = f"Part {index + 1} ({start.astimezone(zone):%H:%M}-{end.astimezone(zone):%H:%M}): {words}"
    # The model's own count of what it wrote, with a margin: text read back may tokenize a little longer.
    reported = math.ceil(reported_tokens * 1.25) + 16
    return Item(line, estimate_tokens(line, chars_per_token, reported), ids, start, end)


def cut(items: Sequence[Item], budget: int) -> list[list[Item]]:
    """Consecutive parts of at most `budget` tokens each (an item larger than that alone is a part: the caller
    cuts captions short enough that none is)."""
    parts: list[list[Item]] = []
    current: list[Item] = []
    used = 0
    for item in items:
        if current and used + item.tokens > budget:
            parts.append(current)
            current, used = [], 0
        current.append(item)
        used += item.tokens
    if current:
        parts.append(current)
    return parts


def user_prompt(heading: str, items: Sequence[Item], of_parts: bool) -> str:
    what = (
        "Summaries of consecutive parts of the window, oldest first. Write one summary of the whole window, "
        "keeping their citations."
        if of_parts
        else "Captions of single frames, oldest first, each with its id. Write a summary of what happened."
    )
    return f"{heading}\n{what}\n\n" + "\n".join(item.text for item in items)


def heading(cameras: Sequence[str], start: datetime, end: datetime, zone: ZoneInfo) -> str:
    return (
        f"Cameras: {', '.join(cameras)}. Window: {start.astimezone(zone):%Y-%m-%d %H:%M} to "
        f"{end.astimezone(zone):%Y-%m-%d %H:%M} ({zone.key})."
    )


def citations(text: str, allowed: set[int]) -> list[int]:
    """The caption ids `text` cites that are in `allowed`, in order of first mention: a model may invent ids (or
    cite ones outside the window), and those are dropped."""
    seen: dict[int, None] = {}
    for match in CITATION.finditer(text):
        value = int(match.group(1))
        if value in allowed:
            seen.setdefault(value, None)
    return list(seen)
