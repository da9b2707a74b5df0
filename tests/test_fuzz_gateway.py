"""Property-based tests of the priority gateway, generated from its OpenAPI document by Schemathesis.

The real gateway (uvicorn in a thread, `GatewayThread`) in front of the session's real vLLM; every operation of the
document is called with generated bodies (valid ones, and invalid ones that must be refused with a 4xx) and an
interactive key. Each answer must be no 5xx, a status code the document lists, its content type and its schema
(server-sent events: each event), and every operation must have answered some request with success (but
/v1/embeddings: vLLM serves no embedding model here, so 404). The cases are counted per operation and status in
test-artifacts/fuzz-gateway-cases.json.

Generated bodies ask vLLM for at most `MAX_TOKENS` tokens and name the model it serves (the `before_call` hook): left
to the generator, most requests would ask for thousands of tokens, or be answered 404 for an unknown model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import fuzzing
import hypothesis
import pytest
import requests
import schemathesis
from helpers import TINY_MODEL
from hypothesis import strategies as st
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.gateway.app import create_app
from visioncap.gateway.in_thread import GatewayThread
from visioncap.serve import VllmServer

# serial: see test_fuzz_api.
pytestmark = [pytest.mark.vllm, pytest.mark.serial]

KEY = "fuzz-interactive-key"
TIMEOUT = 120  # seconds; a bound on a broken test, never a measurement
MAX_TOKENS = 4
SETTINGS = fuzzing.settings(max_examples=25)
TALLY = fuzzing.Tally("fuzz-gateway-cases")
TITLE = "visioncap gateway"
GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


def config(base_url: str) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": base_url, "metrics_poll_s": 0.5}],
            "keys": [{"name": "fuzz", "sha256": hash_key(KEY), "traffic_class": "interactive"}],
        }
    )


# The gateway's document, made at import time (the generated tests are collected from it; it is not served).
DOCUMENT = create_app(config("http://127.0.0.1:9/v1")).openapi()
schema = schemathesis.openapi.from_dict(DOCUMENT)


@schemathesis.hook
def before_call(context: schemathesis.HookContext, case: schemathesis.Case, kwargs: dict[str, Any]) -> None:
    """Generation capped at MAX_TOKENS tokens, the model vLLM serves named. Schemathesis checks the body again after
    this hook, so a negative case these changes would make valid is judged as the valid one it became."""
    if case.operation.schema.raw_schema.get("info", {}).get("title") != TITLE or not isinstance(case.body, dict):
        return
    body = case.body
    if case.operation.path in GENERATING:
        limits = [name for name in ("max_tokens", "max_completion_tokens", "max_output_tokens") if name in body]
        for name in limits:
            if isinstance(body[name], int) and not isinstance(body[name], bool) and body[name] > MAX_TOKENS:
                body[name] = MAX_TOKENS
        if not limits:
            body["max_output_tokens" if case.operation.path == "/v1/responses" else "max_tokens"] = MAX_TOKENS
    if isinstance(body.get("model"), str) and "\x00" not in body["model"]:
        body["model"] = TINY_MODEL


# Hostile inputs of issue 40 that a schema does not generate, mixed into the generated bodies (`flatmap_body`): a
# lone surrogate (which the client sends as the JSON escape \ud800) in message text and in `user`, numbers sent as
# strings (vLLM's models read "2" as 2), and a list of prompts (a request per prompt at vLLM).
# Schemathesis validates a body it was given again (jsonschema in Rust, which takes UTF-8 only), so the body holds a
# marker, and `SurrogateSession` writes the escape in its place on the wire.
LONE_SURROGATE = "x <lone surrogate>"
ESCAPE = (b"<lone surrogate>", b"\\ud800")
NUMBERS_AS_STRINGS = {"n": "2", "best_of": "2", "max_tokens": "4"}


def hostile_variants(body: dict[str, Any]) -> list[dict[str, Any]]:
    variants = [{**body, "user": LONE_SURROGATE}, {**body, **NUMBERS_AS_STRINGS}]
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[0], dict):
        variants.append({**body, "messages": [{**messages[0], "content": LONE_SURROGATE}, *messages[1:]]})
    if "prompt" in body:
        variants += [{**body, "prompt": ["a cat", "a dog"]}, {**body, "prompt": LONE_SURROGATE}]
    return variants


@schemathesis.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> Any:
    """Each generated body as it is, or turned hostile (one in four)."""
    operation = context.operation
    if operation is None or operation.schema.raw_schema.get("info", {}).get("title") != TITLE:
        return st.just(body)
    if not isinstance(body, dict):
        return st.just(body)
    return st.one_of(st.just(body), st.just(body), st.just(body), st.sampled_from(hostile_variants(body)))


class SurrogateSession(requests.Session):
    """Sends the lone surrogate of LONE_SURROGATE as JSON does: the escape \\ud800 in the body's bytes."""

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        if isinstance(request.body, bytes) and ESCAPE[0] in request.body:
            request.body = request.body.replace(*ESCAPE)
            request.headers["Content-Length"] = str(len(request.body))
        return super().send(request, **kwargs)


def has_a_lone_surrogate(body: Any) -> bool:
    return any(isinstance(item, str) and LONE_SURROGATE in item for item in _walk(body))


# The 400s of the gateway itself; any other 400 is vLLM's own validation of what the gateway passes on.
GATEWAY_400 = {"invalid_request_error", "image_too_large", "media_url_not_allowed"}


def _walk(value: Any) -> Iterator[Any]:
    yield value
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        yield from _walk(child)


def has_a_nul_key(body: Any) -> bool:
    return any(isinstance(item, dict) and any("\x00" in key for key in item) for item in _walk(body))


def media_urls(body: Any) -> list[str]:
    urls = []
    for item in _walk(body):
        if isinstance(item, dict) and item.get("type") in ("image_url", "input_image"):
            url = item.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            urls.append(url if isinstance(url, str) else "")
    return urls


def refused_as_documented(response: schemathesis.Response, case: schemathesis.Case) -> bool:
    """A 400 for a schema-valid body that the document says may come: vLLM's validation of the fields the gateway
    passes on (the document describes what the gateway reads), or a rule of the gateway's that JSON Schema cannot
    state for free-form values (a NUL in any key) or that depends on its file (the allow-listed media hosts)."""
    if response.status_code not in (400, 422):
        return False
    error = json.loads(response.content).get("error") or {}  # its shape is response_schema_conformance's to check
    if response.status_code == 422:  # a number sent as a string, which the gateway reads strictly
        param = error.get("param")
        return isinstance(case.body, dict) and param in NUMBERS_AS_STRINGS and isinstance(case.body.get(param), str)
    if "surrogate" in str(error.get("message")) and has_a_lone_surrogate(case.body):
        return True
    if error.get("type") not in GATEWAY_400:
        return True
    if error["type"] == "media_url_not_allowed":
        return any(not url.startswith("data:") for url in media_urls(case.body))
    return "NUL" in str(error.get("message")) and has_a_nul_key(case.body)


def positive_data_accepted_unless_refused_as_documented(
    ctx: schemathesis.CheckContext, response: schemathesis.Response, case: schemathesis.Case
) -> bool | None:
    """Schemathesis' positive_data_acceptance, less the refusals `refused_as_documented` picks out."""
    if refused_as_documented(response, case):
        return None
    return positive_data_acceptance(ctx, response, case)


SESSION = SurrogateSession()


@pytest.fixture(scope="module")
def gateway_url(vllm_server: VllmServer) -> Iterator[str]:
    with GatewayThread(config(vllm_server.base_url)) as gateway:
        yield gateway.root_url


def test_every_keyed_operation_names_the_key_and_every_body_is_described() -> None:
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            if path not in ("/healthz", "/readyz", "/metrics"):
                assert operation["security"] == [{"bearer": []}], (method, path)
            if method == "post":
                body = operation["requestBody"]["content"]["application/json"]["schema"]
                assert body["type"] == "object" and body["properties"] and "$ref" not in json.dumps(body), path
    assert DOCUMENT["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


@schema.parametrize()
@hypothesis.settings(SETTINGS)
def test_gateway_answers_every_generated_request_as_its_schema_says(case: schemathesis.Case, gateway_url: str) -> None:
    response = case.call_and_validate(
        base_url=gateway_url,
        session=SESSION,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=TIMEOUT,
        # The document describes the fields vLLM validates as OpenAI defines them; vLLM is more lenient (it reads
        # `false` as token id 0, a message without content as empty), and a body the gateway passes on is vLLM's to
        # refuse or not. Bodies the gateway itself refuses are checked by the other checks and test_gateway_hostile.
        excluded_checks=[positive_data_acceptance, negative_data_rejection],
        additional_checks=[positive_data_accepted_unless_refused_as_documented],
    )
    TALLY.count(case, response.status_code)


def test_every_operation_was_fuzzed_and_answered_with_success() -> None:
    """After the generated cases (pytest runs this module in order): none left out, none only ever refused."""
    TALLY.check_coverage(schema, never_succeeds=frozenset({"POST /v1/embeddings"}))
