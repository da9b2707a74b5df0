"""Real parts for the web app's browser tests: a SQLite store seeded as the pipeline, the camera reports and the
alerts engine write it, `visioncap api` over it with a read key, a write key and a key limited to one camera, and
Debian's Chromium driven by Playwright.

The seeded day is 2026-11-29 (UTC; the browser runs in UTC too): at the dock, a courier event of three captions
in the morning (one with structured fields) and a forklift in the afternoon, one caption the day before; two
lobby captions; at the gate one caption and one still waiting for the VLM. dock and lobby are configured cameras
(so they can be paused); dock reports `online`, lobby `offline`, gate nothing. An alerts file's five rules (three
watch rules, each asking the real vLLM about one of the dock's courier captions: a forced match, a forced no, a
deadline no answer meets) and an API rule fired on them through the real alerts engine; their deliveries are then
marked delivered and failed as a delivery process records a receiver's answers (none runs here: its retries are
not what these tests check)."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from helpers import ARTIFACTS, CHROMIUM_FLAGS, chromium, missing, serve_api
from PIL import Image, ImageDraw
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright
from sqlalchemy import update

from visioncap.alerts import store as alerts_store
from visioncap.alerts.engine import AlertEngine
from visioncap.alerts.metrics import AlertMetrics
from visioncap.config.alerts import AlertRule, AlertsConfig
from visioncap.config.cameras import CameraConfig
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.frames import Caption
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.camera_configs import add_camera
from visioncap.store.cameras import CameraReport, write_camera
from visioncap.store.records import AlertDeliveryRecord, CameraOrigin, CameraState, DeliveryState, utcnow

READ_KEY = "web-app-read-key"
WRITE_KEY = "web-app-write-key"
LOBBY_KEY = "web-app-lobby-key"
DAY = "2026-11-29"
T0 = datetime(2026, 11, 29, 8, 0, tzinfo=UTC)
TIMEOUT_MS = 15_000  # a bound on a broken test, never a measurement
AXE_VERSION = "4.14.1"
AXE_DIR = ARTIFACTS / "axe"
DOCK_FPS = 2.5  # the dock's report: 250 frames in the 100 s since it came online


@dataclass(frozen=True)
class Shot:
    camera: str
    at: datetime
    text: str | None  # None: still pending
    people: int
    event: str
    structured: dict[str, Any] | None = None
    size: tuple[int, int] = (320, 240)


SHOTS = [
    Shot("dock", T0 - timedelta(hours=8, minutes=30), "a night guard checks the dock doors", 1, "dock:night"),
    Shot("dock", T0, "a courier wheels a trolley to the loading dock", 1, "dock:courier"),
    Shot(
        "dock",
        T0 + timedelta(minutes=1),
        "the courier hands a parcel to a worker in a yellow vest",
        2,
        "dock:courier",
        {
            "people_count": 2,
            "activities": ["handing over a parcel", "signing"],
            "attributes": ["yellow vest", "blue cap"],
            "summary": "a delivery is handed over",
        },
    ),
    Shot("dock", T0 + timedelta(minutes=2), "the courier walks back to the van", 1, "dock:courier"),
    Shot("lobby", T0 + timedelta(hours=1), "two visitors wait at the reception desk", 2, "lobby:visitors"),
    Shot("lobby", T0 + timedelta(hours=1, minutes=5), "a visitor signs the guest book", 1, "lobby:visitors"),
    Shot("gate", T0 + timedelta(hours=4), "a cyclist waits at the barrier", 1, "gate:cyclist"),
    Shot("gate", T0 + timedelta(hours=4, minutes=10), None, 3, "gate:group"),
    Shot("dock", T0 + timedelta(hours=6, minutes=30), "a forklift driver reverses with a pallet", 1, "dock:forklift"),
]
DOCK_DAY = [s for s in SHOTS if s.camera == "dock" and s.at.date() == T0.date()]

ALERTS_FILE = {
    "webhooks": [
        {"name": "ops", "url": "http://127.0.0.1:9/hooks/ops"},
        {"name": "archive", "url": "http://127.0.0.1:9/hooks/archive"},
    ],
    "start_at_beginning": True,
    "rules": [
        {"name": "courier", "words": ["courier"], "cooldown_s": 0, "notify": ["ops", "archive"]},
        {"name": "crowd", "min_people": 2, "notify": ["ops"]},
        # Watch rules, each asking about one dock caption, answered by the real vLLM: guided decoding forced to one
        # answer (a random-weight model's own answers are noise), and a deadline no question can meet.
        {
            "name": "handover",
            "cameras": ["dock"],
            "words": ["hands"],
            "cooldown_s": 0,
            "notify": ["archive"],
            "verify": {
                "question": "a parcel changes hands",
                "max_frames": 2,
                "force_answer": {"match": True, "reason": "the courier gives a parcel to the worker"},
            },
        },
        {
            "name": "trolley",
            "cameras": ["dock"],
            "words": ["trolley"],
            "verify": {
                "question": "a parcel is left on the trolley",
                "force_answer": {"match": False, "reason": "no parcel yet"},
            },
        },
        {
            "name": "van",
            "cameras": ["dock"],
            "words": ["van"],
            "verify": {"question": "the van blocks the gate", "deadline_s": 0.001},
        },
    ],
}
API_RULE = AlertRule(name="forklift", cameras=["dock"], words=["forklift"], notify=["archive"])
FAILED_ERROR = "HTTP 500 from http://127.0.0.1:9/hooks/ops"
HANDOVER_REASON = "the courier gives a parcel to the worker"
NO_PARCEL = "no parcel yet"
VLM_ERROR = "deadline: no answer within 0.001 s"
RULE_NAMES = ["courier", "crowd", "handover", "trolley", "van", "forklift"]  # as listed: the file's first


def photo(index: int, width: int, height: int) -> bytes:
    """A real JPEG, different for each caption (a colour field with a figure), as the outbox stores frames."""
    image = Image.new("RGB", (width, height), (40 + 20 * index, 90 + 5 * index, 170 - 12 * index))
    draw = ImageDraw.Draw(image)
    draw.rectangle((0, height * 2 // 3, width, height), fill=(90, 90, 100))
    draw.rectangle((width // 3, height // 4, width // 2, height - 20), fill=(230, 200, 150))
    draw.ellipse((width // 3, height // 8, width // 2, height // 4 + 8), fill=(230, 200, 150))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=85)
    return out.getvalue()


@dataclass
class Site:
    url: str
    ids: list[int]  # of SHOTS, in order
    store: CaptionStore
    alerts: dict[str, list[int]] = field(default_factory=dict)  # rule -> caption ids it fired on

    def id_of(self, text: str) -> int:
        return next(row for row, shot in zip(self.ids, SHOTS, strict=True) if shot.text == text)


def _store_shots(store: CaptionStore, data_dir: Path) -> list[int]:
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=100), PipelineMetrics())
    ids = []
    for index, shot in enumerate(SHOTS):
        width, height = shot.size
        boxes = [
            {"x1": 40.0 + 70 * n, "y1": 60.0, "x2": 100.0 + 70 * n, "y2": 220.0, "confidence": 0.9, "class_id": 0}
            for n in range(shot.people)
        ]
        new = NewCaption(
            pipeline="web",
            camera=shot.camera,
            source=f"rtsp://cameras.local/{shot.camera}",
            frame_index=index,
            offset_s=float(index),
            captured_at=shot.at,
            reason="new-event",
            people=boxes,
            image_width=width,
            image_height=height,
            model="tiny",
            event_key=shot.event,
            frame_width=width,
            frame_height=height,
        )
        _, row = outbox.put(new, photo(index, width, height))
        assert row is not None
        if shot.text is not None:
            store.mark_captioned(row, Caption(shot.text, "tiny", 210, 14, 0.42, shot.structured), attempts=1)
        ids.append(row)
    return ids


def _cameras(store: CaptionStore) -> None:
    for camera in ("dock", "lobby"):
        config = {
            "pipeline": "web",
            "source": {"kind": "rtsp", "camera": camera, "url": f"rtsp://cameras.local/{camera}", "analyze_fps": 5},
        }
        add_camera(store.engine, CameraConfig.model_validate(config), CameraOrigin.API)
    now = utcnow()
    since = now - timedelta(seconds=100)
    write_camera(
        store.engine,
        CameraReport(
            "dock", "web", "rtsp://cameras.local/dock", CameraState.ONLINE, since, frames_analysed=250, reported_at=now
        ),
    )
    write_camera(
        store.engine,
        CameraReport(
            "lobby",
            "web",
            "rtsp://cameras.local/lobby",
            CameraState.OFFLINE,
            since,
            error="connection refused",
            reported_at=now,
        ),
    )


def _alerts(store: CaptionStore, config_path: Path, data_dir: Path, vlm_base_url: str) -> dict[str, list[int]]:
    alerts_file = {**ALERTS_FILE, "vlm": {"base_url": vlm_base_url, "max_tokens": 64}}
    config_path.write_text(yaml.safe_dump(alerts_file), encoding="utf-8")
    config = AlertsConfig.model_validate(alerts_file)
    assert alerts_store.add_rule(store.engine, API_RULE)
    engine = AlertEngine(store.engine, config, AlertMetrics(), data_dir=data_dir)
    try:
        while engine.run_once():
            pass
        assert engine.verifier is not None and engine.verifier.requests == 3  # a question per watch rule
    finally:
        if engine.verifier is not None:
            engine.verifier.close()
    fired: dict[str, list[int]] = {}
    for alert, _ in alerts_store.list_alerts(store.engine, alerts_store.AlertFilter(), 100):
        fired.setdefault(alert.rule, []).append(alert.caption_id)
    # What a delivery process would record: ops answered the first courier alert with a 500 until it gave up,
    # archive acknowledged it; the rest wait.
    first_courier = min(
        alert.id
        for alert, _ in alerts_store.list_alerts(store.engine, alerts_store.AlertFilter(rules=["courier"]), 100)
    )
    with store.engine.begin() as conn:
        conn.execute(
            update(AlertDeliveryRecord)
            .where(AlertDeliveryRecord.alert_id == first_courier, AlertDeliveryRecord.destination == "ops")
            .values(state=DeliveryState.FAILED, attempts=20, last_error=FAILED_ERROR, finished_at=utcnow())
        )
        conn.execute(
            update(AlertDeliveryRecord)
            .where(AlertDeliveryRecord.alert_id == first_courier, AlertDeliveryRecord.destination == "archive")
            .values(state=DeliveryState.DELIVERED, attempts=1, finished_at=utcnow())
        )
    return fired


def api_keys() -> str:
    return json.dumps(
        [
            {"name": "reader", "sha256": hash_key(READ_KEY), "scopes": ["read"]},
            {"name": "operator", "sha256": hash_key(WRITE_KEY), "scopes": ["read", "write"]},
            {"name": "lobby", "sha256": hash_key(LOBBY_KEY), "scopes": ["read"], "cameras": ["lobby"]},
        ]
    )


@contextmanager
def seeded_site(folder: Path, vlm_base_url: str, **env: str) -> Iterator[Site]:
    """The site, its watch rules answered by the vLLM at `vlm_base_url` (the session's)."""
    data_dir = folder / "data"
    data_dir.mkdir(parents=True)
    database_url = f"sqlite:///{data_dir / 'visioncap.db'}"
    store = CaptionStore(create_db_engine(database_url))
    store.create_schema()
    ids = _store_shots(store, data_dir)
    _cameras(store)
    fired = _alerts(store, folder / "alerts.yaml", data_dir, vlm_base_url)
    with serve_api(
        data_dir,
        database_url,
        READ_KEY,
        VISIONCAP_API_KEYS=api_keys(),
        VISIONCAP_ALERTS_CONFIG=str(folder / "alerts.yaml"),
        VISIONCAP_API_STREAM_POLL_S="0.2",
        **env,
    ) as url:
        yield Site(url, ids, store, fired)
    store.engine.dispose()


@contextmanager
def launched_browser() -> Iterator[Browser]:
    executable = chromium()
    with sync_playwright() as playwright:
        # Debian's Chromium, never a browser Playwright downloads.
        browser = playwright.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Watched:
    """A page and what went wrong on it: script errors, console errors, and API answers of 400 and above."""

    context: BrowserContext
    page: Page
    errors: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # "STATUS PATH?QUERY"
    requests: list[str] = field(default_factory=list)


def watched(browser: Browser, **options: Any) -> Watched:
    # UTC: the seeded day is a UTC day, and the page shows local times.
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id="UTC", locale="en-GB", **options)
    context.set_default_timeout(TIMEOUT_MS)
    expect.set_options(timeout=TIMEOUT_MS)
    page = context.new_page()
    seen = Watched(context, page)
    page.on("pageerror", lambda error: seen.errors.append(f"page error: {error}"))
    page.on("console", lambda message: seen.errors.append(message.text) if message.type == "error" else None)
    page.on("request", lambda request: seen.requests.append(request.url))

    def answered(response: Any) -> None:
        if response.status >= 400 and "/v1/" in response.url:
            seen.refused.append(f"{response.status} {response.url.split('/', 3)[3]}")

    page.on("response", answered)
    return seen


def signed_in(browser: Browser, url: str, key: str, path: str = "/", **options: Any) -> Watched:
    """A page opened at `path` on which the user entered `key` in the key form."""
    seen = watched(browser, **options)
    seen.page.goto(url + path)
    seen.page.fill("#key", key)
    seen.page.click("#keyform button[type=submit]")
    return seen


def screenshot(page: Page, name: str) -> Path:
    path = ARTIFACTS / name
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0
    return path


def axe_source() -> str:
    """axe-core's script, installed from npm into test-artifacts/axe (`make web-test-deps`, or here when absent)."""
    script = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
    package = AXE_DIR / "node_modules" / "axe-core" / "package.json"
    installed = json.loads(package.read_text())["version"] if package.exists() else None
    if installed != AXE_VERSION:
        npm = shutil.which("npm")
        if npm is None:
            missing("npm (to install axe-core)", "apt-get install -y --no-install-recommends npm")
        AXE_DIR.mkdir(parents=True, exist_ok=True)
        command = [npm, "install", "--prefix", str(AXE_DIR), "--no-audit", "--no-fund", f"axe-core@{AXE_VERSION}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            missing(f"axe-core {AXE_VERSION} from npm ({done.stderr.strip()[-300:]})", "make web-test-deps")
    return script.read_text(encoding="utf-8")
