"""Routes: thin wrappers that hand each request to the app's Gateway."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from visioncap.gateway.serving import Gateway

router = APIRouter()


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _gateway(request).generate(request, "chat")


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _gateway(request).generate(request, "completions")


@router.post("/v1/responses")
async def responses(request: Request) -> Response:
    return await _gateway(request).generate(request, "responses")


@router.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    return await _gateway(request).generate(request, "embeddings")


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    return await _gateway(request).utility(request, "/tokenize")


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    return await _gateway(request).utility(request, "/detokenize")


@router.get("/v1/models")
async def models(request: Request) -> Response:
    return await _gateway(request).models(request)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST

    return Response(_gateway(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    return _gateway(request).health(request)
