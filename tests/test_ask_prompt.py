"""Ask's prompt (visioncap/ask/prompt.py) with frames: which go, where, and what they cost in the context."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import cast
from zoneinfo import ZoneInfo

from visioncap.ask.prompt import (
    IMAGE_PART_TOKENS,
    TEMPLATE_TOKENS,
    Frame,
    build_prompt,
    caption_line,
    estimate_tokens,
    frame_label,
)
from visioncap.store.search import CaptionRow

ZONE = ZoneInfo("UTC")
QUESTION = [{"role": "user", "content": "Who came to the door?"}]


def row(row_id: int, text: str) -> CaptionRow:
    at = datetime(2026, 12, 2, 9, row_id, tzinfo=UTC)
    return cast(CaptionRow, SimpleNamespace(id=row_id, camera="front-door", captured_at=at, caption=text))


ROWS = [row(7, "a courier with a parcel"), row(3, "a van parks"), row(5, "a man rings the bell")]


def frame_cost(frame: Frame) -> int:
    return frame.image_tokens + IMAGE_PART_TOKENS + estimate_tokens(frame_label(frame.caption_id))


def test_frames_go_in_the_question_best_first_each_after_a_line_naming_its_caption() -> None:
    frames = [Frame(7, b"first-jpeg", 16), Frame(3, b"second-jpeg", 16)]
    prompt = build_prompt(QUESTION, ROWS, ZONE, 4096, frames)
    assert prompt.caption_ids == [7, 3, 5] and prompt.frame_ids == [7, 3]
    system, question = prompt.messages
    assert system["role"] == "system" and isinstance(system["content"], str)
    assert question["role"] == "user"
    parts = question["content"]
    assert [part["type"] for part in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[0]["text"] == "The frame of caption [7]:"
    assert parts[1]["image_url"]["url"] == "data:image/jpeg;base64," + base64.b64encode(b"first-jpeg").decode()
    assert parts[2]["text"] == "The frame of caption [3]:"
    assert parts[4] == {"type": "text", "text": "Who came to the door?"}  # the question last, after what it asks
    text_only = build_prompt(QUESTION, ROWS, ZONE, 4096)
    assert text_only.messages[-1] == QUESTION[0] and text_only.frame_ids == []
    assert prompt.estimated_tokens == text_only.estimated_tokens + sum(frame_cost(frame) for frame in frames)


def test_frames_fit_the_context_after_the_captions_and_only_cited_captions_frames_go() -> None:
    text_only = build_prompt(QUESTION, ROWS, ZONE, 4096)
    room = text_only.estimated_tokens + TEMPLATE_TOKENS  # the budget at which all three captions just fit
    big, small = Frame(7, b"big", 300), Frame(3, b"small", 20)
    # Room for the small frame only: the big one is left out, the captions all stay.
    prompt = build_prompt(QUESTION, ROWS, ZONE, room + frame_cost(small), [big, small])
    assert prompt.caption_ids == [7, 3, 5] and prompt.frame_ids == [3]
    assert prompt.estimated_tokens <= room + frame_cost(small) - TEMPLATE_TOKENS
    # A context one token short of the second caption: the second's frame would fit, but is not sent without it.
    one = build_prompt(QUESTION, ROWS[:1], ZONE, 4096).estimated_tokens + TEMPLATE_TOKENS
    second_line = estimate_tokens(caption_line(ROWS[1], ZONE) + "\n")
    tiny = Frame(3, b"tiny", 1)
    assert frame_cost(tiny) < second_line
    cut = build_prompt(QUESTION, ROWS, ZONE, one + second_line - 1, [tiny])
    assert cut.caption_ids == [7] and cut.frame_ids == []
    assert build_prompt(QUESTION, ROWS, ZONE, one + second_line - 1, [Frame(7, b"tiny", 1)]).frame_ids == [7]


def test_frames_go_before_earlier_turns() -> None:
    conversation = [
        {"role": "user", "content": "hello " * 40},
        {"role": "assistant", "content": "Ask me about the cameras."},
        *QUESTION,
    ]
    frame = Frame(7, b"jpeg", 40)
    everything = build_prompt(conversation, ROWS, ZONE, 4096, [frame])
    assert len(everything.messages) == 4 and everything.frame_ids == [7]
    # Room for the frame or the earlier turns, not both: the frame wins, then the newest turn that still fits.
    tight = everything.estimated_tokens + TEMPLATE_TOKENS - estimate_tokens(conversation[0]["content"])
    prompt = build_prompt(conversation, ROWS, ZONE, tight, [frame])
    assert prompt.frame_ids == [7]
    assert [message["role"] for message in prompt.messages] == ["system", "assistant", "user"]
