"""Ask's request flow: check the request, read the question, retrieve captions, build the prompt, ask the VLM.

The VLM is reached at VISIONCAP_VLM_BASE_URL with VISIONCAP_ASK_VLM_API_KEY (behind the gateway: an interactive
key), for the model `ask_model.AskModel` names. Its answer is passed on as our own chat completion (or chunks):
same text and finish reasons, our id and the request's model name, and the `visioncap` field (retrieved ids and
citations), in a stream on the first chunk, so a page can show the cited thumbnails while the answer streams.
With no caption retrieved the VLM is not asked: the answer says that nothing matched, with empty citations. A
chat UI's own task prompt (a title, tags, follow-ups: `visioncap/ask/task.py`) goes to the VLM as plain chat.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import anyio
import cv2
import httpx
import numpy as np
from sqlalchemy import Engine

from visioncap.api.ask_model import AskModel
from visioncap.api.auth import EVERY_CAMERA, CameraScope
from visioncap.api.errors import RETRY_AFTER_S, ApiError, bad_param
from visioncap.api.images import stored_jpeg
from visioncap.api.protocol import AskContext, ChatCompletion, ChatRequest, Citation
from visioncap.ask.prompt import Frame, Prompt, QuestionTooLong, build_prompt
from visioncap.ask.question import Question, read_question
from visioncap.ask.retrieve import Retrieved, retrieve
from visioncap.ask.task import TaskTooLong, is_task, task_prompt
from visioncap.caption.encode import encode_frames
from visioncap.config.api import ApiSettings
from visioncap.store.camera_configs import list_cameras
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.search import CaptionRow, SearchLimits, SearchTimeout, camera_summaries
from visioncap.store.semantic import Meaning

log = logging.getLogger(__name__)

NO_MATCH = "No stored captions match this question{scope}, so there is nothing to answer from."


@dataclass(frozen=True, slots=True)
class Plan:
    """What to send the VLM for one request, and what the answer reports."""

    request: ChatRequest
    context: AskContext
    prompt: Prompt | None  # None: nothing matched, the VLM is not asked
    max_tokens: int
    id: str
    created: int


def _conversation(request: ChatRequest, settings: ApiSettings) -> tuple[list[dict[str, str]], bool]:
    """The `user` and `assistant` turns (`system` messages are dropped unread: the API writes its own), and
    whether the last is a chat UI's task prompt rather than a question."""
    if len(request.messages) > settings.ask_max_messages:
        raise bad_param("messages", f"at most {settings.ask_max_messages} messages")
    kept = [(index, message) for index, message in enumerate(request.messages) if message.role != "system"]
    task = bool(kept) and kept[-1][1].role == "user" and is_task(kept[-1][1].text())
    turns: list[dict[str, str]] = []
    for index, message in kept:
        text = message.text()
        if task and index == kept[-1][0]:
            limit, what = settings.ask_max_task_chars, " (a chat UI's task prompt, `### Task:`)"
        else:
            limit, what = settings.ask_max_message_chars, ""
        if len(text) > limit:
            raise bad_param(f"messages.{index}.content", f"at most {limit} characters{what}")
        if "\x00" in text:
            raise bad_param(f"messages.{index}.content", "must not contain NUL characters")
        turns.append({"role": message.role, "content": text})
    if not turns or turns[-1]["role"] != "user" or not turns[-1]["content"].strip():
        raise bad_param("messages", "the last message must be a non-empty `user` message: the question")
    return turns, task


def _max_tokens(request: ChatRequest, settings: ApiSettings, task: bool = False) -> int:
    asked = request.max_completion_tokens or request.max_tokens
    if asked is not None and asked > settings.ask_max_tokens:
        if task:  # a UI's title or tags need far fewer than it asks for (Open WebUI: 1000)
            return settings.ask_max_tokens
        raise bad_param("max_tokens", f"at most {settings.ask_max_tokens}")
    return asked or settings.ask_max_tokens


def _citation(row: CaptionRow) -> Citation:
    captured_at: datetime = row.captured_at
    return Citation(
        caption_id=row.id,
        camera=row.camera,
        # SQLite hands back naive UTC.
        captured_at=captured_at if captured_at.tzinfo else captured_at.replace(tzinfo=UTC),
        caption=row.caption or "",
        image_url=f"/v1/captions/{row.id}/image" if row.image_path else None,
    )


class Asker:
    """Ask for one app: the settings, database and embedder it shares with the other routes."""

    def __init__(self, settings: ApiSettings, engine: Engine, embedder: TextEmbedder | None) -> None:
        self.settings = settings
        self.engine = engine
        self.meaning = None if embedder is None else Meaning(embedder, settings.ask_min_similarity)
        self.zone = ZoneInfo(settings.ask_time_zone)
        self.limits = SearchLimits(settings.api_search_scan_rows, settings.api_search_timeout_s)
        self.model = AskModel(settings)

    def _known_cameras(self, scope: CameraScope) -> list[str]:
        """The camera ids a question may name: those `scope` sees (another's name stays a word of the question)."""
        names = {summary.camera for summary in camera_summaries(self.engine)}
        names |= {stored.camera for stored in list_cameras(self.engine)}
        return sorted(name for name in names if scope.sees(name))

    def plan(self, request: ChatRequest, scope: CameraScope = EVERY_CAMERA) -> Plan:
        """Everything up to the VLM call (blocking: run it in a thread); captions of the cameras `scope` sees."""
        conversation, task = _conversation(request, self.settings)
        max_tokens = _max_tokens(request, self.settings, task)
        if task:
            return self._task_plan(request, conversation[-1]["content"], max_tokens)
        question: Question = read_question(
            conversation[-1]["content"], self._known_cameras(scope), datetime.now(UTC), self.zone
        )
        # The question names only cameras the key sees; naming none, a limited key searches all of its own.
        searched = scope.narrow(question.cameras)
        try:
            found: Retrieved = (
                Retrieved([], "newest")
                if searched is None
                else retrieve(self.engine, question, self.settings.ask_top_k, self.limits, self.meaning, searched)
            )
        except SearchTimeout as exc:
            log.warning("ask: retrieval stopped at its time limit (%s): %s", exc, question)
            raise ApiError(
                503,
                f"finding the captions took longer than {self.limits.timeout_s:g} s; try again shortly, or name "
                "a camera or a time",
                headers={"Retry-After": RETRY_AFTER_S},
                error_type="search_timeout",
            ) from exc
        prompt: Prompt | None = None
        if found.rows:
            budget = self.settings.ask_context_tokens - max_tokens
            try:
                prompt = build_prompt(conversation, found.rows, self.zone, budget, self._frames(found.rows))
            except QuestionTooLong as exc:
                raise bad_param("messages", str(exc)) from exc
        cited = set(prompt.caption_ids) if prompt else set()
        context = AskContext(
            retrieved=[row.id for row in found.rows],
            citations=[_citation(row) for row in found.rows if row.id in cited],
            frames=prompt.frame_ids if prompt else [],
            cameras=list(question.cameras),
            since=question.since,
            until=question.until,
            search=found.method,
        )
        return Plan(request, context, prompt, max_tokens, f"chatcmpl-{secrets.token_hex(12)}", int(time.time()))

    def _task_plan(self, request: ChatRequest, text: str, max_tokens: int) -> Plan:
        """A chat UI's task prompt: to the VLM as it is (its quoted history shortened to fit), no captions."""
        try:
            prompt = task_prompt(text, self.settings.ask_context_tokens - max_tokens)
        except TaskTooLong as exc:
            raise bad_param("messages", str(exc)) from exc
        context = AskContext(retrieved=[], citations=[], cameras=[], since=None, until=None, search="task")
        return Plan(request, context, prompt, max_tokens, f"chatcmpl-{secrets.token_hex(12)}", int(time.time()))

    def _frames(self, rows: list[CaptionRow]) -> list[Frame]:
        """The stored frames of the best rows that have one (VISIONCAP_ASK_FRAMES of them), sharing
        VISIONCAP_ASK_IMAGE_TOKENS among the frames found (`encode_frames`). A frame that is gone or unreadable is
        left out, not an error: the captions still answer, and the others get its share."""
        wanted = self.settings.ask_frames
        if not wanted:
            return []
        found: list[tuple[int, np.ndarray]] = []
        for row in rows:
            if len(found) == wanted:
                break
            path = stored_jpeg(self.settings.data_dir, row.image_path) if row.image_path else None
            if path is None:
                continue
            picture = cv2.imdecode(np.frombuffer(path.read_bytes(), dtype=np.uint8), cv2.IMREAD_COLOR)
            if picture is None:
                log.warning("ask: the frame of caption %s is not a readable JPEG; left out", row.id)
                continue
            found.append((row.id, picture))
        images = encode_frames(
            [picture for _, picture in found], self.settings.ask_image_tokens, self.settings.ask_image_token_size
        )
        return [Frame(row_id, image.jpeg, image.image_tokens) for (row_id, _), image in zip(found, images, strict=True)]

    def _local(self, at: datetime | None) -> str:
        return at.astimezone(self.zone).strftime("%Y-%m-%d %H:%M") if at else "..."

    def _no_match_text(self, plan: Plan) -> str:
        parts = []
        if plan.context.cameras:
            parts.append("on " + ", ".join(plan.context.cameras))
        if plan.context.since or plan.context.until:
            since, until = (self._local(at) for at in (plan.context.since, plan.context.until))
            parts.append(f"between {since} and {until} ({self.zone.key})")
        return NO_MATCH.format(scope=(" " + " ".join(parts)) if parts else "")

    def _upstream_body(self, plan: Plan, model: str, stream: bool) -> dict[str, object]:
        assert plan.prompt is not None
        body: dict[str, object] = {
            **self.settings.ask_extra_body,
            "model": model,
            "messages": plan.prompt.messages,
            "max_tokens": plan.max_tokens,
            "stream": stream,
        }
        if plan.request.temperature is not None:
            body["temperature"] = plan.request.temperature
        return body

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.settings.ask_vlm_api_key.get_secret_value()}"}

    def _url(self) -> str:
        return self.settings.vlm_base_url.rstrip("/") + "/chat/completions"

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.settings.ask_timeout_s, connect=10.0)

    def _refused(self, plan: Plan, model: str, status: int, detail: str) -> ApiError:
        if status in (408, 429, 503):
            return ApiError(
                503, f"the VLM is busy (HTTP {status}); try again shortly", headers={"Retry-After": RETRY_AFTER_S}
            )
        if status == 404 and self.model.is_learnt(plan.request.model):
            # The VLM was restarted with another model since it was learnt: the next request reads its list.
            self.model.forget()
            return ApiError(
                503,
                f"the VLM no longer serves {model!r}; try again shortly",
                headers={"Retry-After": RETRY_AFTER_S},
            )
        if status == 404 and self.model.configured is None:
            return ApiError(
                404,
                f"the VLM does not serve a model {model!r}; ask for `visioncap-ask` (GET /v1/models)",
                param="model",
                error_type="model_not_found",
            )
        return ApiError(502, f"the VLM answered HTTP {status}: {detail[:300]}")

    async def complete(self, client: httpx.AsyncClient, plan: Plan) -> ChatCompletion:
        """A non-streaming answer."""
        if plan.prompt is None:
            usage: dict[str, Any] = {}
            text, finish = self._no_match_text(plan), "stop"
        else:
            model = await self.model.resolve(client, plan.request.model)
            try:
                response = await client.post(
                    self._url(),
                    json=self._upstream_body(plan, model, False),
                    headers=self._headers(),
                    timeout=self._timeout(),
                )
            except httpx.HTTPError as exc:
                raise ApiError(
                    503, f"the VLM is unreachable ({type(exc).__name__})", headers={"Retry-After": RETRY_AFTER_S}
                ) from exc
            if response.status_code != 200:
                raise self._refused(plan, model, response.status_code, response.text)
            answer = response.json()
            choice = answer["choices"][0]
            text, finish, usage = (
                choice["message"].get("content") or "",
                choice.get("finish_reason"),
                answer.get("usage") or {},
            )
        prompt_tokens, completion_tokens = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
        return ChatCompletion.model_validate(
            {
                "id": plan.id,
                "object": "chat.completion",
                "created": plan.created,
                "model": plan.request.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
                "visioncap": plan.context.model_dump(mode="json"),
            }
        )

    def _chunk(self, plan: Plan, delta: dict[str, str], finish: str | None, first: bool = False) -> str:
        chunk: dict[str, object] = {
            "id": plan.id,
            "object": "chat.completion.chunk",
            "created": plan.created,
            "model": plan.request.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        if first:
            chunk["visioncap"] = plan.context.model_dump(mode="json")
        return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"

    async def open_stream(self, client: httpx.AsyncClient, plan: Plan) -> httpx.Response | None:
        """The VLM's streaming response, its status checked (so that a refusal is an error status, not a broken
        stream); None when nothing matched. The caller closes it."""
        if plan.prompt is None:
            return None
        model = await self.model.resolve(client, plan.request.model)
        request = client.build_request(
            "POST",
            self._url(),
            json=self._upstream_body(plan, model, True),
            headers=self._headers(),
            timeout=self._timeout(),
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise ApiError(
                503, f"the VLM is unreachable ({type(exc).__name__})", headers={"Retry-After": RETRY_AFTER_S}
            ) from exc
        if response.status_code != 200:
            detail = (await response.aread()).decode(errors="replace")
            await response.aclose()
            raise self._refused(plan, model, response.status_code, detail)
        return response

    async def stream(self, plan: Plan, upstream: httpx.Response | None) -> AsyncGenerator[str, None]:
        """Our chunks: the first with the role and `visioncap`, then the VLM's text as it comes, then [DONE].

        A client that leaves ends this generator, which closes the VLM's response: the gateway then cancels the
        request in vLLM."""
        try:
            yield self._chunk(plan, {"role": "assistant", "content": ""}, None, first=True)
            if upstream is None:
                yield self._chunk(plan, {"content": self._no_match_text(plan)}, None)
                yield self._chunk(plan, {}, "stop")
            else:
                async for line in upstream.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        event = json.loads(payload)
                        choice = (event.get("choices") or [{}])[0]
                    except (ValueError, AttributeError, IndexError):
                        log.warning("ask: a chunk of the VLM's stream is not JSON: %.200s", payload)
                        continue
                    content = (choice.get("delta") or {}).get("content")
                    finish = choice.get("finish_reason")
                    if content or finish:
                        yield self._chunk(plan, {"content": content} if content else {}, finish)
            yield "data: [DONE]\n\n"
        except httpx.HTTPError as exc:
            # The status was 200: the stream broke midway. An error event the OpenAI SDK raises on, then the end.
            log.warning("ask: the VLM's stream broke: %s", exc)
            error = {"error": {"message": f"the VLM's stream broke ({type(exc).__name__})", "type": "upstream_error"}}
            yield f"data: {json.dumps(error)}\n\n"
        finally:
            if upstream is not None:
                with anyio.CancelScope(shield=True):
                    await upstream.aclose()
