"""Ask: OpenAI-compatible chat completions answered from the stored captions (see visioncap/api/ask.py)."""

from __future__ import annotations

import time
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends
from starlette.responses import Response

from visioncap.api.ask_model import ASK_MODEL
from visioncap.api.auth import CameraScope, camera_scope
from visioncap.api.errors import ApiError
from visioncap.api.protocol import ChatCompletion, ChatModelList, ChatRequest, ErrorResponse
from visioncap.api.routers.common import BAD_BODY, ERRORS, SECURED, ClosingStreamingResponse, service
from visioncap.api.serving import ApiService

router = APIRouter(prefix="/v1", tags=["ask"], dependencies=SECURED, responses=ERRORS)

_STARTED = int(time.time())


@router.post(
    "/chat/completions",
    response_model=ChatCompletion,
    summary="Ask about what the cameras saw (OpenAI chat completions)",
    description="Point any OpenAI client or chat UI here (base URL `.../v1`, an API key with the `read` scope) "
    "and ask for the model `visioncap-ask` (GET /v1/models): the VLM's own served model answers it, or "
    "VISIONCAP_ASK_MODEL when set. The last `user` message is the question: cameras it names (by id, or with "
    "spaces for - and _) and times "
    '("today", "this morning/afternoon/evening", "tonight", "yesterday [morning|...]", "last N hours", '
    '"after 6 pm", "before 9:30 am"; in VISIONCAP_ASK_TIME_ZONE) filter the captions; the best '
    "VISIONCAP_ASK_TOP_K captioned rows (hybrid search when VISIONCAP_API_SEMANTIC_SEARCH is on, any-word "
    "full-text otherwise) go into the prompt, as many as the model's context holds, and the VLM answers through "
    "VISIONCAP_VLM_BASE_URL with VISIONCAP_ASK_VLM_API_KEY. The `visioncap` field (`AskContext`) lists the "
    "retrieved ids and the citations (the captions the prompt held, with image links); with `stream: true` it "
    "is on the first `chat.completion.chunk`, before any text. When nothing matches, the VLM is not asked: the "
    'answer says "No stored captions match ..." with empty citations. A last message that begins `### Task:` '
    "(a chat UI's own title, tags or follow-up prompt, as Open WebUI sends) is no question: it goes to the VLM "
    "as plain chat (up to VISIONCAP_ASK_MAX_TASK_CHARS, its quoted chat history shortened to fit the context, "
    "`max_tokens` capped rather than refused), with `search: task` and no captions.",
    responses={
        **BAD_BODY,
        200: {
            "description": "The answer: a `chat.completion` (JSON), or with `stream: true` server-sent events, each "
            "`data:` line a `chat.completion.chunk`, the last `data: [DONE]`.",
            # OpenAPI before 3.2: a stream's `schema` describes one event.
            "content": {
                "text/event-stream": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "data": {
                                "type": "string",
                                "description": "A `chat.completion.chunk` as JSON, or `[DONE]` after the last.",
                            }
                        },
                        "required": ["data"],
                    }
                }
            },
        },
        422: {
            "model": ErrorResponse,
            "description": "A malformed body; more than VISIONCAP_ASK_MAX_MESSAGES messages, a `user` or "
            "`assistant` one longer than VISIONCAP_ASK_MAX_MESSAGE_CHARS (a task prompt: "
            "VISIONCAP_ASK_MAX_TASK_CHARS) or with a NUL character; a last message (`system` messages aside) that "
            "is not a non-empty `user` message, the question; `max_tokens` (or `max_completion_tokens`) above "
            "VISIONCAP_ASK_MAX_TOKENS; or a question longer than the model's context leaves beside the answer.",
        },
        404: {
            "model": ErrorResponse,
            "description": "`model` names neither `visioncap-ask` nor a model the VLM serves (VISIONCAP_ASK_MODEL "
            "unset): `model_not_found`.",
        },
        502: {"model": ErrorResponse, "description": "The VLM refused the request."},
        503: {
            "model": ErrorResponse,
            "description": "The VLM is unreachable or busy, its model list could not be read, or the database is away.",
        },
    },
)
async def chat_completions(
    api: Annotated[ApiService, Depends(service)],
    scope: Annotated[CameraScope, Depends(camera_scope)],
    request: ChatRequest,
) -> Response:
    plan = await anyio.to_thread.run_sync(api.asker.plan, request, scope)
    if api.http is None:
        raise ApiError(503, "the API is starting", headers={"Retry-After": "1"})
    if not request.stream:
        answer = await api.asker.complete(api.http, plan)
        return Response(answer.model_dump_json(), media_type="application/json")
    upstream = await api.asker.open_stream(api.http, plan)
    return ClosingStreamingResponse(api.asker.stream(plan, upstream), None if upstream is None else upstream.aclose)


@router.get(
    "/models",
    response_model=ChatModelList,
    summary="The model name Ask answers to (OpenAI model list)",
    description="`visioncap-ask`: the name to send as `model`, answered by the VLM's served model (or "
    "VISIONCAP_ASK_MODEL); /readyz checks that the VLM serves it.",
)
def models() -> ChatModelList:
    return ChatModelList.model_validate(
        {"object": "list", "data": [{"id": ASK_MODEL, "object": "model", "created": _STARTED, "owned_by": "visioncap"}]}
    )
