"""Captions frames through an OpenAI-compatible chat-completions endpoint (vLLM or the gateway).

Requests go through `ultralytics.LLM` with api="chat.completions", Ultralytics' own client for text + image
prompts, which passes request arguments (extra_body, timeout, response_format) straight to the `openai` SDK
and returns its native response, usage included. Two things it does not do: it builds its `openai.OpenAI`
client with the SDK defaults (2 silent retries, 10-minute timeout), so a client configured with our timeout
and no SDK retries is handed to it, and retries are the outbox's (durable, counted, with backoff); and it
re-encodes arrays at a fixed JPEG quality with no size bound, so frames arrive as data URIs already fitted to
the image-token budget.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from typing import Any, cast

import httpx
import openai
from pydantic import ValidationError

from visioncap.caption.encode import jpeg_data_uri
from visioncap.caption.structured import StructuredCaption, response_format
from visioncap.config.caption import DEFAULT_EVENT_PROMPT, CaptionConfig
from visioncap.config.sources import CAMERA_ID_PATTERN
from visioncap.config.vlm import VlmConfig
from visioncap.errors import ConfigError, VlmUnavailableError
from visioncap.frames import Caption
from visioncap.store.records import SkipReason

log = logging.getLogger(__name__)

# Errors worth another try: the server may be starting, overloaded, restarting or gone for a while.
TRANSIENT_ERRORS = (
    openai.APIConnectionError,  # includes APITimeoutError
    openai.InternalServerError,
    openai.RateLimitError,
)


CAMERA_HEADER = "X-Visioncap-Camera"
# How long a request may wait in the gateway before it is refused (408), in milliseconds.
DEADLINE_HEADER = "X-Visioncap-Deadline-Ms"
_CAMERA_ID = re.compile(CAMERA_ID_PATTERN)
# What an event description asks of the frames of one person event.
EVENT_PROMPT = DEFAULT_EVENT_PROMPT


def camera_headers(camera: str | None) -> dict[str, str]:
    """The camera header for a camera id the config could have named, else none: a stored row's camera from
    elsewhere (non-ASCII, a path) cannot be a header value, and the gateway then takes turns by the key's camera
    instead of refusing the request for a name that was never one of its cameras."""
    return {CAMERA_HEADER: camera} if camera and _CAMERA_ID.fullmatch(camera) else {}


class CaptionError(Exception):
    """A caption request failed for good (the server refused it, or its answer is unusable)."""


class TransientCaptionError(CaptionError):
    """A caption request failed in a way that another attempt later may not (timeout, connection, 5xx, 429)."""


# What an endpoint answers a key it does not know (401), a key that may not do this (403: the gateway's key for
# other cameras) or a model it does not serve (404, vLLM): a configuration that is being changed (a key rotated),
# not a frame at fault. The frame waits; another attempt after the fix succeeds.
ACCESS_STATUSES = frozenset({401, 403, 404})


class AccessRefusedError(CaptionError):
    """The endpoint refused our key, or does not serve the model, for this camera (HTTP 401, 403 or 404): the
    camera's captioning pauses, its frames stay pending, and attempts go on with backoff until it is let in."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"VLM endpoint refused access (HTTP {status}): {detail}")
        self.status = status


class SkippedCaptionError(CaptionError):
    """The endpoint declined the frame on purpose (the gateway's deadline for background work passed)."""

    def __init__(self, reason: SkipReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def check_vlm_ready(base_url: str, model: str, api_key: str, timeout_s: float = 5.0) -> None:
    """Fail fast, with a clear message, when the endpoint is down or does not serve the model. A function of its
    own so that a pipeline checks before it builds the captioner, whose client imports PyTorch (seconds)."""
    base_url = base_url.rstrip("/")
    url = f"{base_url}/models"
    try:
        response = httpx.get(url, timeout=timeout_s, headers={"Authorization": f"Bearer {api_key}"})
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise VlmUnavailableError(
            f"VLM endpoint {base_url} is unreachable ({type(exc).__name__}: {exc}); start it "
            "(e.g. `visioncap serve --profile tiny`) or set vlm.base_url / VISIONCAP_VLM_BASE_URL"
        ) from exc
    served = [entry.get("id") for entry in response.json().get("data", [])]
    if model not in served:
        raise ConfigError(f"vlm.model: {model!r} is not served by {base_url} (it serves {served})")


class VlmCaptioner:
    """Sends one frame per request and returns the caption; safe to call from several threads.

    One call is one attempt: the outbox decides when to try again, so that retries survive restarts.
    """

    def __init__(self, vlm: VlmConfig, caption: CaptionConfig, base_url: str, api_key: str) -> None:
        from ultralytics.models import LLM

        self._vlm = vlm
        self._caption = caption
        self.base_url = base_url.rstrip("/")
        self._llm = LLM(vlm.model, api="chat.completions", base_url=self.base_url, api_key=api_key)
        # Our own client (its timeout, no retries: the outbox retries); LLM's attribute is typed as None.
        client = openai.OpenAI(base_url=self.base_url, api_key=api_key, timeout=vlm.timeout_s, max_retries=0)
        cast(Any, self._llm).client = client
        self._api_key = api_key
        self._request_extras: dict[str, Any] = {}
        if caption.structured:
            self._request_extras["response_format"] = response_format()

    def check_ready(self, timeout_s: float = 5.0) -> None:
        """Fail fast, with a clear message, when the endpoint is down or does not serve the model."""
        check_vlm_ready(self.base_url, self._vlm.model, self._api_key, timeout_s)

    def caption(self, jpeg: bytes, camera: str | None = None) -> Caption:
        """Caption one JPEG in one attempt; raises TransientCaptionError or CaptionError.

        `camera` goes along as a header: the visioncap gateway takes turns between cameras with it.
        """
        started = time.perf_counter()
        response = self._send(
            self._caption.prompt, jpeg_data_uri(jpeg), camera, self._caption.max_tokens, self._request_extras
        )
        latency = time.perf_counter() - started
        text = (response.choices[0].message.content or "").strip()
        structured = None
        if self._caption.structured:
            try:
                # strict=False admits raw control characters inside strings, which guided decoding lets through.
                parsed = StructuredCaption.model_validate(json.loads(text, strict=False))
            except json.JSONDecodeError as exc:
                raise CaptionError(f"structured caption does not match the schema: invalid JSON: {exc}") from exc
            except ValidationError as exc:
                raise CaptionError(f"structured caption does not match the schema: {exc.errors()[0]['msg']}") from exc
            structured = parsed.model_dump()
            text = parsed.summary
        return _caption_of(response, text, latency, structured)

    def describe(
        self,
        jpegs: Sequence[bytes],
        camera: str | None = None,
        prompt: str | None = None,
        max_tokens: int | None = None,
    ) -> Caption:
        """What a person did, from several frames of one event (oldest first) sent as images of one request, in
        one attempt; raises as `caption`. The endpoint must take that many images a prompt (vLLM's
        --limit-mm-per-prompt; the profiles' `limit_mm_per_prompt`); the frames' image tokens are the caller's
        to bound (`encode_frames`)."""
        if not jpegs:
            raise ValueError("an event description needs at least one frame")
        events = self._caption.events
        started = time.perf_counter()
        content: list[dict[str, Any]] = [{"type": "text", "text": prompt or events.prompt}]
        content += [{"type": "image_url", "image_url": {"url": jpeg_data_uri(jpeg)}} for jpeg in jpegs]
        response = self._send([{"role": "user", "content": content}], None, camera, max_tokens or events.max_tokens, {})
        text = (response.choices[0].message.content or "").strip()
        return _caption_of(response, text, time.perf_counter() - started, None)

    def _send(self, source: Any, image: str | None, camera: str | None, max_tokens: int, extras: dict[str, Any]) -> Any:
        """One chat completion through Ultralytics' client (a prompt and an image, or whole messages), its
        failures sorted into the caption errors the outbox acts on."""
        try:
            return self._llm(
                source,
                image=image,
                max_tokens=max_tokens,
                temperature=self._caption.temperature,
                extra_body=self._vlm.extra_body or None,
                extra_headers=camera_headers(camera) or None,
                **extras,
            )
        except TRANSIENT_ERRORS as exc:
            raise TransientCaptionError(f"{type(exc).__name__}: {exc}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code == 408:
                # The gateway gives up on background work that waited past its deadline: a fresher frame of
                # the event is worth more than this one, so it is recorded as skipped, not retried.
                raise SkippedCaptionError(SkipReason.DEADLINE, exc.message) from exc
            if exc.status_code in ACCESS_STATUSES:
                raise AccessRefusedError(exc.status_code, exc.message) from exc
            raise CaptionError(f"VLM refused the request (HTTP {exc.status_code}): {exc.message}") from exc


def _caption_of(response: Any, text: str, latency: float, structured: dict[str, Any] | None) -> Caption:
    usage = response.usage
    return Caption(
        text=text,
        model=response.model,
        prompt_tokens=usage.prompt_tokens if usage else 0,
        completion_tokens=usage.completion_tokens if usage else 0,
        latency_s=latency,
        structured=structured,
    )
