"""Captions carry the zones their people stood in (issue 45, item 1): stored with the row and in its side table
(schema step 17), filtered by `?zone=` and `min_dwell_s` through the API on SQLite and PostgreSQL, deleted with
their row, and matched by alert rules ("in back-door for 60 s or more")."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fastapi.testclient import TestClient
from pg import fresh_database
from PIL import Image
from pydantic import ValidationError
from sqlalchemy import func, select, text

from visioncap.alerts.engine import facts_of, reason
from visioncap.alerts.rules import CaptionFacts, matches
from visioncap.api import create_app
from visioncap.api.protocol import Caption
from visioncap.config.alerts import AlertRule
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.store import CaptionStore, NewCaption, create_db_engine
from visioncap.store.changes import CAPTION_COLUMNS
from visioncap.store.records import CaptionRecord, CaptionZoneRecord

READ_KEY = "zones-read-key"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
# Per row: the zones of its people, as the selector writes them (frames.ZoneStay.as_dict).
ROWS: list[list[dict[str, Any]]] = [
    [],  # 1: nobody in a zone
    [{"zone": "back-door", "track_id": 1, "dwell_s": 4.0}],  # 2: just arrived at the back door
    [{"zone": "back-door", "track_id": 1, "dwell_s": 75.5}],  # 3: the same person, over a minute later
    [{"zone": "yard", "track_id": 2, "dwell_s": 90.0}, {"zone": "back-door", "track_id": 3, "dwell_s": 10.0}],  # 4
    [{"zone": "yard", "track_id": 4, "dwell_s": 5.0}, {"zone": "yard", "track_id": 5, "dwell_s": 61.0}],  # 5
]


def new_caption(index: int, zones: list[dict[str, Any]]) -> NewCaption:
    return NewCaption(
        pipeline="p",
        camera="house",
        source="/videos/house.mp4",
        frame_index=index,
        offset_s=float(index),
        captured_at=T0 + timedelta(minutes=index),
        reason="zone-entry",  # type: ignore[arg-type]
        people=[{"x1": 1.0, "y1": 1.0, "x2": 9.0, "y2": 9.0, "confidence": 0.9, "class_id": 0, "track_id": 1}],
        image_width=16,
        image_height=16,
        model="tiny",
        zones=zones,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'visioncap.db'}"
    return fresh_database(request.getfixturevalue("postgres"))


@pytest.fixture
def store(database_url: str) -> CaptionStore:
    store = CaptionStore(create_db_engine(database_url))
    store.create_schema()
    for index, zones in enumerate(ROWS, start=1):
        assert store.add(new_caption(index, zones)) == index
    return store


@pytest.fixture
def client(store: CaptionStore, tmp_path: Path, database_url: str) -> Any:
    settings = ApiSettings(  # type: ignore[call-arg]
        _env_file=None,
        data_dir=tmp_path,
        database_url=database_url,
        vlm_base_url="http://127.0.0.1:9/v1",
        api_keys=[ApiKey(name="reader", sha256=hash_key(READ_KEY), scopes={"read"})],
        api_semantic_search=False,
    )
    with TestClient(create_app(settings), headers={"Authorization": f"Bearer {READ_KEY}"}) as client:
        yield client


def found(client: TestClient, **params: Any) -> list[int]:
    response = client.get("/v1/captions", params=params)
    assert response.status_code == 200, response.text
    return sorted(item["id"] for item in response.json()["items"])


def test_captions_carry_their_zones_and_filter_by_zone_and_dwell(client: TestClient, store: CaptionStore) -> None:
    items = {item["id"]: item for item in client.get("/v1/captions").json()["items"]}
    assert items[1]["zones"] == []
    assert items[4]["zones"] == ROWS[3]
    # One side-table row per caption and zone: the longest stay of its people there.
    with store.engine.connect() as conn:
        side = conn.execute(select(CaptionZoneRecord.caption_id, CaptionZoneRecord.zone, CaptionZoneRecord.dwell_s))
        assert sorted(tuple(row) for row in side) == [
            (2, "back-door", 4.0),
            (3, "back-door", 75.5),
            (4, "back-door", 10.0),
            (4, "yard", 90.0),
            (5, "yard", 61.0),
        ]
    assert found(client, zone="back-door") == [2, 3, 4]
    assert found(client, zone="back-door,yard") == [2, 3, 4, 5]
    assert found(client, zone=["yard", "back-door"]) == [2, 3, 4, 5]
    assert found(client, zone="back-door", min_dwell_s=60) == [3]
    assert found(client, zone="yard", min_dwell_s=60) == [4, 5]
    assert found(client, min_dwell_s=60) == [3, 4, 5]  # in any zone
    assert found(client, zone="garage") == []
    assert found(client, zone="back door") == []  # like a camera, a name no zone has matches nothing
    # With the other filters, and on the bounded walk (a row check): the same rows.
    assert found(client, zone="back-door", min_people=1, since=(T0 + timedelta(minutes=3)).isoformat()) == [3, 4]
    assert found(client, zone="back-door", status="pending") == [2, 3, 4]


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"zone": "x" * 65}, "zone"),
        ({"zone": ",".join(f"z{n}" for n in range(33))}, "zone"),
        ({"min_dwell_s": -1}, "min_dwell_s"),
        ({"min_dwell_s": "nan"}, "min_dwell_s"),
        ({"min_dwell_s": 10**9}, "min_dwell_s"),
    ],
)
def test_a_bad_zone_filter_is_a_422_naming_it(client: TestClient, params: dict[str, Any], problem: str) -> None:
    response = client.get("/v1/captions", params=params)
    assert response.status_code == 422, response.text
    assert problem in response.text


def test_a_caption_deleted_takes_its_zones_with_it(store: CaptionStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(CaptionRecord.__table__.delete().where(CaptionRecord.id.in_([3, 4])))
    with store.engine.connect() as conn:
        left = conn.execute(select(CaptionZoneRecord.caption_id).distinct()).scalars().all()
        assert sorted(left) == [2, 5]
        assert conn.scalar(select(func.count()).select_from(CaptionZoneRecord.__table__)) == 2


def test_alert_rules_match_zones_and_dwell(store: CaptionStore) -> None:
    with store.engine.connect() as conn:
        rows = {row.id: row for row in conn.execute(select(*CAPTION_COLUMNS, text("0"), text("0")))}
    facts = {row_id: facts_of(row) for row_id, row in rows.items()}
    assert facts[4].zones == (("yard", 90.0), ("back-door", 10.0))
    loitering = AlertRule(name="loitering", zones=["back-door"], min_dwell_s=60)
    anywhere_long = AlertRule(name="long-stay", min_dwell_s=60)
    at_the_door = AlertRule(name="door", zones=["back-door"])
    utc = ZoneInfo("UTC")
    assert [n for n in sorted(facts) if matches(loitering, facts[n], utc, None)] == [3]
    assert [n for n in sorted(facts) if matches(anywhere_long, facts[n], utc, None)] == [3, 4, 5]
    assert [n for n in sorted(facts) if matches(at_the_door, facts[n], utc, None)] == [2, 3, 4]
    assert reason(loitering, facts[3]) == "in back-door 76 s"
    # Rows written before zones existed (null) match no zone rule, and rules name zones as zones are named.
    old = CaptionFacts(1, "house", T0, "", 1, None)
    assert not matches(at_the_door, old, utc, None)
    with pytest.raises(ValidationError):
        AlertRule(name="bad", zones=["back door"])


def test_the_frame_is_drawn_with_the_cameras_zones_then(
    client: TestClient, store: CaptionStore, tmp_path: Path
) -> None:
    """`?boxes=true` draws the zones the camera had when the frame was taken (recorded with the row), in amber,
    mapped from the frame (320 x 240) onto the stored image (160 x 120)."""
    image = Image.new("RGB", (160, 120), (20, 20, 20))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=95)
    (tmp_path / "frames").mkdir()
    (tmp_path / "frames" / "door.jpg").write_bytes(out.getvalue())
    door = [[0.5, 0.5], [1.0, 0.5], [1.0, 1.0], [0.5, 1.0]]
    drawn: dict[bool, Image.Image] = {}
    for index, shapes in ((10, {"door": door}), (11, None)):
        new = replace(new_caption(index, []), image_path="frames/door.jpg", frame_width=320, frame_height=240)
        row_id = store.add(replace(new, zone_shapes=shapes))
        response = client.get(f"/v1/captions/{row_id}/image", params={"boxes": "true"})
        assert response.status_code == 200, response.text
        drawn[shapes is not None] = Image.open(io.BytesIO(response.content)).convert("RGB")
    # The door's left edge is x = 0.5 of the frame: 80 px of the image, from y = 60 down.
    red, green, blue = drawn[True].getpixel((80, 90))
    assert red > 180 and green > 130 and blue < 110, (red, green, blue)
    assert max(drawn[False].getpixel((80, 90))) < 80
    # The page's lists leave the polygons out (they serve drawing only).
    items = client.get("/v1/captions").json()["items"]
    assert all("zone_shapes" not in item for item in items)


def test_a_descriptions_malformed_frame_entries_are_left_out_of_the_api_not_a_500(tmp_path: Path) -> None:
    """`frames` is JSON a row may hold in any shape (written by something else): the API lists the entries the
    pipeline writes, each keeping its number (the `frame` of its image route), and answers the page."""
    store = CaptionStore(create_db_engine(f"sqlite:///{tmp_path / 'visioncap.db'}"))
    store.create_schema()
    good = {"role": "last", "frame_index": 9, "offset_s": 0.9, "width": 16, "height": 16, "image_tokens": 1}
    odd = replace(new_caption(1, []), reason="event-end", frames=[{"role": "first"}, "not a frame", good])  # type: ignore[list-item]
    none = replace(new_caption(2, []), reason="event-end", frames=[{"role": "first"}])
    first, second = store.add(odd), store.add(none)
    assert first is not None and second is not None
    shown = Caption.of(store.get(first))  # type: ignore[arg-type]
    assert [(frame.role, frame.image_url) for frame in shown.frames or []] == [
        ("last", f"/v1/captions/{first}/image?frame=2")
    ]
    assert Caption.of(store.get(second)).frames is None  # type: ignore[arg-type]


def test_a_descriptions_malformed_frames_have_no_image_a_404_not_a_500(client: TestClient, store: CaptionStore) -> None:
    """The image route reads the same JSON: an entry that is not an object, one with no path or a path that is not
    text, and a `frames` that is not a list each answer 404 (the frame has no stored image), never a 500."""
    entries = [{"role": "first"}, "not a frame", {"role": "best", "path": 7}]
    listed = store.add(replace(new_caption(20, []), reason="event-end", frames=entries))  # type: ignore[arg-type]
    unlisted = store.add(replace(new_caption(21, []), reason="event-end", frames={"path": "frames/x.jpg"}))  # type: ignore[arg-type]
    assert listed is not None and unlisted is not None
    for row_id, frame in ((listed, 0), (listed, 1), (listed, 2), (listed, 3), (unlisted, 0)):
        response = client.get(f"/v1/captions/{row_id}/image", params={"frame": frame})
        assert response.status_code == 404, (row_id, frame, response.text)
