"""A key rotated on the gateway before the pipeline has the new one: refusals (401, and 403 for a key limited to
other cameras) pause the camera's captioning, visibly, with its frames pending, and the captions arrive once the
gateway takes the key. The gateway's keys change by restart: it is restarted on its port with the new ones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import TINY_MODEL, wait_for

from visioncap.caption.client import VlmCaptioner
from visioncap.caption.encode import encode_jpeg
from visioncap.config import CaptionConfig, VlmConfig
from visioncap.config.gateway import GatewayConfig
from visioncap.config.keys import hash_key
from visioncap.config.outbox import OutboxConfig
from visioncap.gateway.in_thread import GatewayThread
from visioncap.pipeline.access import CaptionAccess
from visioncap.pipeline.metrics import PipelineMetrics
from visioncap.pipeline.outbox import Outbox
from visioncap.pipeline.workers import CaptionWorkers
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, NewCaption, create_db_engine

OLD_KEY = "captions-key-of-last-month"
NEW_KEY = "captions-key-of-this-month"
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def gateway_config(vllm: VllmServer, key: str, cameras: list[str] | None = None) -> GatewayConfig:
    caller: dict[str, Any] = {"name": "captions", "sha256": hash_key(key), "traffic_class": "background"}
    if cameras is not None:
        caller["cameras"] = cameras
    return GatewayConfig.model_validate(
        {
            "upstreams": [{"name": "vllm", "base_url": vllm.base_url, "metrics_poll_s": 0.5}],
            "keys": [{"name": "chat", "sha256": hash_key("chat-key"), "traffic_class": "interactive"}, caller],
        }
    )


class RestartableGateway:
    """One gateway at a time on one port; `restart` serves a new configuration there."""

    def __init__(self, config: GatewayConfig) -> None:
        self.current = GatewayThread(config)
        self.current.start()
        self.port = self.current.port
        self.base_url = self.current.base_url

    def restart(self, config: GatewayConfig) -> None:
        self.current.stop()
        self.current = GatewayThread(config, port=self.port)
        self.current.start()


@pytest.fixture
def gateway(vllm_server: VllmServer) -> Iterator[RestartableGateway]:
    gw = RestartableGateway(gateway_config(vllm_server, OLD_KEY))
    yield gw
    gw.current.stop()


def frame(camera: str, index: int) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera=camera,
        source=f"{camera}.mp4",
        frame_index=index,
        offset_s=float(index),
        captured_at=T0 + timedelta(seconds=index),
        reason="new-event",
        people=[],
        image_width=64,
        image_height=48,
        model=TINY_MODEL,
        event_key=f"{camera}:{index}",
    )


def test_a_rotated_key_pauses_captioning_until_the_gateway_takes_it(
    gateway: RestartableGateway, vllm_server: VllmServer, tmp_path: Path
) -> None:
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'captions.db'}"))
    store.create_schema()
    metrics = PipelineMetrics()
    config = OutboxConfig(retry_initial_s=0.2, retry_max_s=1.0)
    outbox = Outbox(store, tmp_path, config, metrics)
    access = CaptionAccess(config, metrics)
    # The pipeline already has the new key; the gateway still knows only last month's.
    vlm = VlmConfig(model=TINY_MODEL, extra_body={"ignore_eos": True})
    captioner = VlmCaptioner(vlm, CaptionConfig(max_tokens=4), gateway.base_url, NEW_KEY)
    jpeg = encode_jpeg(np.full((48, 64, 3), 127, np.uint8), max_tokens=16).jpeg
    rows = {camera: [outbox.put(frame(camera, i), jpeg)[1] for i in range(3)] for camera in ("dock", "yard")}
    workers = CaptionWorkers(outbox, captioner, 2, metrics, access)

    def statuses(camera: str) -> list[str]:
        return [store.get(row).status for row in rows[camera]]  # type: ignore[union-attr,arg-type]

    def paused(camera: str) -> float | None:
        return metrics.registry.get_sample_value("visioncap_captioning_paused", {"camera": camera})

    workers.start()
    try:
        wait_for(lambda: set(access.paused()) == {"dock", "yard"}, 60, "both cameras to pause")
        wait_for(
            lambda: all(store.get(row).attempts >= 2 for row in rows["dock"][:1]),  # type: ignore[union-attr,arg-type]
            60,
            "a frame asked again with backoff",
        )
        assert "HTTP 401" in str(access.paused()["dock"]["error"])
        assert paused("dock") == paused("yard") == 1
        assert statuses("dock") == statuses("yard") == ["pending"] * 3  # nothing failed, nothing lost
        assert "HTTP 401" in (store.get(rows["dock"][0]).error or "")  # type: ignore[union-attr]

        # The new key, for the dock only: the dock's captions arrive, the yard is refused (403) and stays paused.
        gateway.restart(gateway_config(vllm_server, NEW_KEY, cameras=["dock"]))
        wait_for(lambda: statuses("dock") == ["captioned"] * 3, 120, "the dock's captions")
        wait_for(lambda: "HTTP 403" in str(access.paused().get("yard", {}).get("error")), 60, "the yard's refusal")
        assert set(access.paused()) == {"yard"} and paused("dock") == 0 and paused("yard") == 1
        assert statuses("yard") == ["pending"] * 3

        gateway.restart(gateway_config(vllm_server, NEW_KEY))
        wait_for(lambda: statuses("yard") == ["captioned"] * 3, 120, "the yard's captions")
        assert access.paused() == {} and paused("yard") == 0
    finally:
        outbox.close()
        workers.join(timeout=30)
