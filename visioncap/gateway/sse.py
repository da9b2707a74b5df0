"""Watches a server-sent-event stream as it passes through: when tokens arrive, whether it ended in an error.

The bytes themselves are forwarded untouched by the proxy; this only looks at complete events (`data: ...`
blocks ended by a blank line) to time the chunks that carry output (text, reasoning or tool calls).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

# A chat delta's content/reasoning or a completion's text with at least one character, or tool calls.
OUTPUT_FIELD = re.compile(rb'"(?:content|reasoning_content|reasoning|text)": ?"[^"]|"tool_calls": ?\[\s*\{')


class StreamObserver:
    """Feed it the stream's bytes; it calls `on_first(seconds)` once and `on_gap(seconds)` per later chunk."""

    def __init__(
        self,
        started_at: float,
        clock: Callable[[], float],
        on_first: Callable[[float, float], None],
        on_gap: Callable[[float, float], None],
    ) -> None:
        self._started_at = started_at
        self._clock = clock
        self._on_first = on_first
        self._on_gap = on_gap
        self._buffer = b""
        self._last: float | None = None
        self.chunks = 0
        self.error: str | None = None

    def feed(self, data: bytes) -> None:
        self._buffer += data
        if b"\n\n" not in self._buffer and b"\r\n\r\n" not in self._buffer:
            return
        normalized = self._buffer.replace(b"\r\n", b"\n")
        *events, self._buffer = normalized.split(b"\n\n")
        now = self._clock()
        for event in events:
            self._event(event, now)

    def _event(self, block: bytes, now: float) -> None:
        payload = b"\n".join(
            line[5:].lstrip(b" ") for line in block.split(b"\n") if line.startswith(b"data:")
        )  # comments (": keep-alive") and other fields carry no output
        if not payload or payload == b"[DONE]":
            return
        if payload.startswith(b'{"error"'):
            self._error(payload)
            return
        # A byte test instead of a JSON parse per chunk: vLLM writes compact JSON, and an output field holds a
        # non-empty string (or a tool-call list) exactly when the chunk carries output.
        if OUTPUT_FIELD.search(payload) is None:
            return
        self.chunks += 1
        if self._last is None:
            self._on_first(now, now - self._started_at)
        else:
            self._on_gap(now, now - self._last)
        self._last = now

    def _error(self, payload: bytes) -> None:
        try:
            error = json.loads(payload).get("error")
        except (ValueError, AttributeError):
            error = None
        self.error = str(error.get("message") if isinstance(error, dict) else error)
