"""Ask (POST /v1/chat/completions): the question's cameras and times, retrieval against an oracle, citations,
the prompt's bound, streaming, auth and bounds, and the answer coming from vLLM through the gateway's
interactive class.

The random tiny model's answers are noise, so what is checked is what is deterministic: the ids retrieved and
cited, the shapes, the prompt's length as vLLM counted it, the traffic class the gateway saw. Real parts
throughout: captions written by the store and outbox into SQLite, the API and the gateway on real sockets
(uvicorn in threads), the session's vLLM server. No clock is faked: the time zone is chosen so that local "now"
is late afternoon, and the captions are placed at local times of today and the days before.
"""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from helpers import TINY_MODEL, scrape_metric, wait_for
from PIL import Image
from sqlalchemy import select
from taps import AsgiThread

from visioncap.api import create_app
from visioncap.ask.prompt import IMAGE_PART_TOKENS, estimate_tokens, frame_label
from visioncap.ask.question import read_question
from visioncap.ask.retrieve import retrieve
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.gateway.in_thread import GatewayThread
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.embeddings import TextEmbedder
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import ensure_schema
from visioncap.store.search import SearchLimits
from visioncap.store.semantic import Meaning
from visioncap.store.vectors import backfill

READ_KEY = "ask-read-key"
WRITE_ONLY_KEY = "ask-write-only-key"
INTERACTIVE_KEY = "ask-interactive-key"
BACKGROUND_KEY = "ask-background-key"
TIMEOUT = 120  # seconds; a bound on a broken test, never a measurement
BERLIN = ZoneInfo("Europe/Berlin")
ENDED = "visioncap_gateway_responses_ended_total"


# -- reading the question: pure functions, a fixed "now", a zone with DST ----------------------------------------


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "now", "since", "until"),
    [
        # The day after the spring change (29 March 2026): yesterday had 23 hours.
        ("what happened yesterday", utc(2026, 3, 30, 10), utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)),
        # The autumn change (25 October 2026): that day had 25 hours.
        ("anything yesterday?", utc(2026, 10, 26, 10), utc(2026, 10, 24, 22), utc(2026, 10, 25, 23)),
        ("who came this morning", utc(2026, 3, 30, 10), utc(2026, 3, 30, 3), utc(2026, 3, 30, 10)),
        ("this afternoon", utc(2026, 1, 15, 20), utc(2026, 1, 15, 11), utc(2026, 1, 15, 16)),
        ("this evening", utc(2026, 7, 1, 20), utc(2026, 7, 1, 15), utc(2026, 7, 1, 20)),
        ("tonight", utc(2026, 1, 15, 20), utc(2026, 1, 15, 17), utc(2026, 1, 16, 5)),
        ("today", utc(2026, 3, 29, 12), utc(2026, 3, 28, 23), utc(2026, 3, 29, 22)),
        ("yesterday after 6 pm", utc(2026, 3, 30, 10), utc(2026, 3, 29, 16), utc(2026, 3, 29, 22)),
        ("yesterday morning before 9:30 am", utc(2026, 3, 30, 10), utc(2026, 3, 29, 3), utc(2026, 3, 29, 7, 30)),
        ("before 9 am", utc(2026, 1, 15, 12), utc(2026, 1, 14, 23), utc(2026, 1, 15, 8)),
        ("after 18:00", utc(2026, 1, 15, 12), utc(2026, 1, 15, 17), utc(2026, 1, 15, 23)),
        ("in the last 3 hours", utc(2026, 1, 15, 12), utc(2026, 1, 15, 9), None),
        ("the past hour", utc(2026, 1, 15, 12), utc(2026, 1, 15, 11), None),
        ("last 90 minutes", utc(2026, 1, 15, 12), utc(2026, 1, 15, 10, 30), None),
        ("a red car", utc(2026, 1, 15, 12), None, None),
        # A bare number is not a time.
        ("after 2 cars left", utc(2026, 1, 15, 12), None, None),
    ],
)
def test_time_phrases_in_the_configured_zone(
    text: str, now: datetime, since: datetime | None, until: datetime | None
) -> None:
    question = read_question(text, [], now, BERLIN)
    assert (question.since, question.until) == (since, until)


def test_cameras_named_in_the_question_and_the_search_text_left() -> None:
    cameras = ["front-door", "front-door-2", "driveway", "back_yard"]
    question = read_question(
        "Did a courier come to the Front Door or the back yard camera this morning?",
        cameras,
        utc(2026, 1, 15, 12),
        BERLIN,
    )
    assert question.cameras == ("back_yard", "front-door")
    assert question.search_text == "did a courier come to the or the ?"
    assert read_question("front-door-2 at night", cameras, utc(2026, 1, 15, 12), BERLIN).cameras == ("front-door-2",)
    # Part of a longer word is no camera.
    assert read_question("the driveways", cameras, utc(2026, 1, 15, 12), BERLIN).cameras == ()


# -- a seeded database, the API and the gateway --------------------------------------------------------------------


def jpeg() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (40, 40, 40)).save(out, format="JPEG")
    return out.getvalue()


def afternoon_zone() -> ZoneInfo:
    """A fixed-offset zone in which it is now 16:00-17:00: "this morning" and "today 14:00" are past."""
    offset = (16 - datetime.now(UTC).hour + 12) % 24 - 12  # -12..11 hours
    return ZoneInfo(f"Etc/GMT{-offset:+d}")  # Etc/GMT-5 is UTC+5


@dataclass(frozen=True)
class Seeded:
    data_dir: Path
    zone: ZoneInfo
    ids: dict[str, int]  # name -> caption id


# name: (camera, days before today, local hour, text)
ROWS = {
    "door_courier": ("front-door", 0, 8.2, "a courier carrying a parcel to the front door"),
    "door_man": ("front-door", 0, 10.5, "a man in a red jacket rings the bell"),
    "drive_van": ("driveway", 0, 9.0, "a courier van parks in the driveway"),
    "drive_car": ("driveway", 0, 14.0, "a white car leaves the driveway"),
    "yard_fox": ("backyard", 1, 19.5, "a fox crosses the lawn"),
    "yard_plants": ("backyard", 1, 7.0, "a person waters the plants"),
    "drive_drop": ("driveway", 1, 20.25, "a courier drops a parcel at the garage"),
    "door_old": ("front-door", 2, 12.0, "a courier with a parcel at the door"),
}


def local(zone: ZoneInfo, days_before: int, hour: float) -> datetime:
    day: date = datetime.now(zone).date() - timedelta(days=days_before)
    return (datetime.combine(day, datetime.min.time(), tzinfo=zone) + timedelta(hours=hour)).astimezone(UTC)


def seed(data_dir: Path, zone: ZoneInfo, database_url: str | None = None) -> dict[str, int]:
    """The ROWS, captioned, with their JPEGs (through the outbox, as the pipeline writes them); their ids."""
    store = CaptionStore(create_db_engine(database_url or f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    ensure_schema(store.engine)  # the API's full-text search
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics())
    ids: dict[str, int] = {}
    for index, (name, (camera, days, hour, text)) in enumerate(ROWS.items()):
        new = NewCaption(
            pipeline="p",
            camera=camera,
            source=f"/videos/{camera}.mp4",
            frame_index=index,
            offset_s=float(index),
            captured_at=local(zone, days, hour),
            reason="new-event",
            people=[{"x1": 1.0, "y1": 1.0, "x2": 20.0, "y2": 40.0, "confidence": 0.9, "class_id": 0, "track_id": 1}],
            image_width=64,
            image_height=48,
            model="tiny",
            event_key=f"{camera}:{index}",
            event_ids=[1],
            score=0.5,
            frame_width=64,
            frame_height=48,
        )
        _, row_id = outbox.put(new, jpeg())
        assert row_id is not None
        store.mark_captioned(row_id, Caption(text, "tiny", 300, 12, 0.5), attempts=1)
        ids[name] = row_id
    store.engine.dispose()
    return ids


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    data_dir = tmp_path_factory.mktemp("ask") / "data"
    zone = afternoon_zone()
    return Seeded(data_dir, zone, seed(data_dir, zone))


def settings_for(seeded: Seeded, vlm_base_url: str, **changes: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "data_dir": seeded.data_dir,
        "database_url": f"sqlite:///{seeded.data_dir / 'visioncap.db'}",
        "vlm_base_url": vlm_base_url,
        "ask_vlm_api_key": INTERACTIVE_KEY,
        "ask_model": TINY_MODEL,
        "ask_time_zone": seeded.zone.key,
        # The random model samples its end of text now and then (2 answers in 8 stopped within 90 of 512 tokens):
        # answers as long as asked keep the leaving client's test from racing a finished answer.
        "ask_extra_body": {"ignore_eos": True},
        "api_keys": [
            ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"}),
            ApiKey(name="hook", sha256=hash_key(WRITE_ONLY_KEY), scopes={"write"}),
        ],
        "retention_interval_s": 3600,
        **changes,
    }
    return ApiSettings(**values)


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer) -> Iterator[GatewayThread]:
    config = GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": vllm_server.base_url, "metrics_poll_s": 0.5}],
            "keys": [
                {"name": "ask", "sha256": hash_key(INTERACTIVE_KEY), "traffic_class": "interactive"},
                {"name": "captions", "sha256": hash_key(BACKGROUND_KEY), "traffic_class": "background"},
            ],
        }
    )
    with GatewayThread(config) as gw:
        yield gw


@pytest.fixture(scope="module")
def api(seeded: Seeded, gateway: GatewayThread) -> Iterator[AsgiThread]:
    with AsgiThread(create_app(settings_for(seeded, gateway.base_url)), lifespan=True) as served:
        yield served


def gateway_metric(gw: GatewayThread, name: str, **labels: str) -> float:
    return scrape_metric(gw.root_url, name, **labels)


def requests_by_class(gw: GatewayThread, traffic_class: str) -> float:
    return gateway_metric(gw, "visioncap_gateway_requests_total", traffic_class=traffic_class)


def client(api: AsgiThread, key: str = READ_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.root_url}/v1", api_key=key, timeout=TIMEOUT, max_retries=0)


# question -> the names of the captions that must be retrieved (the oracle: camera, time and words by hand)
ORACLE = {
    "Did a courier come to the front door this morning?": {"door_courier"},
    "What happened yesterday after 6 pm?": {"yard_fox", "drive_drop"},
    "Was there a courier yesterday?": {"drive_drop"},
    "Show me the fox on the backyard camera": {"yard_fox"},
    "any parcel or van in the last 12 hours": {"door_courier", "drive_van"},
    "Any giraffes on the driveway today?": set(),
    "What happened on the backyard camera today?": set(),
}


def test_retrieval_matches_the_oracle_on_both_databases(database_url: str, tmp_path: Path) -> None:
    """The words retrieval alone (no VLM), on SQLite FTS5 and PostgreSQL full-text search alike."""
    zone = afternoon_zone()
    ids = seed(tmp_path / "data", zone, database_url)
    engine = create_db_engine(database_url)
    names = {row_id: name for name, row_id in ids.items()}
    for question, expected in ORACLE.items():
        read = read_question(question, {camera for camera, *_ in ROWS.values()}, datetime.now(UTC), zone)
        found = retrieve(engine, read, 8, SearchLimits())
        assert {names[row.id] for row in found.rows} == expected, question
    engine.dispose()


# Questions put in other words than the captions': the words retrieval finds nothing, meaning finds these.
PARAPHRASES = {
    "Was a package delivered yesterday?": {"drive_drop"},
    "Any vehicles on the driveway today?": {"drive_van", "drive_car"},
}


@pytest.mark.embedder
def test_hybrid_retrieval_matches_the_oracle_and_finds_paraphrases(database_url: str, tmp_path: Path) -> None:
    """Semantic search on (the real all-MiniLM-L6-v2, the shipped similarity floor), on SQLite (sqlite-vec) and
    PostgreSQL alike: the same oracle as words, none of the unrelated captions under the filters (a question about
    giraffes cites nothing), and the paraphrases."""
    zone = afternoon_zone()
    ids = seed(tmp_path / "data", zone, database_url)
    engine = create_db_engine(database_url)
    embedder = TextEmbedder()
    assert backfill(engine, embedder) == len(ROWS)
    meaning = Meaning(embedder, ApiSettings.model_fields["ask_min_similarity"].default)
    names = {row_id: name for name, row_id in ids.items()}
    cameras = {camera for camera, *_ in ROWS.values()}
    for question, expected in {**ORACLE, **PARAPHRASES}.items():
        read = read_question(question, cameras, datetime.now(UTC), zone)
        found = retrieve(engine, read, 8, SearchLimits(), meaning)
        assert {names[row.id] for row in found.rows} == expected, question
        if question in PARAPHRASES:
            assert found.method == "hybrid"
            assert retrieve(engine, read, 8, SearchLimits()).rows == [], "words alone find a paraphrase"
    engine.dispose()


@pytest.mark.parametrize("question", list(ORACLE))
def test_retrieved_and_cited_ids_match_the_oracle_and_vllm_answers_as_interactive(
    api: AsgiThread, gateway: GatewayThread, seeded: Seeded, question: str
) -> None:
    interactive, background = requests_by_class(gateway, "interactive"), requests_by_class(gateway, "background")
    answer = client(api).chat.completions.create(
        model="visioncap-ask", messages=[{"role": "user", "content": question}], max_tokens=8
    )
    context = (answer.model_extra or {})["visioncap"]
    expected = {seeded.ids[name] for name in ORACLE[question]}
    assert set(context["retrieved"]) == expected
    cited = [citation["caption_id"] for citation in context["citations"]]
    assert cited == context["retrieved"]  # the whole of a short list fits the default context
    for citation in context["citations"]:
        assert citation["image_url"] == f"/v1/captions/{citation['caption_id']}/image"
        assert httpx.get(api.root_url + citation["image_url"], headers={"X-Api-Key": READ_KEY}).status_code == 200
    assert answer.object == "chat.completion" and answer.choices[0].message.role == "assistant"
    if expected:
        # vLLM answered (it counted the prompt), reached through the gateway's interactive class.
        assert answer.usage is not None and answer.usage.prompt_tokens > 0
        assert requests_by_class(gateway, "interactive") == interactive + 1
    else:
        assert answer.choices[0].message.content.startswith("No stored captions match")
        assert answer.usage is not None and answer.usage.prompt_tokens == 0
        assert requests_by_class(gateway, "interactive") == interactive
    assert requests_by_class(gateway, "background") == background


def sse_data(response: httpx.Response) -> list[Any]:
    events: list[Any] = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
        else:
            assert line == "", f"not an SSE data line: {line!r}"
    return events


def ask_streamed(api: AsgiThread, max_tokens: int) -> AbstractContextManager[httpx.Response]:
    """A streamed Ask about yesterday's courier, with the read key."""
    body = {
        "model": "visioncap-ask",
        "messages": [{"role": "user", "content": "Was there a courier yesterday?"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    return httpx.stream(
        "POST", f"{api.root_url}/v1/chat/completions", json=body, headers={"X-Api-Key": READ_KEY}, timeout=TIMEOUT
    )


def test_streaming_answer_is_openai_sse_with_citations_first(api: AsgiThread, seeded: Seeded) -> None:
    with ask_streamed(api, max_tokens=12) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_data(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(chunk["object"] == "chat.completion.chunk" and chunk["id"] == chunks[0]["id"] for chunk in chunks)
    first = chunks[0]
    assert first["choices"][0]["delta"]["role"] == "assistant"
    assert [c["caption_id"] for c in first["visioncap"]["citations"]] == [seeded.ids["drive_drop"]]
    assert all("visioncap" not in chunk for chunk in chunks[1:])
    assert "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)  # the VLM's text
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")

    # The OpenAI SDK reads the same stream.
    stream = client(api).chat.completions.create(
        model="visioncap-ask",
        messages=[{"role": "user", "content": "Show me the fox on the backyard camera"}],
        max_tokens=8,
        stream=True,
    )
    parts = list(stream)
    assert (parts[0].model_extra or {})["visioncap"]["retrieved"] == [seeded.ids["yard_fox"]]
    assert parts[-1].choices[0].finish_reason in ("stop", "length")


def test_a_client_that_leaves_mid_answer_ends_the_request_to_the_vlm(seeded: Seeded, gateway: GatewayThread) -> None:
    """The API closes its request to the gateway when its client goes: the gateway counts the interactive answer
    as ended by its caller (`caller_gone`), long before the 3,000 tokens asked for could have been generated.

    Long: on a loaded 2-core machine vLLM's front end was seen to send a 512-token answer's head with its last
    token, 3.6 s after the request, and the answer was complete before the client could leave."""
    gone = gateway_metric(gateway, ENDED, traffic_class="interactive", how="caller_gone")
    completed = gateway_metric(gateway, ENDED, traffic_class="interactive", how="completed")
    with AsgiThread(create_app(settings_for(seeded, gateway.base_url, ask_max_tokens=3000)), lifespan=True) as api:
        with ask_streamed(api, max_tokens=3000) as response:
            for line in response.iter_lines():
                # The opening chunk (role, citations) comes once the gateway has answered 200: vLLM has it.
                if line.startswith("data: ") and '"role"' in line:
                    break
        wait_for(
            lambda: gateway_metric(gateway, ENDED, traffic_class="interactive", how="caller_gone") == gone + 1,
            TIMEOUT,
            "the gateway to see the API leave",
        )
    assert gateway_metric(gateway, ENDED, traffic_class="interactive", how="completed") == completed


def test_the_prompt_keeps_within_the_models_context(seeded: Seeded, gateway: GatewayThread) -> None:
    """A small context: fewer captions fit than were retrieved; the cited ones are a prefix of the retrieved,
    and the prompt vLLM counted is within the context less the answer's tokens."""
    context_tokens, max_tokens = 380, 8
    settings = settings_for(seeded, gateway.base_url, ask_context_tokens=context_tokens)
    with AsgiThread(create_app(settings), lifespan=True) as served:
        answer = client(served).chat.completions.create(
            model="visioncap-ask",
            messages=[
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": "Hello! Ask me about the cameras."},
                {"role": "user", "content": "any courier or parcel or van or car or fox?"},
            ],
            max_tokens=max_tokens,
        )
    context = (answer.model_extra or {})["visioncap"]
    cited = [citation["caption_id"] for citation in context["citations"]]
    assert len(context["retrieved"]) == 6 and 1 <= len(cited) < len(context["retrieved"])
    assert cited == context["retrieved"][: len(cited)]
    assert answer.usage is not None
    assert 0 < answer.usage.prompt_tokens <= context_tokens - max_tokens


def test_the_best_captions_frame_reaches_the_vlm_as_an_image_counted_within_the_context(
    seeded: Seeded, gateway: GatewayThread, tmp_path: Path
) -> None:
    """The fox's frame, 640x480 here (391 tokens of 28 px, within the 512 of VISIONCAP_ASK_IMAGE_TOKENS, so sent
    as it is), goes with the question: vLLM counts its tokens, and Ask's estimate of its cost is not below them."""
    data_dir = tmp_path / "data"
    shutil.copytree(seeded.data_dir, data_dir)
    engine = create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}")
    fox = seeded.ids["yard_fox"]
    with engine.connect() as conn:
        image_path = conn.scalar(select(CaptionRecord.image_path).where(CaptionRecord.id == fox))
    engine.dispose()
    assert image_path
    out = io.BytesIO()
    Image.effect_noise((640, 480), 40).convert("RGB").save(out, format="JPEG")
    (data_dir / image_path).write_bytes(out.getvalue())
    answers = {}
    for frames, context_tokens in ((0, 4096), (1, 4096), (2, 4096), (1, 600)):
        settings = settings_for(
            seeded,
            gateway.base_url,
            data_dir=data_dir,
            database_url=f"sqlite:///{data_dir / 'visioncap.db'}",
            ask_frames=frames,
            ask_context_tokens=context_tokens,
        )
        with AsgiThread(create_app(settings), lifespan=True) as served:
            answers[frames, context_tokens] = client(served).chat.completions.create(
                model="visioncap-ask",
                messages=[{"role": "user", "content": "Show me the fox on the backyard camera"}],
                max_tokens=4,
            )
    contexts = {key: (answer.model_extra or {})["visioncap"] for key, answer in answers.items()}
    assert contexts[0, 4096]["frames"] == [] and contexts[1, 4096]["frames"] == [fox]
    assert all(context["retrieved"] == [fox] for context in contexts.values())
    counted = {key: answer.usage.prompt_tokens for key, answer in answers.items() if answer.usage is not None}
    image_tokens = round(640 / 28) * round(480 / 28)  # the processor's grid: 23 x 17
    estimate = image_tokens + IMAGE_PART_TOKENS + estimate_tokens(frame_label(fox))
    assert image_tokens <= counted[1, 4096] - counted[0, 4096] <= estimate
    # Two frames wanted, one found: it takes the whole budget, not half of it (it goes as it is, as with one).
    assert contexts[2, 4096]["frames"] == [fox] and counted[2, 4096] == counted[1, 4096]
    # A context with no room for the frame beside the caption: the caption still goes, the frame does not.
    assert contexts[1, 600]["frames"] == [] and [c["caption_id"] for c in contexts[1, 600]["citations"]] == [fox]
    assert counted[1, 600] == counted[0, 4096] <= 600 - 4


# -- auth and bounds: no VLM is reached (it sits at the discard port, where nothing answers) ----------------------


@pytest.fixture
def local_client(seeded: Seeded) -> Iterator[TestClient]:
    settings = settings_for(seeded, "http://127.0.0.1:9/v1", ask_max_messages=4, ask_max_message_chars=200)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def ask(test_client: TestClient, body: Any, key: str | None = READ_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return test_client.post("/v1/chat/completions", json=body, headers=headers)


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def test_a_read_key_may_ask_none_and_a_write_only_key_may_not(local_client: TestClient) -> None:
    body = {"model": "m", "messages": [user("Any giraffes on the driveway today?")]}
    assert ask(local_client, body, key=None).status_code == 401
    assert ask(local_client, body, key="not-a-key").status_code == 401
    refused = ask(local_client, body, key=WRITE_ONLY_KEY)
    assert refused.status_code == 403 and "'read'" in refused.json()["error"]["message"]
    assert ask(local_client, body).status_code == 200


def test_nothing_matched_answers_without_the_vlm(local_client: TestClient) -> None:
    """The VLM is unreachable here: an answer at all shows it was not asked."""
    answer = ask(local_client, {"model": "m", "messages": [user("What happened on the backyard camera today?")]})
    assert answer.status_code == 200
    body = answer.json()
    assert body["visioncap"]["retrieved"] == [] and body["visioncap"]["citations"] == []
    assert body["visioncap"]["cameras"] == ["backyard"]
    assert body["choices"][0]["message"]["content"].startswith("No stored captions match this question on backyard")
    stream = ask(local_client, {"model": "m", "messages": [user("Any giraffes today?")], "stream": True})
    assert stream.status_code == 200 and stream.text.endswith("data: [DONE]\n\n")
    # With something to answer from, the unreachable VLM is a 503 with Retry-After.
    failed = ask(local_client, {"model": "m", "messages": [user("Was there a courier yesterday?")]})
    assert failed.status_code == 503 and "Retry-After" in failed.headers


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": []}, "messages"),
        ({"messages": [user("hi")]}, "model"),
        ({"model": "m", "messages": [user("a")] * 5}, "messages"),
        ({"model": "m", "messages": [user("a" * 201)]}, "messages.0.content"),
        ({"model": "m", "messages": [user("hi"), {"role": "assistant", "content": "yes"}]}, "messages"),
        ({"model": "m", "messages": [user("   ")]}, "messages"),
        ({"model": "m", "messages": [user("hi\x00")]}, "messages.0.content"),
        ({"model": "m", "messages": [user("hi")], "max_tokens": 513}, "max_tokens"),
        ({"model": "m", "messages": [user("hi")], "temperature": 3}, "temperature"),
        ({"model": "m", "messages": [user("hi")], "temperature": False}, "temperature"),
        ({"model": "m", "messages": [user("hi")], "max_tokens": True}, "max_tokens"),
        ({"model": "m", "messages": [user("hi")], "stream": "true"}, "stream"),
        (
            {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
        ),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
    ],
)
def test_malformed_or_oversized_requests_are_422(local_client: TestClient, body: Any, param: str) -> None:
    refused = ask(local_client, body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"].startswith(param), refused.json()


def test_models_lists_the_ask_model(local_client: TestClient) -> None:
    listed = local_client.get("/v1/models", headers={"X-Api-Key": READ_KEY})
    assert listed.status_code == 200 and [model["id"] for model in listed.json()["data"]] == ["visioncap-ask"]
