"""The web app's views in real headless Chromium against `visioncap api` over a seeded SQLite store
(tests/web_app_support.py): a caption's detail, a camera's timeline, the cameras, the alerts, addresses that
survive a reload, the semantic switch only where the server has semantic search, and readable errors for a key
limited to one camera. Screenshots: test-artifacts/web-*.png."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, expect
from web_app_support import (
    DAY,
    DOCK_DAY,
    DOCK_FPS,
    FAILED_ERROR,
    HANDOVER_REASON,
    LOBBY_KEY,
    NO_PARCEL,
    READ_KEY,
    RULE_NAMES,
    SHOTS,
    T0,
    TIMEOUT_MS,
    VLM_ERROR,
    WRITE_KEY,
    Site,
    launched_browser,
    photo,
    screenshot,
    seeded_site,
    signed_in,
    watched,
)

from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption, SelectionReason
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.serve import VllmServer
from visioncap.store import NewCaption

pytestmark = pytest.mark.browser

DASH = "\u2013"  # between the ends of the range the timeline shows

# The query parameters each route the page calls declares (the API answers 422 to any other).
DECLARED = {
    "/v1/captions": {"camera", "since", "until", "q", "min_people", "status", "limit", "cursor", "semantic", "hybrid"},
    "/v1/alerts": {"rule", "camera", "since", "until", "state", "limit", "cursor"},
    "/v1/alerts/decisions": {"rule", "camera", "answer", "caption_id", "limit", "before"},
    "/v1/stream": {"camera", "min_people"},
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, vllm_server: VllmServer) -> Iterator[Site]:
    with seeded_site(tmp_path_factory.mktemp("web-app"), vllm_server.base_url) as seeded:
        yield seeded


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launched_browser() as launched:
        yield launched


def api_get(site: Site, path: str, key: str = READ_KEY) -> httpx.Response:
    return httpx.get(site.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT_MS / 1000)


def only_declared(requests: list[str]) -> None:
    for url in requests:
        parts = urlsplit(url)
        path = re.sub(r"/\d+(/|$)", r"/{id}\1", parts.path)
        names = {name for name, _ in parse_qsl(parts.query)}
        allowed = DECLARED.get(path, {"boxes", "frame"} if path == "/v1/captions/{id}/image" else set())
        assert names <= allowed, f"{url} sends {names - allowed}, which {path} does not declare"


def test_caption_detail_opens_from_a_card_and_survives_a_reload(site: Site, browser: Browser) -> None:
    """A card opens the caption: the frame with its people drawn, its fields, its structured fields, the other
    captions of its event; the link copies; back and reload keep the address's view. A read key gets no
    re-caption button."""
    handed = SHOTS[2]
    shown = site.id_of(handed.text or "")
    seen = signed_in(browser, site.url, READ_KEY, permissions=["clipboard-read", "clipboard-write"])
    page = seen.page
    try:
        expect(page.locator("article.card")).to_have_count(len(SHOTS))
        page.locator(f'article.card[data-id="{shown}"] a').click()
        expect(page).to_have_url(f"{site.url}/#/captions/{shown}")
        heading = page.locator("#detail-heading")
        expect(heading).to_have_text(f"Caption {shown} · dock")
        expect(heading).to_be_focused()  # a screen reader starts at the new view
        expect(page.locator("#detail-text")).to_have_text(handed.text or "")
        page.wait_for_function(
            "() => { const i = document.getElementById('detail-image'); return i && i.complete && i.naturalWidth > 0; }"
        )
        assert page.eval_on_selector("#detail-image", "i => [i.naturalWidth, i.naturalHeight]") == list(handed.size)
        # The server drew the two people (green outlines at the boxes' left edges, x = 40 and 110).
        edge = page.evaluate(
            """() => { const i = document.getElementById('detail-image'); const c = document.createElement('canvas');
            c.width = i.naturalWidth; c.height = i.naturalHeight; const g = c.getContext('2d'); g.drawImage(i, 0, 0);
            return [40, 110].map((x) => Array.from(g.getImageData(x, 140, 1, 1).data.slice(0, 3))); }"""
        )
        for red, green, blue in edge:
            assert green > 180 and red < 90 and blue < 90, edge
        fields = page.locator("dl.fields").first
        expect(fields).to_contain_text("2 people")
        expect(fields).to_contain_text("dock:courier")
        expect(fields).to_contain_text("new-event")
        structured = page.locator("dl.structured")
        expect(structured).to_contain_text("handing over a parcel, signing")
        expect(structured).to_contain_text("yellow vest, blue cap")
        event = page.locator("#detail-event li")
        courier = [s for s in SHOTS if s.event == "dock:courier"]
        expect(event).to_have_count(len(courier))
        expect(event.locator(".event-text")).to_have_text([s.text or "" for s in courier])  # oldest first
        expect(page.locator('#detail-event a[aria-current="page"]')).to_contain_text(handed.text or "")
        expect(page.locator("#detail-recaption")).to_have_count(0)  # a read key cannot

        page.click("#detail-copy")
        expect(page.locator("#detail-status")).to_have_text("Link copied to the clipboard.")
        assert page.evaluate("() => navigator.clipboard.readText()") == f"{site.url}/#/captions/{shown}"
        screenshot(page, "web-detail.png")

        # Another caption of the event, then back, then a reload: the address decides the view each time.
        first = site.id_of(courier[0].text or "")
        event.first.locator("a").click()
        expect(page).to_have_url(f"{site.url}/#/captions/{first}")
        expect(page.locator("#detail-text")).to_have_text(courier[0].text or "")
        page.go_back()
        expect(page.locator("#detail-text")).to_have_text(handed.text or "")
        page.reload()
        expect(page.locator("#detail-heading")).to_have_text(f"Caption {shown} · dock")
        expect(page.locator("#detail-text")).to_have_text(handed.text or "")
        expect(page.locator("#detail-event li")).to_have_count(len(courier))
        page.click('nav a[data-nav="captions"]')
        expect(page.locator("article.card")).to_have_count(len(SHOTS))
    finally:
        seen.context.close()
    assert seen.errors == []
    assert seen.refused == []
    only_declared(seen.requests)


def test_a_shared_link_opens_once_a_key_is_given_and_a_write_key_recaptions(site: Site, browser: Browser) -> None:
    """A caption's address opened in a fresh browser asks for a key, then shows the caption; a write key queues
    it for a new caption (the API says pending), and a second try is refused with the API's reason."""
    lobby = SHOTS[4]
    shown = site.id_of(lobby.text or "")
    seen = watched(browser)
    page = seen.page
    try:
        page.goto(f"{site.url}/#/captions/{shown}")
        expect(page.locator("#detail-status")).to_contain_text("Enter an API key")
        page.fill("#key", WRITE_KEY)
        page.click("#keyform button[type=submit]")
        expect(page.locator("#detail-text")).to_have_text(lobby.text or "")
        page.click("#detail-recaption")
        expect(page.locator("#detail-status")).to_contain_text("Queued for a new caption")
        expect(page.locator("dl.fields .badge")).to_have_text("pending")
        assert api_get(site, f"/v1/captions/{shown}").json()["status"] == "pending"
        page.reload()
        expect(page.locator("#detail-text")).to_have_text("(pending: no caption yet)")
        page.click("#detail-recaption")
        expect(page.locator("#detail-status")).to_have_text(re.compile(r"^Not done: .*pending"))
        expect(page.locator("#detail-status")).to_have_class("status error")
    finally:
        seen.context.close()
    assert seen.errors == ["Failed to load resource: the server responded with a status of 409 (Conflict)"]
    assert seen.refused == [f"409 v1/captions/{shown}/regenerate"]


def test_timeline_marks_a_cameras_day_zooms_and_opens_a_caption(site: Site, browser: Browser) -> None:
    seen = signed_in(browser, site.url, READ_KEY)
    page = seen.page
    try:
        expect(page.locator("article.card")).to_have_count(len(SHOTS))
        page.click('nav a[data-nav="timeline"]')
        # No camera or day asked for: the camera captioned last, on the day of its newest caption.
        expect(page).to_have_url(f"{site.url}/#/timeline/dock?day={DAY}")
        marks = page.locator("#timeline-marks a.mark")
        expect(marks).to_have_count(len(DOCK_DAY))  # not the caption of the night before
        rng = page.locator("#timeline-range")
        expect(rng).to_have_text(f"00:00{DASH}24:00 · {len(DOCK_DAY)} of {len(DOCK_DAY)} captions in view")
        lefts = page.eval_on_selector_all("#timeline-marks a.mark", "ms => ms.map((m) => parseFloat(m.style.left))")
        midnight = DOCK_DAY[0].at.replace(hour=0, minute=0)
        assert lefts == pytest.approx([(s.at - midnight).total_seconds() / 864 for s in DOCK_DAY], abs=0.01)

        page.click("#timeline-zoom-in")  # twice as close, around the middle of the day
        expect(rng).to_have_text(f"06:00{DASH}18:00 · 4 of {len(DOCK_DAY)} captions in view")
        page.click("#timeline-zoom-in")
        expect(rng).to_have_text(f"09:00{DASH}15:00 · 1 of {len(DOCK_DAY)} captions in view")
        expect(marks).to_have_count(1)
        page.click("#timeline-earlier")
        expect(rng).to_have_text(f"06:00{DASH}12:00 · 3 of {len(DOCK_DAY)} captions in view")
        expect(page.locator("#timeline-list li")).to_have_count(3)
        expect(page.locator("#timeline-list li").first).to_contain_text(DOCK_DAY[0].text or "")
        marks.nth(1).focus()
        expect(page.locator("#timeline-preview")).to_contain_text(DOCK_DAY[1].text or "")
        screenshot(page, "web-timeline.png")

        page.keyboard.press("Enter")  # the focused mark (at this zoom the marks a minute apart overlap)
        expect(page).to_have_url(f"{site.url}/#/captions/{site.id_of(DOCK_DAY[1].text or '')}")
        expect(page.locator("#detail-text")).to_have_text(DOCK_DAY[1].text or "")
        page.go_back()
        expect(rng).to_have_text(f"06:00{DASH}12:00 · 3 of {len(DOCK_DAY)} captions in view")  # as it was left

        page.click("#timeline-prev")
        expect(page).to_have_url(f"{site.url}/#/timeline/dock?day=2026-11-28")
        expect(marks).to_have_count(1)
        page.reload()
        expect(page.locator("#timeline-day")).to_have_value("2026-11-28")
        expect(marks).to_have_count(1)
        expect(marks.first).to_have_attribute("aria-label", re.compile(re.escape(SHOTS[0].text or "")))
        page.select_option("#timeline-camera", "gate")
        expect(page).to_have_url(f"{site.url}/#/timeline/gate?day=2026-11-28")
        expect(page.locator("#timeline-status")).to_have_text("No captions on this day.")
        page.click("#timeline-next")
        expect(marks).to_have_count(2)
        expect(page.locator("#timeline-marks a.mark-pending")).to_have_count(1)  # waiting for the VLM
    finally:
        seen.context.close()
    assert seen.errors == []
    assert seen.refused == []
    only_declared(seen.requests)


def test_cameras_page_shows_state_rate_people_and_last_caption(site: Site, browser: Browser) -> None:
    seen = signed_in(browser, site.url, READ_KEY)
    page = seen.page
    try:
        page.click('nav a[data-nav="cameras"]')
        expect(page).to_have_url(f"{site.url}/#/cameras")
        rows = page.locator("#cameras-rows tr")
        expect(rows).to_have_count(3)
        dock, gate, lobby = (
            page.locator(f'#cameras-rows tr[data-camera="{name}"]') for name in ("dock", "gate", "lobby")
        )
        expect(dock.locator(".badge")).to_have_text("online")
        expect(dock.locator(".fps")).to_have_text(f"{DOCK_FPS} fps")
        expect(dock.locator(".people-now")).to_have_text("1")
        expect(dock.locator(".last-caption a")).to_contain_text(SHOTS[-1].text or "")
        expect(lobby.locator(".badge")).to_have_text("offline")
        expect(lobby).to_contain_text("connection refused")
        expect(lobby.locator(".fps")).to_have_text("—")
        # gate: nobody reported it; its newest row (three people) waits for its caption, the one before is shown.
        expect(gate.locator(".badge")).to_have_text("unknown")
        expect(gate.locator(".people-now")).to_have_text("3")
        expect(gate.locator(".last-caption a")).to_have_text(re.compile(re.escape(SHOTS[6].text or "")))
        expect(page.locator("#cameras-rows button")).to_have_count(0)  # a read key cannot pause
        screenshot(page, "web-cameras.png")
        gate.locator(".last-caption a").click()
        expect(page.locator("#detail-text")).to_have_text(SHOTS[6].text or "")
    finally:
        seen.context.close()
    assert seen.errors == []
    assert seen.refused == []
    only_declared(seen.requests)

    seen = signed_in(browser, site.url, WRITE_KEY, path="/#/cameras")
    page = seen.page
    try:
        dock = page.locator('#cameras-rows tr[data-camera="dock"]')
        expect(page.locator('#cameras-rows tr[data-camera="gate"]')).to_contain_text("not configured here")
        dock.get_by_role("button", name="Pause dock").click()
        expect(dock.locator(".badge")).to_have_text("paused")
        expect(page.locator("#cameras-status")).to_contain_text("dock is paused")
        dock_config = next(c for c in api_get(site, "/v1/cameras").json()["items"] if c["camera"] == "dock")["config"]
        assert dock_config["paused"] is True
        dock.get_by_role("button", name="Resume dock").click()
        expect(dock.locator(".badge")).to_have_text("online")
        dock_config = next(c for c in api_get(site, "/v1/cameras").json()["items"] if c["camera"] == "dock")["config"]
        assert dock_config["paused"] is False
    finally:
        seen.context.close()
    assert seen.errors == []
    assert seen.refused == []


def test_alerts_page_lists_rules_and_what_fired_with_delivery_states(site: Site, browser: Browser) -> None:
    fired = sum(len(ids) for ids in site.alerts.values())
    assert set(site.alerts) == {"courier", "crowd", "handover", "forklift"}  # trolley said no, van got no answer
    seen = signed_in(browser, site.url, READ_KEY)
    page = seen.page
    try:
        page.click('nav a[data-nav="alerts"]')
        rules = page.locator("#alert-rules tr")
        expect(rules.locator("th")).to_have_text(RULE_NAMES)
        courier, crowd, handover, forklift = (
            page.locator(f'#alert-rules tr[data-rule="{name}"]')
            for name in ("courier", "crowd", "handover", "forklift")
        )
        expect(courier).to_contain_text("any of “courier”")
        expect(courier.locator(".badge")).to_have_text("alerts file")
        expect(crowd).to_contain_text("at least 2 people")
        expect(handover.locator(".rule-question")).to_have_text(
            "and the VLM answers yes to “a parcel changes hands” (up to 2 frames)"
        )
        expect(courier.locator(".rule-question")).to_have_count(0)
        expect(forklift.locator("td").first).to_have_text("dock")
        expect(forklift.locator(".badge")).to_have_text("API")

        items = page.locator("#alert-list > li")
        expect(items).to_have_count(fired)
        expect(page.locator("#alerts-status")).to_have_text(f"{fired} alerts shown")
        failed = page.locator("#alert-list li.delivery-failed")
        expect(failed).to_have_count(1)
        expect(failed).to_contain_text(FAILED_ERROR)
        expect(failed).to_contain_text("20 attempts")
        expect(page.locator("#alert-list li.delivery-delivered")).to_have_count(1)
        # Only the watch rule's alert carries the VLM's reason.
        reasons = page.locator("#alert-list .alert-reason")
        expect(reasons).to_have_text([f"VLM: “a parcel changes hands”: {HANDOVER_REASON}"])

        # Every question the watch rules asked, newest first: the error in words, the match marked as fired.
        answers = page.locator("#alert-answers tr")
        expect(answers).to_have_count(3)
        expect(answers.locator(".badge")).to_have_text(["no answer", "match", "no match"])
        expect(answers.locator("th")).to_have_text(["van", "handover", "trolley"])
        expect(answers.nth(0)).to_contain_text(VLM_ERROR)
        expect(answers.nth(1)).to_contain_text(HANDOVER_REASON)
        expect(answers.nth(1)).to_contain_text("fired")
        expect(answers.nth(1)).to_contain_text(re.compile(r"\d+ ms · \d+ \+ \d+ tokens"))
        expect(answers.nth(2)).not_to_contain_text("fired")
        screenshot(page, "web-alerts.png")
        page.select_option("#answers-answer", "error")
        expect(answers).to_have_count(1)
        expect(answers.locator(".badge")).to_have_text(["no answer"])
        page.select_option("#answers-answer", "")
        expect(answers).to_have_count(3)
        # From an answer to its caption, whose page lists what the watch rules said about it.
        answers.nth(1).locator("a").click()
        handed = site.id_of(SHOTS[2].text or "")
        expect(page).to_have_url(f"{site.url}/#/captions/{handed}")
        asked = page.locator("#detail-asked li")
        expect(page.locator("#detail-asked-panel")).to_be_visible()
        expect(asked).to_have_count(1)
        expect(asked).to_contain_text(HANDOVER_REASON)
        expect(asked.locator(".badge")).to_have_text("match")
        page.go_back()
        expect(page.locator("#alert-answers tr")).to_have_count(3)

        page.select_option("#alerts-state", "failed")
        expect(items).to_have_count(1)
        expect(items.first.locator(".rule-name")).to_have_text("courier")
        page.select_option("#alerts-state", "")
        page.select_option("#alerts-rule", "forklift")
        expect(items).to_have_count(1)
        expect(answers).to_have_count(0)  # the rule filter applies to the answers too
        expect(page.locator("#alert-answers-note")).to_have_text("No question asked yet (with these filters).")
        items.first.locator("a.alert-caption").click()
        expect(page).to_have_url(f"{site.url}/#/captions/{site.alerts['forklift'][0]}")
        expect(page.locator("#detail-text")).to_have_text(SHOTS[-1].text or "")
    finally:
        seen.context.close()
    assert seen.errors == []
    assert seen.refused == []
    only_declared(seen.requests)
    assert any("state=failed" in url for url in seen.requests)
    assert any("/v1/alerts/decisions?" in url and "rule=forklift" in url for url in seen.requests)


def test_a_write_key_adds_changes_and_deletes_a_watch_rule_from_the_page(site: Site, browser: Browser) -> None:
    seen = signed_in(browser, site.url, WRITE_KEY, path="/#/alerts")
    page = seen.page
    page.on("dialog", lambda dialog: dialog.accept())  # the delete button's "Delete rule ...?"
    try:
        form = page.locator("#rule-form")
        expect(form).to_be_visible()
        expect(page.locator("#rule-cameras option")).to_have_text(["dock", "gate", "lobby"])  # /v1/cameras
        # Refused by the API: said next to the form with the field at fault, nothing added.
        page.fill("#rule-name", "ladder")
        page.fill("#rule-question", "someone climbs the fence")
        page.fill("#rule-frames", "2")
        page.fill("#rule-min-people", "-3")
        page.evaluate("document.getElementById('rule-min-people').removeAttribute('min')")  # as a script could
        page.click("#rule-submit")
        expect(page.locator("#rule-form-status")).to_contain_text("field: min_people")
        expect(page.locator("#alert-rules tr")).to_have_count(len(RULE_NAMES))

        page.fill("#rule-min-people", "1")
        page.select_option("#rule-cameras", ["dock"])
        page.fill("#rule-words", "fence, ladder")
        page.fill("#rule-cooldown", "60")
        page.click("#rule-submit")
        expect(page.locator("#rule-form-status")).to_contain_text("Rule ladder added")
        row = page.locator('#alert-rules tr[data-rule="ladder"]')
        expect(row.locator(".rule-question")).to_have_text(
            "and the VLM answers yes to “someone climbs the fence” (up to 2 frames)"
        )
        expect(row).to_contain_text("any of “fence”, “ladder”; at least 1 person")
        expect(row.locator("td").first).to_have_text("dock")
        expect(page.locator("#rule-name")).to_have_value("")  # the form is cleared for the next
        screenshot(page, "web-alerts-rule-form.png")
        stored = api_get(site, "/v1/alerts/rules").json()["items"]
        [ladder] = [item["rule"] for item in stored if item["rule"]["name"] == "ladder"]
        assert (ladder["verify"]["question"], ladder["verify"]["max_frames"], ladder["cooldown_s"]) == (
            "someone climbs the fence",
            2,
            60,
        )
        # Changed from the page: the form holds the rule; what it empties is cleared, what it has not is kept.
        row.locator(".rule-edit").click()
        expect(page.locator("#rule-form-heading")).to_have_text("Change rule ladder")
        expect(page.locator("#rule-name")).to_have_value("ladder")
        expect(page.locator("#rule-question")).to_have_value("someone climbs the fence")
        expect(page.locator("#rule-words")).to_have_value("fence, ladder")
        page.fill("#rule-question", "someone cuts the fence")
        page.fill("#rule-min-people", "")
        page.fill("#rule-frames", "3")
        page.click("#rule-submit")
        expect(page.locator("#rule-form-status")).to_contain_text("Rule ladder changed")
        expect(row.locator(".rule-question")).to_have_text(
            "and the VLM answers yes to “someone cuts the fence” (up to 3 frames)"
        )
        expect(row).not_to_contain_text("at least")
        expect(page.locator("#rule-form-heading")).to_have_text("Add a rule")
        stored = api_get(site, "/v1/alerts/rules").json()["items"]
        [ladder] = [item["rule"] for item in stored if item["rule"]["name"] == "ladder"]
        assert (ladder["words"], ladder["min_people"], ladder["cameras"], ladder["cooldown_s"]) == (
            ["fence", "ladder"],
            None,
            ["dock"],
            60,
        )
        assert (ladder["verify"]["question"], ladder["verify"]["max_frames"]) == ("someone cuts the fence", 3)
        # The alerts file's rules cannot be changed or deleted here; the API's can.
        expect(page.locator('#alert-rules tr[data-rule="courier"] .rule-edit')).to_have_count(0)
        expect(page.locator('#alert-rules tr[data-rule="courier"] .rule-delete')).to_have_count(0)
        row.locator(".rule-delete").click()
        expect(row).to_have_count(0)
        expect(page.locator("#alerts-status")).to_have_text("Rule ladder deleted.")
    finally:
        seen.context.close()
    assert [item["rule"]["name"] for item in api_get(site, "/v1/alerts/rules").json()["items"]] == RULE_NAMES
    assert seen.refused == ["422 v1/alerts/rules"]  # the refused rule, and nothing else
    assert [error for error in seen.errors if "status of 422" not in error] == []
    only_declared(seen.requests)


def _stored_rule(site: Site, name: str) -> dict[str, object]:
    items = api_get(site, "/v1/alerts/rules").json()["items"]
    [rule] = [item["rule"] for item in items if item["rule"]["name"] == name]
    return rule


def test_the_rule_form_sets_where_when_what_and_whom_to_tell(site: Site, browser: Browser) -> None:
    """Every condition of a rule, from the page: zones and a stay, times of day, activities, similarity, the
    question's pre-filter and deadline, the destinations (as the alerts file names them); changed, then cleared."""
    seen = signed_in(browser, site.url, WRITE_KEY, path="/#/alerts")
    page = seen.page
    try:
        expect(page.locator("#rule-notify option")).to_have_text(["ops", "archive"])  # the alerts file's
        expect(page.locator("#rule-notify-note")).to_have_text("None picked: every destination.")
        page.fill("#rule-name", "night-fence")
        page.fill("#rule-words", "fence")
        page.check("#rule-all-words")
        page.fill("#rule-question", "someone climbs the fence")
        page.fill("#rule-deadline", "12.5")
        page.click("#rule-more summary")
        page.fill("#rule-zones", "fence, back-door")
        page.fill("#rule-dwell", "60")
        page.fill("#rule-max-people", "3")
        page.fill("#rule-activities", "climbing")
        page.fill("#rule-semantic", "a person at the fence")
        page.fill("#rule-semantic-threshold", "0.4")
        page.fill("#rule-question-similarity", "0.25")
        page.select_option("#rule-notify", ["ops"])
        # A time that is no time stops the form in the browser: nothing is sent.
        page.fill("#rule-windows", "25:00-06:00")
        page.click("#rule-submit")
        assert page.evaluate("document.getElementById('rule-windows').validity.patternMismatch") is True
        page.fill("#rule-windows", f"22:00-06:00, 12:00 {DASH} 13:00")  # either dash, as the page writes them
        page.click("#rule-submit")
        expect(page.locator("#rule-form-status")).to_contain_text("Rule night-fence added")
        row = page.locator('#alert-rules tr[data-rule="night-fence"]')
        expect(row.locator("td").nth(1)).to_contain_text(
            "all of “fence”; about “a person at the fence” (similarity ≥ 0.4); at most 3 people; doing climbing; "
            f"between 22:00{DASH}06:00, 12:00{DASH}13:00; in fence or back-door for ≥ 60 s"
        )
        expect(row.locator(".rule-question")).to_have_text(
            "and the VLM answers yes to “someone climbs the fence” (up to 1 frame, if the caption is about it "
            "(similarity ≥ 0.25))"
        )
        expect(row.locator("td").nth(3)).to_have_text("ops")
        rule = _stored_rule(site, "night-fence")
        assert {key: rule[key] for key in ("words", "all_words", "zones", "min_dwell_s", "max_people")} == {
            "words": ["fence"],
            "all_words": True,
            "zones": ["fence", "back-door"],
            "min_dwell_s": 60,
            "max_people": 3,
        }
        assert rule["windows"] == [{"start": "22:00", "end": "06:00"}, {"start": "12:00", "end": "13:00"}]
        assert (rule["activities"], rule["semantic"], rule["notify"]) == (
            ["climbing"],
            {"text": "a person at the fence", "threshold": 0.4},
            ["ops"],
        )
        verify = rule["verify"]
        assert isinstance(verify, dict)
        assert (verify["min_similarity"], verify["deadline_s"], verify["max_frames"]) == (0.25, 12.5, 1)

        # Changed: the form opens with every condition of the rule; what it empties is cleared.
        row.locator(".rule-edit").click()
        expect(page.locator("#rule-more")).to_have_attribute("open", "")
        expect(page.locator("#rule-zones")).to_have_value("fence, back-door")
        expect(page.locator("#rule-windows")).to_have_value("22:00-06:00, 12:00-13:00")
        expect(page.locator("#rule-deadline")).to_have_value("12.5")
        expect(page.locator("#rule-all-words")).to_be_checked()
        page.fill("#rule-zones", "")
        page.fill("#rule-dwell", "")
        page.fill("#rule-windows", "23:00-05:00")
        page.fill("#rule-semantic", "")
        page.select_option("#rule-notify", [])
        page.click("#rule-submit")
        expect(page.locator("#rule-form-status")).to_contain_text("Rule night-fence changed")
        expect(row.locator("td").nth(3)).to_have_text("all destinations")
        rule = _stored_rule(site, "night-fence")
        assert (rule["zones"], rule["min_dwell_s"], rule["semantic"], rule["notify"]) == ([], None, None, [])
        assert rule["windows"] == [{"start": "23:00", "end": "05:00"}]
        assert (rule["activities"], rule["max_people"], rule["all_words"]) == (["climbing"], 3, True)
        verify = rule["verify"]
        assert isinstance(verify, dict)
        assert (verify["question"], verify["min_similarity"], verify["deadline_s"]) == (
            "someone climbs the fence",
            0.25,
            12.5,
        )
    finally:
        seen.context.close()
        httpx.delete(
            f"{site.url}/v1/alerts/rules/night-fence",
            headers={"Authorization": f"Bearer {WRITE_KEY}"},
            timeout=TIMEOUT_MS / 1000,
        )
    assert [item["rule"]["name"] for item in api_get(site, "/v1/alerts/rules").json()["items"]] == RULE_NAMES
    assert seen.refused == []
    assert seen.errors == []
    only_declared(seen.requests)


def test_a_read_key_sees_no_rule_form_nor_rule_buttons(site: Site, browser: Browser) -> None:
    seen = signed_in(browser, site.url, READ_KEY, path="/#/alerts")
    page = seen.page
    try:
        expect(page.locator("#alert-rules tr")).to_have_count(len(RULE_NAMES))
        expect(page.locator("#rule-form")).to_be_hidden()
        expect(page.locator(".rule-delete, .rule-edit")).to_have_count(0)
    finally:
        seen.context.close()


def test_a_caption_no_watch_rule_asked_about_has_no_answers_panel(site: Site, browser: Browser) -> None:
    seen = signed_in(browser, site.url, READ_KEY, path=f"/#/captions/{site.id_of(SHOTS[-1].text or '')}")
    page = seen.page
    try:
        expect(page.locator("#detail-text")).to_have_text(SHOTS[-1].text or "")
        panel = page.locator("#detail-asked-panel")
        expect(panel).to_have_attribute("data-answers", "0")  # asked, and none came back
        expect(panel).to_be_hidden()
    finally:
        seen.context.close()
    assert any("/v1/alerts/decisions?caption_id=" in url for url in seen.requests)
    assert seen.errors == []


def test_watch_rules_answers_filter_by_answer_and_caption(site: Site) -> None:
    def answers(query: str, key: str = READ_KEY) -> list[tuple[bool | None, str | None]]:
        page = api_get(site, f"/v1/alerts/decisions?{query}", key)
        assert page.status_code == 200, page.text
        return [(item["match"], item["reason"] or item["error"]) for item in page.json()["items"]]

    assert answers("answer=match") == [(True, HANDOVER_REASON)]
    assert answers("answer=no_match&answer=error") == [(None, VLM_ERROR), (False, NO_PARCEL)]
    assert answers(f"caption_id={site.id_of(SHOTS[1].text or '')}") == [(False, NO_PARCEL)]
    assert answers("rule=handover&answer=match&camera=dock") == [(True, HANDOVER_REASON)]
    assert answers("rule=trolley&answer=match") == []
    assert answers("answer=match", LOBBY_KEY) == []  # the dock's answers are not the lobby key's
    [alert] = [item for item in api_get(site, "/v1/alerts?rule=handover").json()["items"]]
    assert alert["verification"]["reason"] == HANDOVER_REASON
    assert all(item["verification"] is None for item in api_get(site, "/v1/alerts?rule=courier").json()["items"])


def test_semantic_switch_is_hidden_where_the_server_has_semantic_search_off(site: Site, browser: Browser) -> None:
    capabilities = api_get(site, "/v1/capabilities").json()
    assert capabilities == {"semantic_search": False, "max_page_size": 200, "scopes": ["read"], "cameras": None}
    seen = signed_in(browser, site.url, READ_KEY)
    page = seen.page
    try:
        expect(page.locator("article.card")).to_have_count(len(SHOTS))
        expect(page.locator("#mode")).to_be_hidden()
        page.fill("#q", "courier")
        page.click("#filters button[type=submit]")
        expect(page.locator("article.card")).to_have_count(3)
    finally:
        seen.context.close()
    assert seen.refused == []
    assert not [url for url in seen.requests if "semantic=" in url or "hybrid=" in url]
    assert any("/v1/captions?q=courier" in url for url in seen.requests)


def test_a_key_limited_to_one_camera_gets_readable_answers(site: Site, browser: Browser) -> None:
    """The lobby's key: another camera's caption is as unknown as one that does not exist, and the page says so
    in words; its pages show only the lobby. An unknown address and a wrong key are answered in words too."""
    capabilities = api_get(site, "/v1/capabilities", LOBBY_KEY).json()
    assert capabilities["cameras"] == ["lobby"]
    dock = site.id_of(SHOTS[1].text or "")
    seen = signed_in(browser, site.url, LOBBY_KEY, path=f"/#/captions/{dock}")
    page = seen.page
    try:
        status = page.locator("#detail-status")
        expect(status).to_have_text(f"Caption {dock} does not exist, or this key may not see its camera.")
        expect(status).to_have_class("status error")
        page.goto(f"{site.url}/#/cameras")
        expect(page.locator("#cameras-rows tr")).to_have_count(1)
        expect(page.locator('#cameras-rows tr[data-camera="lobby"]')).to_have_count(1)
        page.goto(f"{site.url}/#/timeline/dock")
        expect(page.locator("#timeline-status")).to_have_text("No camera named dock (or this key may not see it).")
        page.goto(f"{site.url}/#/alerts")
        expect(page.locator("#alert-rules tr")).to_have_count(0)  # every rule watches a camera not its own
        expect(page.locator("#alert-answers-note")).to_have_text("No question asked yet (with these filters).")
        page.goto(f"{site.url}/#/nowhere/at/all")
        expect(page.locator("#missing-heading")).to_be_visible()
        page.goto(f"{site.url}/#/cameras")
        page.fill("#key", "not-a-key")
        page.click("#keyform button[type=submit]")
        expect(page.locator("#cameras-status")).to_have_text(re.compile(r"^The API key was not accepted"))
    finally:
        seen.context.close()
    assert f"404 v1/captions/{dock}" in seen.refused
    assert {entry.split(" ")[0] for entry in seen.refused} <= {"401", "404"}


def test_an_event_description_shows_the_frames_it_was_written_from(
    tmp_path: Path, browser: Browser, vllm_server: VllmServer
) -> None:
    """A description (reason event-end) of the courier's event, written from three frames: its page shows them
    oldest first with what each was kept as, each image the API serves for it, and it is one of its event's."""
    roles = ["first", "best+zone:dock", "last"]
    frames = [
        {"role": role, "frame_index": 40 + n, "offset_s": 10.0 + 4 * n, "width": 160, "height": 120, "image_tokens": 30}
        for n, role in enumerate(roles)
    ]
    with seeded_site(tmp_path, vllm_server.base_url) as site:
        outbox = Outbox(site.store, tmp_path / "data", OutboxConfig(capacity=10), PipelineMetrics())
        new = NewCaption(
            pipeline="web",
            camera="dock",
            source="rtsp://cameras.local/dock",
            frame_index=42,
            offset_s=18.0,
            # A microsecond after the event's last frame (the courier walking back to the van), as the pipeline
            # stores a description.
            captured_at=T0 + timedelta(minutes=2, microseconds=1),
            reason=SelectionReason.EVENT_END,
            people=[{"x1": 40.0, "y1": 20.0, "x2": 90.0, "y2": 110.0, "confidence": 0.9, "class_id": 0}],
            image_width=160,
            image_height=120,
            frame_width=160,
            frame_height=120,
            model="tiny",
            event_key="dock:courier",
            frames=frames,
        )
        _, row = outbox.put(new, photo(30, 160, 120), [photo(31, 160, 120), None, photo(32, 160, 120)])
        assert row is not None
        text = "the courier walked from the gate to the dock, handed over a parcel and left"
        site.store.mark_captioned(row, Caption(text, "tiny", 400, 18, 0.9), attempts=1)
        seen = signed_in(browser, site.url, READ_KEY, path=f"/#/captions/{row}")
        page = seen.page
        try:
            expect(page.locator("#detail-text")).to_have_text(text)
            # A caption without structured fields has no such panel (it once showed as the text "null").
            loose = "() => [...document.getElementById('detail-body').childNodes].filter((n) => n.nodeType === 3)"
            assert page.evaluate(f"{loose}.map((n) => n.textContent)") == []
            shown = page.locator("#detail-frames li")
            expect(shown).to_have_count(3)
            expect(shown.locator("figcaption")).to_have_text(
                [
                    "first seen · 10.0 s · 30 tokens",
                    "best, entered dock · 14.0 s · 30 tokens",
                    "last seen · 18.0 s · 30 tokens",
                ]
            )
            # An <img> without a src yet is `complete` too (the page sets it once the keyed fetch is back): wait
            # for each to have one and to have decoded it.
            page.wait_for_function(
                "() => [...document.querySelectorAll('#detail-frames img')]"
                ".every((img) => img.getAttribute('src') && img.complete && img.naturalWidth > 0)"
            )
            widths = shown.locator("img").evaluate_all("(all) => all.map((img) => img.naturalWidth)")
            assert widths == [160, 160, 160]
            # The courier's three captions and this description, oldest first.
            expect(page.locator("#detail-event li")).to_have_count(4)
            expect(page.locator("#detail-event li").last).to_contain_text(text)
            screenshot(page, "web-event-description.png")
        finally:
            seen.context.close()
        assert seen.errors == [] and seen.refused == []
        only_declared(seen.requests)
        assert any(f"/v1/captions/{row}/image?frame=2" in url for url in seen.requests)
