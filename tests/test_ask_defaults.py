"""Ask as a new user runs it: `visioncap api` with no VISIONCAP_ASK_* setting at all, its VLM the session's tiny
vLLM, asked as chat clients ask (`model: visioncap-ask`, the name GET /v1/models lists) and as Open WebUI asks for
a chat's title and follow-ups. /readyz says which model Ask's questions go to, and refuses a configured model the
VLM does not serve.

Real parts: the `visioncap api` command in a process of its own (its environment only what is set here, started
outside the repository so that no .env is read), SQLite, vLLM.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from helpers import REPO, TINY_MODEL, serve_cli
from open_webui_prompts import title_prompt

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.frames import Caption
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine

KEY = "defaults-read-key"
TIMEOUT = 120  # seconds; a bound on a broken test, never a measurement
PERSON = {"x1": 1.0, "y1": 1.0, "x2": 20.0, "y2": 40.0, "confidence": 0.9, "class_id": 0, "track_id": 1}
CAPTIONS = ["a courier carrying a parcel to the front door", "a fox crosses the lawn"]


def seed(data_dir: Path) -> str:
    """Two captioned rows of the last hour in a new SQLite file; its URL."""
    url = f"sqlite:///{data_dir / 'visioncap.db'}"
    store = CaptionStore(create_db_engine(url))
    store.create_schema()
    for index, text in enumerate(CAPTIONS):
        row_id = store.add(
            NewCaption(
                pipeline="p",
                camera="front-door",
                source="/videos/front-door.mp4",
                frame_index=index,
                offset_s=float(index),
                captured_at=datetime.now(UTC) - timedelta(minutes=30 - index),
                reason="new-event",
                people=[
                    {"x1": 1.0, "y1": 1.0, "x2": 20.0, "y2": 40.0, "confidence": 0.9, "class_id": 0, "track_id": 1}
                ],
                image_width=64,
                image_height=48,
                model="tiny",
                event_key=f"front-door:{index}",
                event_ids=[1],
                score=0.5,
                frame_width=64,
                frame_height=48,
            )
        )
        assert row_id is not None
        store.mark_captioned(row_id, Caption(text, "tiny", 300, 12, 0.5), attempts=1)
    store.engine.dispose()
    return url


def bare_env(data_dir: Path, database_url: str, vlm_base_url: str) -> dict[str, str]:
    """This process's environment without a single VISIONCAP_ setting, then only the API's basics."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("VISIONCAP_")}
    return {
        **env,
        "PYTHONPATH": str(REPO),  # this checkout's visioncap, whatever the working directory
        "VISIONCAP_DATA_DIR": str(data_dir),
        "VISIONCAP_DATABASE_URL": database_url,
        "VISIONCAP_VLM_BASE_URL": vlm_base_url,
        "VISIONCAP_API_KEYS": json.dumps([{"name": "reader", "sha256": hash_key(KEY), "scopes": ["read"]}]),
    }


@pytest.fixture(scope="module")
def api(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("ask-defaults")
    data_dir = root / "data"
    env = bare_env(data_dir, seed(data_dir), vllm_server.base_url)
    with serve_cli(["api"], env, cwd=root) as url:
        yield url


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, timeout=TIMEOUT, max_retries=0)


def test_the_settings_seen_here_hold_no_ask_setting(tmp_path: Path) -> None:
    """What the `api` fixture's process reads: every ask_* field at its default."""
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(bare_env(tmp_path, "sqlite:///x.db", "http://127.0.0.1:9/v1"))
        settings = ApiSettings(_env_file=None)  # type: ignore[call-arg]
    finally:
        os.environ.clear()
        os.environ.update(saved)
    defaults = {name: field.get_default(call_default_factory=True) for name, field in ApiSettings.model_fields.items()}
    assert {name: getattr(settings, name) for name in defaults if name.startswith("ask_")} == {
        name: value for name, value in defaults.items() if name.startswith("ask_")
    }
    assert settings.ask_model is None


def test_a_question_to_visioncap_ask_is_answered_by_the_served_model(api: str) -> None:
    listed = httpx.get(f"{api}/v1/models", headers={"X-Api-Key": KEY}, timeout=TIMEOUT).json()
    assert [model["id"] for model in listed["data"]] == ["visioncap-ask"]
    answer = client(api).chat.completions.create(
        model="visioncap-ask",
        messages=[{"role": "user", "content": "Did a courier come to the front door?"}],
        max_tokens=8,
    )
    assert answer.model == "visioncap-ask"
    context = (answer.model_extra or {})["visioncap"]
    assert [citation["caption"] for citation in context["citations"]] == [CAPTIONS[0]]
    assert answer.usage is not None and answer.usage.prompt_tokens > 0  # vLLM answered
    streamed = list(
        client(api).chat.completions.create(
            model="visioncap-ask",
            messages=[{"role": "user", "content": "Show me the fox"}],
            max_tokens=4,
            stream=True,
        )
    )
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")


def test_readyz_checks_the_model_ask_asks_for(api: str) -> None:
    ready = httpx.get(f"{api}/readyz", headers={"X-Api-Key": KEY}, timeout=TIMEOUT)
    assert ready.status_code == 200, ready.text
    check = ready.json()["checks"]["ask"]
    assert check["ok"] and repr(TINY_MODEL) in check["detail"] and "visioncap-ask" in check["detail"]


def test_open_webuis_title_prompt_is_answered_as_chat(api: str) -> None:
    """Open WebUI's title prompt (4,503 characters, `max_completion_tokens: 1000`): answered by vLLM, with no
    captions and `search: task`, the answer capped at VISIONCAP_ASK_MAX_TOKENS. (Its history shortened to fit is
    tests/test_ask_task.py's: the tiny model's 1,000-token vocabulary takes about a token a character, twice
    what Ask's estimate allows for real models' tokenizers.)"""
    answer = httpx.post(
        f"{api}/v1/chat/completions",
        json={
            "model": "visioncap-ask",
            "messages": [{"role": "user", "content": title_prompt()}],
            "stream": False,
            "max_completion_tokens": 1000,
        },
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=TIMEOUT,
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["model"] == "visioncap-ask"
    assert body["visioncap"]["search"] == "task" and body["visioncap"]["retrieved"] == []
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] <= 512  # vLLM answered


def test_a_model_the_vlm_does_not_serve_is_a_404_naming_the_alias(api: str) -> None:
    refused = httpx.post(
        f"{api}/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Did a courier come?"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=TIMEOUT,
    )
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["type"] == "model_not_found" and error["param"] == "model" and "visioncap-ask" in error["message"]


def test_readyz_refuses_a_configured_model_the_vlm_does_not_serve(vllm_server: VllmServer, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    settings = ApiSettings(
        data_dir=data_dir,
        database_url=seed(data_dir),
        vlm_base_url=vllm_server.base_url,
        ask_model="no-such-model",
        api_keys=[ApiKey(name="reader", sha256=hash_key(KEY), scopes={"read"})],
    )
    with TestClient(create_app(settings)) as local:
        ready = local.get("/readyz", headers={"X-Api-Key": KEY})
    assert ready.status_code == 503 and ready.json()["status"] == "unavailable"
    check = ready.json()["checks"]["ask"]
    assert not check["ok"]
    assert (
        "VISIONCAP_ASK_MODEL 'no-such-model' is not served" in check["detail"] and repr(TINY_MODEL) in check["detail"]
    )
    assert ready.json()["checks"]["vlm"]["ok"]  # the VLM answers: only Ask's model is wrong
