"""The web page at `/` in real headless Chromium (Debian's `chromium`, driven by Playwright for Python).

`visioncap api` runs as a user starts it, over a real SQLite file written the way the pipeline writes it (the
outbox saves a real JPEG and a pending row, the caption follows). The browser enters the API key in the page's
key form, as a user does; the test checks the captions' text and thumbnails, the camera filter and the search box,
a caption stored after the page loaded arriving through the live stream without a reload (and none lost while
the page opens: it starts its stream before it loads its list), and that the page needs nothing but the API's own
origin (every other request is refused). Screenshots: test-artifacts/web-captions.png, web-ask.png.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from helpers import ARTIFACTS, CHROMIUM_FLAGS, TINY_MODEL, chromium, serve_api, wait_for
from PIL import Image, ImageDraw
from playwright.sync_api import Browser, Page, Response, Route, expect, sync_playwright
from sqlalchemy import text

from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.summaries import store as summary_store
from visioncap.summaries.store import Summary

KEY = "web-page-read-key"
TIMEOUT_S = 30  # a bound on a broken test, never a measurement
T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
SCREENSHOT = ARTIFACTS / "web-captions.png"
ASK_SCREENSHOT = ARTIFACTS / "web-ask.png"


@dataclass(frozen=True)
class Seeded:
    camera: str
    text: str
    width: int
    height: int
    zones: tuple[dict[str, object], ...] = ()


DOCK_DOOR = {"zone": "dock-door", "track_id": 1, "dwell_s": 75.4}
SEEDED = [
    Seeded("dock", "a courier wheels a trolley to the loading dock", 200, 150, (DOCK_DOOR,)),
    Seeded("lobby", "two visitors wait at the reception desk", 160, 120),
    Seeded("dock", "a forklift driver in a yellow vest reverses", 240, 135),
    Seeded("lobby", "a cyclist carries a bicycle through the lobby", 180, 120),
    Seeded("gate", "a woman with an umbrella walks through the gate", 200, 112),
]
LIVE = Seeded("gate", "a delivery van driver rings the bell at the gate", 220, 124)


def photo(index: int, width: int, height: int) -> bytes:
    """A real JPEG, different for each caption (a colour field with a figure), as the outbox stores frames."""
    image = Image.new("RGB", (width, height), (40 + 35 * index, 90, 160 - 20 * index))
    draw = ImageDraw.Draw(image)
    draw.rectangle((width // 3, height // 4, width // 2, height - 10), fill=(230, 200, 150))
    draw.ellipse((width // 3, height // 8, width // 2, height // 4 + 8), fill=(230, 200, 150))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue()


class Writer:
    """Stores captions as the pipeline does: the outbox saves the JPEG and a pending row, then the caption."""

    def __init__(self, data_dir: Path) -> None:
        self.store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
        self.store.create_schema()
        self.outbox = Outbox(self.store, data_dir, OutboxConfig(capacity=100), PipelineMetrics())

    def add(self, index: int, seeded: Seeded) -> int:
        new = NewCaption(
            pipeline="web",
            camera=seeded.camera,
            source=f"rtsp://cameras.local/{seeded.camera}",
            frame_index=index,
            offset_s=float(index),
            captured_at=T0 + timedelta(minutes=index),
            reason="new-event",
            people=[{"x1": 20.0, "y1": 10.0, "x2": 90.0, "y2": 110.0, "confidence": 0.9, "class_id": 0}],
            image_width=seeded.width,
            image_height=seeded.height,
            model="tiny",
            event_key=f"{seeded.camera}:{index}",
            frame_width=seeded.width,
            frame_height=seeded.height,
            zones=list(seeded.zones),
        )
        _, row_id = self.outbox.put(new, photo(index, seeded.width, seeded.height))
        assert row_id is not None
        self.store.mark_captioned(row_id, Caption(seeded.text, "tiny", 200, 12, 0.4), attempts=1)
        return row_id


def serve_data_dir(data_dir: Path, **env: str) -> AbstractContextManager[str]:
    """`visioncap api` over the SQLite file in `data_dir` (`env` added to its environment); its base URL."""
    database_url = f"sqlite:///{data_dir / 'visioncap.db'}"
    return serve_api(data_dir, database_url, KEY, VISIONCAP_API_STREAM_POLL_S="0.2", **env)


def seeded_writer(data_dir: Path) -> Writer:
    writer = Writer(data_dir)
    for index, seeded in enumerate(SEEDED):
        writer.add(index, seeded)
    return writer


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[str, Writer]]:
    """`visioncap api` over a seeded SQLite file; its base URL and the writer (to store more while it runs)."""
    writer = seeded_writer(tmp_path / "data")
    # Its background embedder writes the vectors of the rows above.
    with serve_data_dir(tmp_path / "data", VISIONCAP_API_SEMANTIC_SEARCH="true") as url:
        yield url, writer


@pytest.fixture
def browser() -> Iterator[Browser]:
    executable = chromium()
    with sync_playwright() as playwright:
        # Debian's Chromium, never a browser Playwright downloads; Playwright adds a fresh profile itself.
        launched = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def card_texts(page: Page) -> list[str]:
    return page.locator("article.card .text").all_inner_texts()


def test_web_page_shows_filters_and_follows_captions(site: tuple[str, Writer], browser: Browser) -> None:
    url, writer = site
    expect.set_options(timeout=TIMEOUT_S * 1000)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    foreign: list[str] = []
    requests: list[str] = []
    failures: list[str] = []

    def only_own_origin(route: Route) -> None:
        # Offline by design: anything but the API's own origin (a CDN, a font, an analytics call) is refused and
        # recorded, so a page that needed one would both break and fail here.
        request_url = route.request.url
        if request_url.startswith((f"{url}/", "blob:", "data:")):
            route.continue_()
        else:
            foreign.append(request_url)
            route.abort()

    context.route("**/*", only_own_origin)
    page = context.new_page()
    page.on("request", lambda request: requests.append(request.url))
    page.on("pageerror", lambda error: failures.append(f"page error: {error}"))
    page.on("console", lambda message: failures.append(message.text) if message.type == "error" else None)
    try:
        page.goto(url + "/")
        # No key yet: the page asks for one and shows no data.
        expect(page.locator("#status")).to_contain_text("API key")
        expect(page.locator("article.card")).to_have_count(0)

        # A user pastes a key into the key form.
        page.fill("#key", KEY)
        page.click("#keyform button[type=submit]")
        cards = page.locator("article.card")
        expect(cards).to_have_count(len(SEEDED))
        # Newest first, each with its caption and camera.
        assert card_texts(page) == [s.text for s in reversed(SEEDED)]
        assert page.locator("article.card .camera").all_inner_texts() == [s.camera for s in reversed(SEEDED)]
        assert set(page.locator("article.card .people").all_inner_texts()) == {"1 person"}
        expect(page.locator("#more")).to_be_hidden()  # one page holds them all
        # Thumbnails: every image decoded, at the size of the JPEG the outbox stored.
        page.wait_for_function(
            "() => [...document.querySelectorAll('article.card img')].every((i) => i.complete && i.naturalWidth > 0)"
        )
        sizes = page.eval_on_selector_all(
            "article.card img", "imgs => imgs.map((i) => [i.naturalWidth, i.naturalHeight])"
        )
        assert sizes == [[s.width, s.height] for s in reversed(SEEDED)]
        # The camera list comes from /v1/cameras, with each camera's stored rows.
        expect(page.locator("#camera option")).to_have_count(3)
        gate = page.locator("#camera option", has_text="gate")
        expect(gate).to_have_text(re.compile(r"^gate\b.*\(1\)$"))

        # Camera filter.
        page.select_option("#camera", "lobby")
        page.click("#filters button[type=submit]")
        expect(cards).to_have_count(2)
        assert set(page.locator("article.card .camera").all_inner_texts()) == {"lobby"}

        # Zone filter (camera cleared): the one frame with a person at the dock door, which says how long.
        page.select_option("#camera", [])
        page.fill("#zone", "dock-door")
        page.click("#filters button[type=submit]")
        expect(cards).to_have_count(1)
        assert card_texts(page) == [SEEDED[0].text]
        expect(cards.first.locator(".zones")).to_have_text("in dock-door 75 s")
        page.fill("#zone", "")

        # Search box (with the camera filter cleared): every word must match, the last also as a prefix.
        page.select_option("#camera", [])
        page.fill("#q", "fork")
        page.click("#filters button[type=submit]")
        expect(cards).to_have_count(1)
        assert card_texts(page) == [SEEDED[2].text]
        page.fill("#q", "gate")
        page.click("#filters button[type=submit]")
        expect(cards).to_have_count(1)
        assert card_texts(page) == [SEEDED[4].text]

        # Back to everything; then the pipeline stores a caption while the page is open.
        page.fill("#q", "")
        page.click("#filters button[type=submit]")
        expect(cards).to_have_count(len(SEEDED))  # the page loads its list once its stream has started
        page.evaluate("() => { window.__sameDocument = true; }")  # gone if the page reloads
        writer.add(len(SEEDED), LIVE)
        expect(cards).to_have_count(len(SEEDED) + 1)
        first = cards.first
        expect(first.locator(".text")).to_have_text(LIVE.text)
        expect(first).to_have_class("card new")
        assert page.evaluate("() => window.__sameDocument === true"), "the page reloaded instead of following"
        page.wait_for_function(
            "() => { const i = document.querySelector('article.card img'); return i.complete && i.naturalWidth > 0; }"
        )
        assert page.eval_on_selector("article.card img", "i => [i.naturalWidth, i.naturalHeight]") == [
            LIVE.width,
            LIVE.height,
        ]
        expect(page.locator("#status")).to_contain_text("live")
        # The live caption's camera count follows without a reload: the page reloads the list within 3 s of live
        # captions. The bound is below the page's 30 s timer, so only the live-caption reload passes in time.
        expect(gate).to_have_text(re.compile(r"^gate\b.*\(2\)$"), timeout=12_000)

        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT), full_page=True)
    finally:
        context.close()
    assert SCREENSHOT.stat().st_size > 0
    assert foreign == [], f"the page requested other origins: {foreign}"
    assert all(r.startswith((f"{url}/", "blob:", "data:")) for r in requests), requests
    assert failures == [], failures


def test_a_caption_stored_while_the_page_opens_is_shown_once(site: tuple[str, Writer], browser: Browser) -> None:
    """The page starts its stream, then loads its list: a caption stored before the stream's start is in the list,
    one stored after it comes by the stream (and is in the list too when stored before the list's query: shown once).

    The browser's requests are held while the test stores a caption, at the two moments a page that loaded its
    list first lost one (stored after the list's query and before the stream's start)."""
    url, writer = site
    at_stream = Seeded("dock", "a guard opens the dock shutter", 200, 150)
    at_list = Seeded("lobby", "a cleaner mops the lobby floor", 200, 150)
    stored: list[str] = []

    def store_then_continue(seeded: Seeded) -> Callable[[Route], None]:
        def handler(route: Route) -> None:
            if seeded.text not in stored:  # the first such request only
                stored.append(seeded.text)
                writer.add(len(SEEDED) + len(stored) - 1, seeded)
            route.continue_()

        return handler

    expect.set_options(timeout=TIMEOUT_S * 1000)
    context = browser.new_context()
    failures: list[str] = []
    page = context.new_page()
    page.route(re.compile(r"/v1/stream(\?|$)"), store_then_continue(at_stream))
    page.route(re.compile(r"/v1/captions(\?|$)"), store_then_continue(at_list))
    page.on("pageerror", lambda error: failures.append(f"page error: {error}"))
    try:
        page.goto(url + "/")
        page.fill("#key", KEY)
        page.click("#keyform button[type=submit]")
        cards = page.locator("article.card")
        # Stored before the list's query and after the stream's start: the stream sends it as well.
        expect(cards.filter(has_text=at_list.text)).to_have_class("card new")
        expect(cards).to_have_count(len(SEEDED) + 2)
        assert stored == [at_stream.text, at_list.text], "the page loaded its list before starting its stream"
        assert card_texts(page) == [at_list.text, at_stream.text] + [s.text for s in reversed(SEEDED)]
    finally:
        context.close()
    assert failures == [], failures


def test_markup_in_a_caption_shows_as_text_under_the_page_policy(site: tuple[str, Writer], browser: Browser) -> None:
    """A caption is model output: markup in it is text on the page, and the headers keep the browser strict."""
    url, writer = site
    hostile = Seeded("gate", "<img src=x onerror=alert(1)> a person at the <b>gate</b>", 200, 150)
    writer.add(len(SEEDED), hostile)
    for path, policy_start in (("/", "default-src 'self'"), ("/static/app.js", "default-src"), ("/v1/captions", "")):
        headers = httpx.get(url + path, headers={"authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S).headers
        assert headers["content-security-policy"].startswith(policy_start or "default-src 'self'")
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"
    page_policy = httpx.get(url + "/", timeout=TIMEOUT_S).headers["content-security-policy"]
    assert page_policy == "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'"
    assert httpx.get(url + "/v1/captions", timeout=TIMEOUT_S).headers["x-content-type-options"] == "nosniff"  # 401

    expect.set_options(timeout=TIMEOUT_S * 1000)
    context = browser.new_context()
    dialogs: list[str] = []
    failures: list[str] = []
    page = context.new_page()
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.on("response", lambda r: failures.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.on("pageerror", lambda error: failures.append(f"page error: {error}"))
    page.on("console", lambda message: failures.append(message.text) if message.type == "error" else None)
    try:
        page.goto(url + "/")
        page.fill("#key", KEY)
        page.click("#keyform button[type=submit]")
        cards = page.locator("article.card")
        expect(cards).to_have_count(len(SEEDED) + 1)
        expect(cards.first.locator(".text")).to_have_text(hostile.text)  # the markup, as characters
        assert page.locator("article.card .text img, article.card .text b").count() == 0
        assert page.evaluate("() => document.querySelectorAll('img[src=\"x\"]').length") == 0
    finally:
        context.close()
    assert dialogs == []
    assert failures == [], failures  # the page's own script, style and thumbnails need nothing the policy refuses


def test_search_switch_ranks_by_meaning(site: tuple[str, Writer], browser: Browser) -> None:
    """words / semantic / hybrid: "bike" is no word of any caption, but the cyclist's caption means it."""
    url, _ = site

    def caught_up() -> bool:
        ready = httpx.get(f"{url}/readyz", headers={"authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S).json()
        return "caught up" in ready["checks"]["semantic"]["detail"]

    wait_for(caught_up, TIMEOUT_S * 4, "the API's background embedder to write the seeded captions' vectors")
    expect.set_options(timeout=TIMEOUT_S * 1000)
    context = browser.new_context()
    page = context.new_page()
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    try:
        page.goto(url + "/")
        page.fill("#key", KEY)
        page.click("#keyform button[type=submit]")
        cards = page.locator("article.card")
        expect(cards).to_have_count(len(SEEDED))
        expect(page.locator("#mode")).to_be_visible()  # this server ranks by meaning: the switch is offered
        page.fill("#q", "bike")
        page.click("#filters button[type=submit]")
        expect(page.locator("#status")).to_have_text("0 captions shown")  # words: every word must match
        expect(cards).to_have_count(0)
        for mode in ("semantic", "hybrid"):
            page.select_option("#mode", mode)  # the switch searches again by itself
            expect(cards).to_have_count(len(SEEDED))  # ranked: every caption, best first
            expect(cards.first.locator(".text")).to_have_text(SEEDED[3].text)
            assert any("semantic=bike" in r and ("hybrid=true" in r) == (mode == "hybrid") for r in requests)
            # Why it was found: its similarity to the search (and in hybrid the words it matched: none of "bike").
            expect(cards.first.locator(".why")).to_have_text(re.compile(r"^similarity 0\.\d\d$"))
        page.fill("#q", "bicycle lobby")
        page.click("#filters button[type=submit]")
        expect(cards.first.locator(".text")).to_have_text(SEEDED[3].text)
        expect(cards.first.locator(".why")).to_have_text(
            re.compile(r"^similarity 0\.\d\d · matched “bicycle”, “lobby”$")
        )
    finally:
        context.close()


def test_ask_panel_streams_an_answer_with_the_cited_thumbnails(
    tmp_path: Path, browser: Browser, vllm_server: VllmServer
) -> None:
    """The Ask panel: the question goes to POST /v1/chat/completions (the real vLLM answers), the cited caption
    (the one at the dock camera about a courier: camera and words) shows as its thumbnail, which opens the image,
    and the answer's text streams in under it."""
    writer = seeded_writer(tmp_path / "data")
    writer.store.engine.dispose()  # the rows are written; nothing more is stored while the API runs
    env = {
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        "VISIONCAP_ASK_MODEL": TINY_MODEL,
        "VISIONCAP_ASK_MAX_TOKENS": "24",
    }
    with serve_data_dir(tmp_path / "data", **env) as url:
        context = browser.new_context(viewport={"width": 1100, "height": 800})
        try:
            page = context.new_page()
            page.goto(f"{url}/#key={KEY}")
            expect(page.locator("article.card")).to_have_count(len(SEEDED))
            page.fill("#question", "Was there a courier at the loading dock?")
            page.click("#askform button")
            expect(page.locator("#ask")).to_have_attribute("data-state", "answered", timeout=60_000)
            citations = page.locator("#citations a.citation")
            expect(citations).to_have_count(1)
            expect(citations.first).to_have_attribute("title", SEEDED[0].text)
            page.wait_for_function(
                "() => { const i = document.querySelector('#citations img'); return i.complete && i.naturalWidth > 0; }"
            )
            assert page.eval_on_selector("#citations img", "i => [i.naturalWidth, i.naturalHeight]") == [
                SEEDED[0].width,
                SEEDED[0].height,
            ]
            href = citations.first.get_attribute("href")
            assert href is not None and href.startswith("blob:")  # the full image, fetched with the key
            with context.expect_page() as opened:
                citations.first.click()
            assert opened.value.url == href
            assert page.locator("#answer").inner_text().strip()  # the VLM's (random) words arrived
            ASK_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ASK_SCREENSHOT), full_page=True)
        finally:
            context.close()
    assert ASK_SCREENSHOT.stat().st_size > 0


SUMMARIES_SCREENSHOT = ARTIFACTS / "web-summaries.png"
WRITE_KEY = "web-page-write-key"


def test_summaries_page_links_the_citations_and_asks_the_vlm_for_one(
    tmp_path: Path, browser: Browser, vllm_server: VllmServer
) -> None:
    """#/summaries lists a stored digest with its kept citations as links to their captions (an id the server did
    not keep stays text, whatever the model wrote); a read key sees no form; a write key asks for a summary of a
    window, which the real vLLM writes and the list then shows."""
    writer = seeded_writer(tmp_path / "data")
    engine = writer.store.engine
    with engine.connect() as conn:
        dock = [
            row_id
            for row_id, camera in conn.execute(text("SELECT id, camera FROM captions ORDER BY id"))
            if camera == "dock"
        ]
    summary_store.ensure_table(engine)
    digest = Summary(
        kind="hourly",
        cameras=("dock",),
        window_start=T0,
        window_end=T0 + timedelta(hours=1),
        text=f"A courier wheeled a trolley in (c{dock[0]}), then a forklift reversed (c{dock[1]}); c999999 is made up.",
        citations=(dock[0], dock[1]),
        caption_count=2,
        depth=1,
        requests=1,
        max_prompt_tokens=120,
        model=TINY_MODEL,
    )
    assert summary_store.add_summary(engine, digest, None) is not None
    engine.dispose()
    keys = [
        {"name": "reader", "sha256": hash_key(KEY), "scopes": ["read"]},
        {"name": "writer", "sha256": hash_key(WRITE_KEY), "scopes": ["read", "write"]},
    ]
    env = {
        "VISIONCAP_API_KEYS": json.dumps(keys),
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
        "VISIONCAP_SUMMARIES_MODEL": TINY_MODEL,
        "VISIONCAP_SUMMARIES_CONFIG": json.dumps({"context_tokens": 4096, "max_tokens": 24, "time_zone": "UTC"}),
    }
    with serve_data_dir(tmp_path / "data", **env) as url:
        context = browser.new_context(viewport={"width": 1100, "height": 800}, timezone_id="UTC")
        try:
            page = context.new_page()
            page.goto(f"{url}/#key={KEY}")
            expect(page.locator("article.card")).to_have_count(len(SEEDED))
            page.click("a[data-nav=summaries]")
            items = page.locator("#summary-list li.summary-item")
            expect(items).to_have_count(1)
            expect(page.locator("#summary-form")).to_be_hidden()
            links = items.first.locator("a.cite")
            expect(links).to_have_count(2)
            assert [links.nth(n).get_attribute("href") for n in range(2)] == [f"#/captions/{i}" for i in dock[:2]]
            expect(items.first.locator(".summary-text")).to_contain_text("c999999 is made up")
            links.first.click()
            expect(page.locator("[data-view=detail]")).to_contain_text(SEEDED[0].text)
            # A write key, entered in the key form: the form, and a summary of the dock's first hour by the VLM.
            page.click("a[data-nav=summaries]")
            page.fill("#key", WRITE_KEY)

            def listed(response: Response) -> bool:
                return response.request.method == "GET" and response.url.split("?")[0].endswith("/v1/summaries")

            with page.expect_response(listed):  # the view loaded again with the new key: cameras, then the list
                page.press("#key", "Enter")
            expect(page.locator("#summary-form")).to_be_visible()
            page.select_option("#summary-cameras", ["dock"])
            page.fill("#summary-start", T0.strftime("%Y-%m-%dT%H:%M"))
            page.fill("#summary-end", (T0 + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"))
            page.click("#summary-submit")
            expect(items).to_have_count(2, timeout=60_000)
            newest = items.first
            expect(newest.locator(".badge")).to_have_text("request")
            expect(newest).to_contain_text("2 captions read")
            SUMMARIES_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SUMMARIES_SCREENSHOT), full_page=True)
        finally:
            context.close()
