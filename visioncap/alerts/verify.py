"""Watch rules: ask the VLM whether a candidate caption's frames show what the rule's question describes, with
guided decoding of the answer `{"match": bool, "reason": str}`."""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Connection, select

from visioncap.caption.client import DEADLINE_HEADER, camera_headers
from visioncap.config.alerts import AlertRule
from visioncap.config.verify import MAX_REASON_CHARS, VerifySpec, VlmEndpoint
from visioncap.store.records import CaptionRecord

MAX_FRAME_BYTES = 8_000_000  # a stored frame larger than this is not sent (not one a pipeline writes)
# The gateway may hold a question in its alert line until this share of its deadline (at most WAIT_MARGIN_MAX_S)
# is left: one started later could hardly be answered in time, and its refusal (408, it was never sent to the VLM)
# then reaches us before our own timeout would.
WAIT_MARGIN = 0.25
WAIT_MARGIN_MAX_S = 1.0


def answer_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "match": {"type": "boolean"},
            # Bounded, so guided decoding ends even for a model that never wants to stop.
            "reason": {"type": "string", "maxLength": MAX_REASON_CHARS},
        },
        "required": ["match", "reason"],
        "additionalProperties": False,
    }


def prompt(question: str, caption: str) -> str:
    return (
        "You verify a camera alert. Look at the frame(s) and answer whether this holds: "
        f"{question}\nA caption written earlier says: {caption}\n"
        'Answer in JSON: {"match": true or false, "reason": "a short reason"}.'
    )


def question_body(
    question: str, caption: str, image_urls: Sequence[str], max_tokens: int, forced: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The chat request of one question (no model yet): the frames, then the prompt; the answer guided to the
    schema, or with `forced` to that one answer (a choice list of one)."""
    content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in image_urls]
    content.append({"type": "text", "text": prompt(question, caption)})
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if forced is not None:
        body["structured_outputs"] = {"choice": [json.dumps(forced, separators=(",", ":"))]}
    else:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": answer_schema(), "strict": True},
        }
    return body


@dataclass(frozen=True, slots=True)
class Verdict:
    """The VLM's answer (match None: none came, `error` says why)."""

    match: bool | None
    reason: str | None
    latency_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    error: str | None


def needs_embeddings(rules: Sequence[AlertRule]) -> bool:
    return any(rule.verify is not None and rule.verify.min_similarity is not None for rule in rules)


def event_frames(
    conn: Connection, data_dir: Path | None, caption_id: int, image_path: str | None, limit: int
) -> list[bytes]:
    """The caption's own stored JPEG, then the newest other stored frames of its event (same camera and event
    key), at most `limit`; only files inside the data directory."""
    if data_dir is None:
        return []
    paths: list[str] = [image_path] if image_path else []
    if limit > len(paths):
        row = conn.execute(
            select(CaptionRecord.camera, CaptionRecord.event_key).where(CaptionRecord.id == caption_id)
        ).first()
        if row is not None and row.event_key:
            others = conn.execute(
                select(CaptionRecord.image_path)
                .where(
                    CaptionRecord.camera == row.camera,
                    CaptionRecord.event_key == row.event_key,
                    CaptionRecord.id != caption_id,
                    CaptionRecord.image_path.is_not(None),
                )
                .order_by(CaptionRecord.captured_at.desc())
                .limit(limit - len(paths))
            )
            paths += [path for (path,) in others if path]
    root = data_dir.resolve()
    frames: list[bytes] = []
    for name in paths[:limit]:
        path = (root / name).resolve()
        # A row written by something else must not make this process send a file outside the data directory.
        if not path.is_relative_to(root) or path.suffix.lower() not in (".jpg", ".jpeg"):
            continue
        try:
            if path.stat().st_size <= MAX_FRAME_BYTES:
                frames.append(path.read_bytes())
        except OSError:
            continue  # gone (retention): the question goes with the frames that remain
    return frames


class Verifier:
    """Asks the OpenAI-compatible endpoint, one question at a time (the engine's thread waits for each)."""

    def __init__(self, endpoint: VlmEndpoint, default_base_url: str, default_api_key: str) -> None:
        self._endpoint = endpoint
        self._base_url = (endpoint.base_url or default_base_url).rstrip("/")
        key = os.environ.get(endpoint.api_key_env, "") if endpoint.api_key_env else default_api_key
        self._headers = {"Authorization": f"Bearer {key or 'EMPTY'}"}
        self._model = endpoint.model
        self._client = httpx.Client()
        self.requests = 0  # questions sent (tests count them: non-candidates are never asked)

    def close(self) -> None:
        self._client.close()

    def _model_name(self, timeout_s: float) -> str:
        if self._model is None:
            response = self._client.get(f"{self._base_url}/models", headers=self._headers, timeout=timeout_s)
            response.raise_for_status()
            self._model = str(response.json()["data"][0]["id"])
        return self._model

    def ask(self, spec: VerifySpec, caption: str, frames: Sequence[bytes], camera: str | None = None) -> Verdict:
        """The answer within the rule's deadline; `camera` goes along as a header (the gateway takes turns between
        cameras in the alert line too)."""
        started = time.monotonic()

        def left() -> float:
            return spec.deadline_s - (time.monotonic() - started)

        urls = ["data:image/jpeg;base64," + base64.b64encode(frame).decode() for frame in frames]
        forced = spec.force_answer.model_dump() if spec.force_answer is not None else None
        body = question_body(spec.question, caption, urls, self._endpoint.max_tokens, forced)
        self.requests += 1
        try:
            body["model"] = self._model_name(max(left(), 0.001))
            wait_s = wait_allowed_s(spec.deadline_s) - (spec.deadline_s - left())
            headers = {**self._headers, DEADLINE_HEADER: str(int(max(0.0, wait_s) * 1000)), **camera_headers(camera)}
            response = self._client.post(
                f"{self._base_url}/chat/completions",
                json=body,
                headers=headers,
                timeout=max(left(), 0.001),
            )
        except httpx.TimeoutException:
            return _failed(f"deadline: no answer within {spec.deadline_s:g} s", (time.monotonic() - started) * 1000)
        except httpx.HTTPError as exc:
            return _failed(f"the VLM is unreachable: {type(exc).__name__}: {exc}", None)
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            # The model list not as vLLM answers it, or a value httpx cannot send: the question was never asked.
            return _failed(f"the question could not be sent: {type(exc).__name__}: {exc}", None)
        latency_ms = (time.monotonic() - started) * 1000
        if response.status_code != 200:
            return _failed(f"the VLM answered HTTP {response.status_code}: {response.text[:300]}", latency_ms)
        # Only the answer's parsing is the schema's business: an error building the request is not hidden as one.
        try:
            data = response.json()
            usage = data.get("usage") or {}
            text = data["choices"][0]["message"]["content"] or ""
            answer = json.loads(text)
            match, why = answer.get("match"), answer.get("reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            return _failed(f"an answer that is not the schema's: {exc}", latency_ms)
        if not isinstance(match, bool):
            return _failed(f"no boolean `match` in the answer: {text[:300]!r}", latency_ms)
        return Verdict(
            match,
            str(why)[:MAX_REASON_CHARS] if why is not None else None,
            latency_ms,
            usage.get("prompt_tokens") if isinstance(usage, dict) else None,
            usage.get("completion_tokens") if isinstance(usage, dict) else None,
            None,
        )


def wait_allowed_s(deadline_s: float) -> float:
    """How long the gateway may keep a question of this deadline waiting (its X-Visioncap-Deadline-Ms)."""
    return max(0.0, deadline_s - min(WAIT_MARGIN * deadline_s, WAIT_MARGIN_MAX_S))


def _failed(error: str, latency_ms: float | None) -> Verdict:
    return Verdict(None, None, latency_ms, None, None, error)
