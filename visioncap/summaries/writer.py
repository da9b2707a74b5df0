"""Writes the summary of a window: the VLM reads the captions (text only), in parts when they do not fit its
context, then the parts' summaries, until one summary of the whole window remains.

Requests go to the VLM endpoint with the background key: behind the gateway they are background work, paced
beside interactive chat like captions. Citations are the caption ids the model cited at any level, kept only
when they are in the window.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

import httpx

from visioncap.caption.client import camera_headers
from visioncap.config.summaries import SummariesConfig
from visioncap.errors import VisioncapError
from visioncap.summaries import chunking
from visioncap.summaries.chunking import Item
from visioncap.summaries.store import Summary, WindowCaption


class SummaryError(VisioncapError):
    """The summary could not be written (the VLM failed, or the window is too large)."""


class ContextExceeded(SummaryError):
    """The server counted more prompt tokens than its context holds: the estimate was short for its tokenizer."""


class WindowTooLarge(SummaryError):
    """The window holds more captions than a summary reads, or needs more levels than allowed."""


@dataclass(frozen=True, slots=True)
class Written:
    text: str
    completion_tokens: int
    prompt_tokens: int


class SummaryWriter:
    """One writer per endpoint; `write` is safe to call from several threads (httpx's client is)."""

    def __init__(self, config: SummariesConfig, base_url: str, api_key: str, model: str) -> None:
        self.config = config
        self.model = model
        self._url = base_url.rstrip("/") + "/chat/completions"
        # An empty key (VISIONCAP_VLM_API_KEY= in .env) is no header value at all: sent as vLLM's any-key, as the
        # caption client and the watch rules' verifier send it.
        self._client = httpx.Client(
            timeout=config.timeout_s,
            headers={"Authorization": f"Bearer {api_key or 'EMPTY'}"},
            follow_redirects=False,
        )

    def close(self) -> None:
        self._client.close()

    def _ask(self, prompt: str, camera: str | None) -> Written:
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": chunking.SYSTEM_PROMPT},
                {"role": "user", "content": prompt},
            ],
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
        }
        # The gateway takes turns between cameras by this header (and checks a camera-bound key against it).
        headers = camera_headers(camera) or None
        try:
            response = self._client.post(self._url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise SummaryError(f"VLM request failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code == 400 and "context length" in response.text:
            raise ContextExceeded(f"VLM refused a part as too long: {response.text[:300]}")
        if not response.is_success:
            raise SummaryError(f"VLM answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            answer = response.json()
            text = answer["choices"][0]["message"]["content"] or ""
            usage = answer.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SummaryError(f"VLM answer is not a chat completion: {exc}") from exc
        return Written(str(text), int(usage.get("completion_tokens") or 0), int(usage.get("prompt_tokens") or 0))

    def write(
        self,
        kind: str,
        cameras: Sequence[str],
        start: datetime,
        end: datetime,
        captions: Sequence[WindowCaption],
        stop: threading.Event | None = None,
    ) -> Summary:
        """`stop`, once set, ends a hierarchical write before its next request (a SummaryError): a service that stops
        waits for one request at most, not for every part of a busy day."""
        config = self.config
        if len(captions) > config.max_captions:
            raise WindowTooLarge(f"the window holds more than {config.max_captions} captions; ask for a shorter one")
        zone = ZoneInfo(config.time_zone)
        # A caption alone must fit a request, whatever `max_caption_chars` says.
        max_chars = min(config.max_caption_chars, int(config.input_tokens * config.chars_per_token) - 64)
        items = [
            chunking.caption_item(c.id, c.camera, c.captured_at, c.text, zone, max_chars, config.chars_per_token)
            for c in captions
        ]
        allowed = {c.id for c in captions}
        head = chunking.heading(cameras, start, end, zone)
        camera = cameras[0] if len(cameras) == 1 else None
        cited: dict[int, None] = {}
        requests = 0
        depth = 0
        max_prompt = 0
        if not items:
            return Summary(
                kind, tuple(cameras), start, end, "No captions were stored in this window.", (), 0, 0, 0, 0, self.model
            )
        of_parts = False
        cpt = config.chars_per_token
        while True:
            depth += 1
            if depth > config.max_depth:
                raise WindowTooLarge(f"the window needs more than {config.max_depth} levels of summaries")
            # The instructions and heading are estimated like the lines; `prompt_overhead_tokens` is the margin for
            # the chat template and the estimate's error.
            fixed = chunking.estimate_tokens(chunking.SYSTEM_PROMPT + chunking.user_prompt(head, [], of_parts), cpt)
            parts = chunking.cut(items, config.input_tokens - fixed)
            written: list[tuple[list[Item], Written]] = []
            pending = list(reversed(parts))
            while pending:
                part = pending.pop()
                if stop is not None and stop.is_set():
                    raise SummaryError("stopped before the summary was finished")
                requests += 1  # every request sent, refused ones too: what the gateway counted
                try:
                    answer = self._ask(chunking.user_prompt(head, part, of_parts), camera)
                except ContextExceeded:
                    if len(part) == 1:
                        raise
                    # The tokenizer is denser than estimated: halve the part and go on, in order.
                    middle = len(part) // 2
                    pending.extend([part[middle:], part[:middle]])
                    continue
                max_prompt = max(max_prompt, answer.prompt_tokens)
                for found in chunking.citations(answer.text, allowed):
                    cited.setdefault(found, None)
                written.append((part, answer))
            parts = [part for part, _ in written]
            if len(parts) == 1:
                text = written[0][1].text.strip()
                break
            items = [
                chunking.part_item(
                    index,
                    answer.text,
                    answer.completion_tokens,
                    tuple(i for item in part for i in item.ids),
                    part[0].start,
                    part[-1].end,
                    zone,
                    config.chars_per_token,
                )
                for index, (part, answer) in enumerate(written)
            ]
            of_parts = True
        return Summary(
            kind=kind,
            cameras=tuple(cameras),
            window_start=start,
            window_end=end,
            text=text,
            citations=tuple(cited),
            caption_count=len(captions),
            depth=depth,
            requests=requests,
            max_prompt_tokens=max_prompt,
            model=self.model,
        )
