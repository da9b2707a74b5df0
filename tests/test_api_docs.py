"""/docs works offline: Swagger UI's files come from the API itself (the fastapi-offline wheel), never a CDN."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers import ARTIFACTS, CHROMIUM_FLAGS, chromium

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key

READ_KEY = "docs-read-key"
TIMEOUT = 60  # seconds; a bound on a broken test, never a measurement
ASSETS = ("/static/docs/swagger-ui-bundle.js", "/static/docs/swagger-ui.css", "/static/docs/favicon.png")


def settings_for(tmp_path: Path, **changes: Any) -> ApiSettings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": f"sqlite:///{tmp_path / 'visioncap.db'}",
        "vlm_base_url": "http://127.0.0.1:9/v1",
        "api_keys": [ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"})],
    }
    values.update(changes)
    return ApiSettings(_env_file=None, **values)  # type: ignore[call-arg]


def referenced_urls(html: str) -> set[str]:
    return set(re.findall(r'(?:src|href)="([^"]+)"', html)) | set(re.findall(r"url: '([^']+)'", html))


def test_docs_page_references_only_assets_the_api_serves(tmp_path: Path) -> None:
    with TestClient(create_app(settings_for(tmp_path))) as client:
        page = client.get("/docs")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text and "https://" not in page.text, "no CDN"
        assert referenced_urls(page.text) == {*ASSETS, "/openapi.json"}
        assert '"validatorUrl": null' in page.text  # no badge fetched from validator.swagger.io
        for url in ASSETS:
            response = client.get(url, headers={"X-Api-Key": READ_KEY})
            assert response.status_code == 200, url
        bundle = client.get(ASSETS[0])
        assert "javascript" in bundle.headers["content-type"] and "SwaggerUIBundle" in bundle.text
        assert client.get(ASSETS[1]).headers["content-type"].startswith("text/css")
        assert client.get("/docs/oauth2-redirect").status_code == 200
        assert client.get("/static/app.js").status_code == 200, "the page's own files are still served"


def test_docs_and_their_assets_need_a_key_when_the_ui_is_not_public(tmp_path: Path) -> None:
    with TestClient(create_app(settings_for(tmp_path, api_public_ui=False))) as client:
        for url in ("/docs", "/openapi.json", *ASSETS):
            assert client.get(url).status_code == 401, url
            assert client.get(url, headers={"X-Api-Key": READ_KEY}).status_code == 200, url
        assert client.get("/healthz").status_code == 200


@pytest.fixture
def api_url(tmp_path: Path) -> Iterator[str]:
    """The app on a real socket (uvicorn in a thread), for the browser."""
    app: FastAPI = create_app(settings_for(tmp_path))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "API did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)


@pytest.mark.browser
def test_swagger_ui_renders_in_headless_chromium_without_any_other_host(api_url: str, tmp_path: Path) -> None:
    command = [
        chromium(),
        "--headless",
        *CHROMIUM_FLAGS,
        f"--user-data-dir={tmp_path / 'chromium'}",
        # Every host but the API's fails to resolve: a page that needed a CDN would render nothing.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run(
        [*command, "--dump-dom", f"{api_url}/docs"], capture_output=True, text=True, timeout=TIMEOUT, check=True
    ).stdout
    # Swagger UI ran (its bundle and CSS loaded) and rendered the operations of /openapi.json.
    assert "swagger-ui" in dom and "opblock" in dom, dom[:2000]
    for path in ("/v1/captions", "/v1/cameras", "/v1/stream"):
        assert f'data-path="{path}"' in dom, path
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "api-docs.png"
    subprocess.run(
        [*command, "--window-size=1280,1600", f"--screenshot={shot}", f"{api_url}/docs"],
        capture_output=True,
        timeout=TIMEOUT,
        check=True,
    )
    assert shot.stat().st_size > 10_000
