"""Exactly the captions the policy promises: events x (1 + re-captions), none without people (real vLLM)."""

from __future__ import annotations

import math
from pathlib import Path

from helpers import pipeline_dict, run_cli, write_pipeline
from videos import make_event_video

from visioncap.serve import VllmServer
from visioncap.store import CaptionStore, create_db_engine


def test_long_and_short_events_get_exactly_the_promised_captions(tmp_path: Path, vllm_server: VllmServer) -> None:
    video = tmp_path / "events.mp4"
    stretches = make_event_video(
        video, [(None, 2), ("zidane-right", 10), (None, 3), ("bus-right", 4), (None, 3), ("bus-mid", 3), (None, 2)]
    )
    interval = 4.0
    selection = {"stable_frames": 2, "best_frame_window_s": 0.6, "recaption_interval_s": interval, "min_interval_s": 1}
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

    people = [s for s in stretches if s.person]
    for row in rows:
        assert any(s.start_s <= row.offset_s < s.end_s for s in people), f"caption at {row.offset_s} s without people"
    per_stretch = []
    for stretch in people:
        inside = [r for r in rows if stretch.start_s <= r.offset_s < stretch.end_s]
        assert inside and inside[0].reason == "new-event"
        assert {r.reason for r in inside[1:]} <= {"recaption"}
        assert len({tuple(r.event_ids) for r in inside}) == 1, "one person, one event"
        per_stretch.append(len(inside))
    # The first caption comes within ~1 s of the person appearing, then one per interval while they stay:
    # 10 s -> 1 + 2 re-captions; 4 s and 3 s -> none. Gaps of 3 s exceed event_end_s (2 s): a new person at
    # the same spot is a new event, not the tracker reviving the last one.
    expected = [1 + math.floor((s.end_s - s.start_s - 1.0) / interval) for s in people]
    assert per_stretch == expected == [3, 1, 1]
    assert "3 events, 5 captions, 0 skipped, 0 pending, 0 errors" in result.stdout
