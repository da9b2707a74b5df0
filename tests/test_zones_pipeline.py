"""Zones and masks from a pipeline file through `visioncap run` on real video, captioned by the real vLLM."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from fastapi.testclient import TestClient
from helpers import pipeline_dict, run_cli, write_pipeline
from PIL import Image
from sqlalchemy import text
from test_zones import DOOR, make_walk_video
from videos import WIDTH, _person

from visioncap.api import create_app
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, create_db_engine


def test_a_person_leaving_a_mask_and_entering_a_zone(tmp_path: Path, vllm_server: VllmServer) -> None:
    # 2 s standing in the masked left sixth (a poster), a 3 s walk right into the door zone, 2 s standing there.
    right = WIDTH - _person("bus-mid").shape[1] - 20
    video = make_walk_video(
        tmp_path / "walk.mp4", [20] * 20 + list(np.linspace(20, right, 30).astype(int)) + [right] * 20
    )
    poster = {"name": "poster", "camera": "cam-1", "points": [[0, 0], [1 / 6, 0], [1 / 6, 1], [0, 1]]}
    selection = {"zones": [DOOR], "masks": [poster], "min_interval_s": 0.5}
    pipeline = write_pipeline(tmp_path, pipeline_dict(video, selection=selection))
    database = f"sqlite:///{tmp_path / 'c.db'}"
    env = {
        "VISIONCAP_DATABASE_URL": database,
        "VISIONCAP_DATA_DIR": str(tmp_path / "data"),
        "VISIONCAP_VLM_BASE_URL": vllm_server.base_url,
    }
    result = run_cli("run", str(pipeline), "--progress", "none", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = sorted(CaptionStore(create_db_engine(database)).list(limit=100), key=lambda r: r.offset_s)
    seen = [(r.offset_s, r.reason, r.event_ids) for r in rows]
    assert [r.reason for r in rows][:1] == ["new-event"], seen
    # Nobody is seen while they stand in the mask: the event starts once their box centre leaves it.
    assert rows[0].offset_s >= 2.0
    entries = [r for r in rows if r.reason == "zone-entry"]
    # Captioned on the way (the walk from the mask to the zone takes 1.5 s), then again on entering the zone.
    assert len(entries) == 1 and entries[0].event_ids == rows[0].event_ids, seen
    assert entries[0].offset_s > rows[0].offset_s
    # Each caption stores the zones its people stood in: none on the way, the door from the entry on, with a
    # dwell that grows; and the side table the API's ?zone= filters by holds the same.
    assert rows[0].zones == []
    # Every row records the camera's zones then, for drawing on its frame (the mask is not a zone).
    assert all(r.zone_shapes == {"door": DOOR["points"]} for r in rows), rows[0].zone_shapes
    stays = [(r.offset_s, stay) for r in rows if r.offset_s >= entries[0].offset_s for stay in r.zones or []]
    assert stays and all(stay["zone"] == "door" and stay["track_id"] in rows[0].event_ids for _, stay in stays)
    dwells = [stay["dwell_s"] for _, stay in stays]
    assert dwells == sorted(dwells) and dwells[0] < 1.0, stays
    with create_db_engine(database).connect() as conn:
        side = conn.execute(text("SELECT caption_id, zone FROM caption_zones ORDER BY caption_id")).all()
    assert [(row_id, zone) for row_id, zone in side] == [(r.id, "door") for r in rows if r.zones], side


def test_an_event_is_described_once_it_ends_from_several_of_its_frames(tmp_path: Path, vllm_server: VllmServer) -> None:
    # 1.5 s standing on the left, a 3 s walk into the door zone, 2 s standing there; the clip's end ends the event.
    right = WIDTH - _person("bus-mid").shape[1] - 20
    video = make_walk_video(
        tmp_path / "walk.mp4", [20] * 15 + list(np.linspace(20, right, 30).astype(int)) + [right] * 20
    )
    events = {"enabled": True, "max_frames": 4, "max_image_tokens": 400, "min_duration_s": 1, "max_tokens": 8}
    pipeline = write_pipeline(
        tmp_path,
        pipeline_dict(
            video,
            selection={"zones": [DOOR], "min_interval_s": 0.5},
            caption={"max_tokens": 8, "max_image_tokens": 256, "events": events},
        ),
    )
    database = f"sqlite:///{tmp_path / 'c.db'}"
    data = tmp_path / "data"
    env = {"VISIONCAP_DATABASE_URL": database, "VISIONCAP_DATA_DIR": str(data)}
    result = run_cli(
        "run", str(pipeline), "--progress", "none", env={**env, "VISIONCAP_VLM_BASE_URL": vllm_server.base_url}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = sorted(CaptionStore(create_db_engine(database)).list(limit=100), key=lambda r: r.captured_at)
    [described] = [r for r in rows if r.reason == "event-end"]
    captions = [r for r in rows if r.reason != "event-end"]
    # Beside the event's captions (the early one first), after all of them, captioned by the real vLLM.
    assert captions and captions[0].reason == "new-event" and rows[-1] is described
    assert described.status == "captioned" and described.caption and described.event_key == captions[0].event_key
    assert described.event_ids == captions[0].event_ids
    frames = described.frames or []
    roles = {role for frame in frames for role in frame["role"].split("+")}
    assert 2 <= len(frames) <= 4 and {"first", "best", "last", "zone:door"} <= roles, frames
    assert [f["offset_s"] for f in frames] == sorted(f["offset_s"] for f in frames)
    assert described.image_path in [f["path"] for f in frames]
    assert all((data / f["path"]).is_file() and 0 < f["image_tokens"] <= 100 for f in frames)
    # Several images in one request: the prompt vLLM counted holds every frame's image tokens (its processor and
    # our estimate agree), more than the single-frame caption's whole prompt.
    assert described.image_tokens == sum(f["image_tokens"] for f in frames)
    assert described.prompt_tokens is not None and described.prompt_tokens > described.image_tokens
    assert described.prompt_tokens > (captions[0].prompt_tokens or 0)
    # It carries the zone and the time spent there, and the side table ?zone= filters by has it.
    [stay] = described.zones or []
    assert stay["zone"] == "door" and stay["track_id"] in described.event_ids and stay["dwell_s"] >= 1.5
    with create_db_engine(database).connect() as conn:
        zone_rows = conn.execute(text("SELECT zone FROM caption_zones WHERE caption_id = :id"), {"id": described.id})
        assert [zone for (zone,) in zone_rows] == ["door"]

    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=data,
        database_url=database,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="reader", sha256=hash_key("frames-key"), scopes={"read"})],
        api_semantic_search=False,
    )
    with TestClient(create_app(settings), headers={"Authorization": "Bearer frames-key"}) as client:
        body = client.get(f"/v1/captions/{described.id}").json()
        assert [f["role"] for f in body["frames"]] == [f["role"] for f in frames]
        for number, frame in enumerate(body["frames"]):
            assert frame["image_url"] == f"/v1/captions/{described.id}/image?frame={number}"
            response = client.get(frame["image_url"])
            assert response.status_code == 200 and response.content == (data / frames[number]["path"]).read_bytes()
            assert Image.open(io.BytesIO(response.content)).size == (frame["width"], frame["height"])
        assert client.get(f"/v1/captions/{described.id}/image", params={"frame": len(frames)}).status_code == 404
        other = next(n for n, f in enumerate(frames) if f["path"] != described.image_path)
        boxed = client.get(f"/v1/captions/{described.id}/image", params={"frame": other, "boxes": True})
        assert boxed.status_code == 409, boxed.text
        assert client.get(f"/v1/captions/{captions[0].id}").json()["frames"] is None
