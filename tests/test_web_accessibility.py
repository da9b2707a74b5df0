"""Accessibility of every view of the web app: axe-core (from npm, test-artifacts/axe; `make web-test-deps`) run
in the same headless Chromium over each view as an operator with a write key sees it, against `visioncap api` over
the seeded store of tests/web_app_support.py. A serious or critical violation fails the test, named with the nodes
it found. Screenshots: test-artifacts/web-a11y-*.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect
from web_app_support import SHOTS, WRITE_KEY, Site, axe_source, launched_browser, screenshot, seeded_site, signed_in

from visioncap.serve import VllmServer

pytestmark = pytest.mark.browser

BLOCKING = ("serious", "critical")


@pytest.fixture
def browser() -> Iterator[Browser]:
    with launched_browser() as launched:
        yield launched


def violations(page: Page, source: str) -> list[str]:
    # Evaluated through the DevTools protocol: the page's own policy (script-src 'self') stays as it is.
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(source)
    found = page.evaluate(
        "async () => (await axe.run(document, { resultTypes: ['violations'] })).violations"
        ".map((v) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n) => n.target.join(' ')) }))"
    )
    return [
        f"{v['impact']}: {v['id']} ({v['help']}) at {', '.join(v['nodes'][:5])}"
        for v in found
        if v["impact"] in BLOCKING
    ]


def test_every_view_has_no_serious_accessibility_violation(
    tmp_path: Path, browser: Browser, vllm_server: VllmServer
) -> None:
    source = axe_source()
    with seeded_site(tmp_path, vllm_server.base_url) as site:
        found = check_views(site, browser, source)
    assert found == {}, found


def check_views(site: Site, browser: Browser, source: str) -> dict[str, list[str]]:
    seen = signed_in(browser, site.url, WRITE_KEY)
    page = seen.page
    found: dict[str, list[str]] = {}
    detail = site.id_of(SHOTS[2].text or "")
    views = [
        ("captions", "/#/", "article.card img[src^='blob:']"),
        ("detail", f"/#/captions/{detail}", "#detail-event li img[src^='blob:']"),
        ("timeline", "/#/timeline/dock?day=2026-11-29", "#timeline-marks a.mark"),
        ("cameras", "/#/cameras", "#cameras-rows tr button"),
        ("alerts", "/#/alerts", "#alert-list li.delivery-failed"),
        ("summaries", "/#/summaries", "#summary-form #summary-submit"),
    ]
    try:
        expect(page.locator("article.card")).to_have_count(len(SHOTS))
        for name, path, ready in views:
            page.goto(site.url + path)
            expect(page.locator(ready).first).to_be_visible()
            problems = violations(page, source)
            if problems:
                found[name] = problems
            screenshot(page, f"web-a11y-{name}.png")
    finally:
        seen.context.close()
    assert seen.errors == []
    return found
