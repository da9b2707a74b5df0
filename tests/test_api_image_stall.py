"""The image route on a volume that stops answering: the rest of the API keeps answering (issue #41 item 7).

The stall is real: the caption's image lies on a FUSE mount whose lookups this process holds (fuse_stall.py), so the
API's stat sleeps in the kernel exactly as it does on an NFS volume whose server is away; a FIFO cannot stand in,
since stat() of one answers at once. The API runs on a real socket (uvicorn in a thread, `ApiThread`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fuse_stall import StallingFs, stalling_mount
from test_api import READ_KEY, ApiThread, captioned, jpeg, new_caption, settings_for

from visioncap.api import create_app
from visioncap.api.images import FILE_THREADS, ImageFiles
from visioncap.config.outbox import OutboxConfig
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.store import CaptionStore, create_db_engine

TIMEOUT = 30  # seconds; a bound on a broken test, never a measurement
PROMPT_S = 5.0  # what "still answers" means for a request that does no file call: generous, for a loaded machine
HEADERS = {"X-Api-Key": READ_KEY}
ROWS = 46  # image requests at once: more than anyio's default thread pool (40 tokens)


class Stalled:
    def __init__(self, data_dir: Path, row_ids: list[int], fs: StallingFs) -> None:
        self.data_dir = data_dir
        self.row_ids = row_ids  # one per camera: the kernel lets the lookups of different names run at once
        self.fs = fs


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[Stalled]:
    """Captioned rows, one per camera, whose images' top folder is then mounted over by a stalling file system."""
    data_dir = tmp_path / "data"
    store = CaptionStore(create_db_engine(f"sqlite:///{data_dir / 'visioncap.db'}"))
    store.create_schema()
    outbox = Outbox(store, data_dir, OutboxConfig(capacity=ROWS), PipelineMetrics())
    row_ids = []
    for index in range(ROWS):
        _, row_id = outbox.put(new_caption(index, camera=f"cam-{index}"), jpeg())
        assert row_id is not None
        store.mark_captioned(row_id, captioned("a person at the gate"), attempts=1)
        row_ids.append(row_id)
    row = store.get(row_ids[0])
    assert row is not None and row.image_path
    store.engine.dispose()
    folder = data_dir / Path(row.image_path).parts[0]  # the frames' top folder: the "volume"
    assert all(Path(found.image_path).parts[0] == folder.name for found in map(store.get, row_ids) if found)
    with stalling_mount(folder) as fs:
        yield Stalled(data_dir, row_ids, fs)


def wait_for(condition: str, check: object) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting until {condition}"
        time.sleep(0.02)


def test_a_stalled_image_volume_freezes_neither_the_event_loop_nor_the_other_routes(stalled: Stalled) -> None:
    """More image requests than anyio's default thread pool (40) stall on the volume: the event loop still answers
    /healthz, the default pool still serves a sync route (one caption, from the database), no more than
    FILE_THREADS threads sleep in the volume, and when it answers again every image request gets its 4xx."""
    app = create_app(settings_for(stalled.data_dir))
    with ApiThread(app) as api, ThreadPoolExecutor(ROWS) as pool:

        def get(path: str, timeout: float = TIMEOUT) -> httpx.Response:
            return httpx.get(api.url + path, headers=HEADERS, timeout=timeout)

        def image(row_id: int) -> httpx.Response:
            return get(f"/v1/captions/{row_id}/image")

        assert get("/healthz").status_code == 200
        first = pool.submit(image, stalled.row_ids[0])
        assert stalled.fs.stalled.wait(TIMEOUT), "the image request never reached the volume"
        try:
            # Before: the stat ran on the event loop, and this waited for the volume like everything else.
            assert get("/healthz", PROMPT_S).status_code == 200
        except httpx.TimeoutException:
            pytest.fail(f"/healthz did not answer within {PROMPT_S} s while an image read was stalled")
        more: list[Future[httpx.Response]] = [pool.submit(image, row_id) for row_id in stalled.row_ids[1:]]
        wait_for(f"{FILE_THREADS} reads are held by the volume", lambda: stalled.fs.held == FILE_THREADS)
        try:
            one = get(f"/v1/captions/{stalled.row_ids[0]}", PROMPT_S)
        except httpx.TimeoutException:
            pytest.fail(f"a sync route did not answer within {PROMPT_S} s while {ROWS} image reads were stalled")
        assert one.status_code == 200 and one.json()["id"] == stalled.row_ids[0]
        assert get("/healthz", PROMPT_S).status_code == 200
        assert stalled.fs.held == FILE_THREADS  # the other requests wait for a slot, not in the volume

        stalled.fs.release()  # the volume answers again, and the files are gone
        answers = [future.result(TIMEOUT) for future in [first, *more]]
    statuses = {response.status_code for response in answers}
    assert statuses <= {404, 503}, statuses
    for response in answers:
        assert response.json()["error"]["code"] == response.status_code
        if response.status_code == 503:  # waited FILE_WAIT_S for a slot on a slow machine
            assert response.headers["Retry-After"]
    assert any(response.status_code == 404 for response in answers)


def test_a_request_that_waits_too_long_for_a_file_slot_gets_503_with_retry_after(stalled: Stalled) -> None:
    """Every slot held by the stalled volume past the wait: a clear 503 with Retry-After, not a request that waits
    as long as the volume does."""
    app = create_app(settings_for(stalled.data_dir))
    app.state.image_files = ImageFiles(threads=1, wait_s=0.5)  # the route's pool, made small and quick to give up
    image = f"/v1/captions/{stalled.row_ids[0]}/image"
    with ApiThread(app) as api, ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.get, api.url + image, headers=HEADERS, timeout=TIMEOUT)
        assert stalled.fs.stalled.wait(TIMEOUT), "the image request never reached the volume"
        second = httpx.get(api.url + image, headers=HEADERS, timeout=TIMEOUT)
        assert second.status_code == 503
        assert second.headers["Retry-After"]
        assert "image store" in second.json()["error"]["message"]
        stalled.fs.release()
        assert first.result(TIMEOUT).status_code == 404
