"""A chat UI's task prompts (`### Task:`, Open WebUI's titles, tags, follow-ups) against Ask's bounds: no VLM here.

The VLM sits at the discard port, where nothing answers, and no Ask setting is made: a request that gets past
Ask's checks then fails to learn the VLM's model (503, the VLM is unreachable), so a 503 shows that a prompt was
accepted, and a 422 that it was refused. With vLLM: tests/test_ask_defaults.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from open_webui_prompts import TITLE_CHARS, follow_ups_prompt, history, title_prompt

from visioncap.api import create_app
from visioncap.ask.prompt import estimate_tokens
from visioncap.ask.task import SHORTENED, TaskTooLong, is_task, shorten_history, task_prompt
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key

KEY = "task-read-key"
NOWHERE = "http://127.0.0.1:9/v1"  # the discard port: nothing answers


def test_task_prompts_are_told_from_questions() -> None:
    assert is_task(title_prompt()) and is_task("\n  ### Task:\nSuggest follow-ups")
    assert not is_task("Was there a courier? ### Task: none") and not is_task("### Tasks for today")


def test_a_history_that_does_not_fit_keeps_its_newest_whole_lines() -> None:
    prompt = follow_ups_prompt(20_000)
    budget = 2_000
    assert estimate_tokens(prompt) > budget
    shortened = shorten_history(prompt, budget)
    assert estimate_tokens(shortened) <= budget
    assert shortened.startswith("### Task:") and shortened.endswith("</chat_history>")
    quoted = shortened.split("<chat_history>\n", 1)[1].removesuffix("\n</chat_history>")
    assert quoted.startswith(SHORTENED)
    kept = quoted.removeprefix(SHORTENED).splitlines()
    whole = history(20_000).splitlines()
    # The newest lines, each whole (the last one of the history may itself be cut by history()'s length).
    assert len(kept) > 10 and kept == whole[len(whole) - len(kept) :]
    assert shorten_history(title_prompt(), 4_000) == title_prompt()  # fits: unchanged


def test_a_task_that_cannot_fit_is_refused() -> None:
    with pytest.raises(TaskTooLong, match="without its chat history"):
        shorten_history(follow_ups_prompt(1_000), 50)
    with pytest.raises(TaskTooLong, match="no <chat_history>"):
        shorten_history("### Task:\n" + "x" * 10_000, 1_000)
    prompt = task_prompt(follow_ups_prompt(30_000), 3_584)
    assert prompt.caption_ids == [] and prompt.estimated_tokens <= 3_584
    assert [message["role"] for message in prompt.messages] == ["user"]


@pytest.fixture
def local_client(tmp_path: Path) -> Iterator[TestClient]:
    settings = ApiSettings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'data' / 'visioncap.db'}",
        vlm_base_url=NOWHERE,
        api_keys=[ApiKey(name="reader", sha256=hash_key(KEY), scopes={"read"})],
    )
    with TestClient(create_app(settings)) as client:
        yield client


def ask(client: TestClient, **body: Any) -> httpx.Response:
    return client.post(
        "/v1/chat/completions", json={"model": "visioncap-ask", **body}, headers={"Authorization": f"Bearer {KEY}"}
    )


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_open_webuis_title_prompt_passes_the_checks_that_bound_a_question(local_client: TestClient) -> None:
    """4,503 characters and `max_completion_tokens: 1000`: above the question's 4,000 and the answer's 512, yet no
    422; past the checks it needs the VLM (503 here, nothing answers)."""
    answer = ask(local_client, messages=[user(title_prompt())], max_completion_tokens=1000, stream=False)
    assert len(title_prompt()) == TITLE_CHARS
    assert answer.status_code == 503, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("the VLM is unreachable (GET http://127.0.0.1:9/v1/models: ConnectError)"), message
    assert "which model it serves is not known" in message and "VISIONCAP_ASK_MODEL" in message
    assert "Retry-After" in answer.headers
    # Follow-ups quoting six long turns: far more than the context, shortened rather than refused.
    assert ask(local_client, messages=[user(follow_ups_prompt(30_000))]).status_code == 503


def test_questions_keep_their_bounds_and_tasks_have_their_own(local_client: TestClient) -> None:
    question = ask(local_client, messages=[user("courier? " + "x" * 4_000)])
    assert question.status_code == 422 and question.json()["error"]["param"] == "messages.0.content"
    assert ask(local_client, messages=[user("hi")], max_tokens=513).status_code == 422
    too_long = ask(local_client, messages=[user(follow_ups_prompt(40_000))])
    assert too_long.status_code == 422, too_long.text
    error = too_long.json()["error"]
    assert error["param"] == "messages.0.content" and "at most 32000 characters" in error["message"]
    assert "task prompt" in error["message"]


def test_a_long_system_message_is_dropped_unread(local_client: TestClient) -> None:
    """Chat UIs send their own system prompt; Ask writes its own, so a long one is no reason to refuse."""
    answer = ask(
        local_client,
        messages=[{"role": "system", "content": "Be helpful. " * 1_000}, user("Any giraffes on the lawn today?")],
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"].startswith("No stored captions match")


def test_models_lists_what_ask_answers_as(local_client: TestClient) -> None:
    listed = local_client.get("/v1/models", headers={"X-Api-Key": KEY})
    assert listed.status_code == 200 and [model["id"] for model in listed.json()["data"]] == ["visioncap-ask"]
