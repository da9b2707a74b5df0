"""Zones and masks from a pipeline file through `visioncap run` on real video, captioned by the real vLLM."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers import pipeline_dict, run_cli, write_pipeline
from sqlalchemy import text
from test_zones import DOOR, make_walk_video
from videos import WIDTH, _person

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
