"""The messages sent to the VLM for a question: a system prompt with the best captions, then the conversation.

Bounded by the model's context: the budget is the context length less the answer's `max_tokens` and what
the chat template adds. Tokens are estimated without the model's tokenizer as UTF-8 bytes / 2, an over-estimate
for the English text of captions and questions (BPE tokenizers average 3-4 characters a token there), so the
prompt stays inside the budget as the VLM counts it. What fits goes in this order: the system prompt and the
last user message (which must fit), the captions best first, the frames of the best of those captions (images
shrunk to their share of an image-token budget, counted as the model counts them: `visioncap/caption/encode.py`),
then the earlier turns newest first. The frames go in the last user message, each after a line naming its
caption, and the question after them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from zoneinfo import ZoneInfo

from visioncap.caption.encode import jpeg_data_uri
from visioncap.store.search import CaptionRow

# What the chat template adds: a start and an end, and role markers and separators around each message.
TEMPLATE_TOKENS = 32
MESSAGE_TOKENS = 8
# Around each image: the vision start and end markers, and the separators of a message part.
IMAGE_PART_TOKENS = 4

SYSTEM_PROMPT = (
    "You answer questions about what security cameras saw. Use only the camera captions listed below; each "
    "starts with its id in square brackets, then the camera and the local time ({zone}). Cite the captions you "
    "use by their ids, like [12]. If the captions do not answer the question, say so.\n\nCaptions:\n{captions}"
)


class QuestionTooLong(ValueError):
    """The last message alone does not fit the model's context with the answer's tokens."""


@dataclass(frozen=True, slots=True)
class Frame:
    """A caption's frame as the VLM is to see it: a JPEG already shrunk to its image tokens."""

    caption_id: int
    jpeg: bytes
    image_tokens: int


@dataclass(frozen=True, slots=True)
class Prompt:
    messages: list[dict[str, Any]]
    caption_ids: list[int]  # the captions the prompt holds, best first: the citations
    estimated_tokens: int
    frame_ids: list[int] = field(default_factory=list)  # the captions whose frames it holds, best first


def frame_label(caption_id: int) -> str:
    return f"The frame of caption [{caption_id}]:"


def estimate_tokens(text: str) -> int:
    return len(text.encode()) // 2 + 1


def caption_line(row: CaptionRow, zone: ZoneInfo) -> str:
    at = row.captured_at if row.captured_at.tzinfo else row.captured_at.replace(tzinfo=ZoneInfo("UTC"))
    local = at.astimezone(zone).strftime("%Y-%m-%d %H:%M")
    text = " ".join((row.caption or "").split())
    return f"[{row.id}] {row.camera}, {local}: {text}"


def build_prompt(
    conversation: list[dict[str, str]],
    rows: list[CaptionRow],
    zone: ZoneInfo,
    budget_tokens: int,
    frames: Sequence[Frame] = (),
) -> Prompt:
    """The messages for the VLM within `budget_tokens` (the context less the answer's tokens); of `frames`,
    those of captions the prompt holds, while they fit."""
    budget = budget_tokens - TEMPLATE_TOKENS
    last = conversation[-1]
    system_text = SYSTEM_PROMPT.format(zone=zone.key, captions="")
    spent = estimate_tokens(system_text) + estimate_tokens(last["content"]) + 2 * MESSAGE_TOKENS
    if spent > budget:
        raise QuestionTooLong(
            f"the question takes about {spent} tokens, more than the {budget} the model's context leaves"
        )
    lines: list[str] = []
    ids: list[int] = []
    for row in rows:
        line = caption_line(row, zone)
        cost = estimate_tokens(line + "\n")
        if spent + cost > budget:
            break
        spent += cost
        lines.append(line)
        ids.append(row.id)
    shown: list[Frame] = []
    for frame in frames:
        cost = frame.image_tokens + IMAGE_PART_TOKENS + estimate_tokens(frame_label(frame.caption_id))
        if frame.caption_id not in ids or spent + cost > budget:
            continue
        spent += cost
        shown.append(frame)
    earlier: list[dict[str, str]] = []
    for message in reversed(conversation[:-1]):
        cost = estimate_tokens(message["content"]) + MESSAGE_TOKENS
        if spent + cost > budget:
            break
        spent += cost
        earlier.insert(0, message)
    system = {"role": "system", "content": SYSTEM_PROMPT.format(zone=zone.key, captions="\n".join(lines))}
    question: dict[str, Any] = last
    if shown:
        parts: list[dict[str, Any]] = []
        for frame in shown:
            parts += [
                {"type": "text", "text": frame_label(frame.caption_id)},
                {"type": "image_url", "image_url": {"url": jpeg_data_uri(frame.jpeg)}},
            ]
        question = {"role": last["role"], "content": [*parts, {"type": "text", "text": last["content"]}]}
    return Prompt([system, *earlier, question], ids, spent, [frame.caption_id for frame in shown])
