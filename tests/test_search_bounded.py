"""Bounded search (store/search.py, GET /v1/captions): filters no index serves examine at most a budget of rows
per request, and a page that does not fill within it comes back partial with a cursor that carries on from where
the search stopped; a statement the database stops at the time limit is answered 503 with Retry-After.

On a real SQLite file and a real PostgreSQL (the session's cluster). Pages are followed to the end and must give
exactly the rows a plain scan in Python finds, in order, whatever the budget: ids in and out of capture-time
order, several rows at one instant (the cut may fall among them), matches several budgets deep.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pg import database_url_for
from sqlalchemy import Engine, insert, text

from visioncap.api import create_app
from visioncap.api.protocol import CaptionPage
from visioncap.config.api import ApiKey, ApiSettings
from visioncap.config.keys import hash_key
from visioncap.store import create_db_engine
from visioncap.store.records import CaptionRecord
from visioncap.store.schema import ensure_schema
from visioncap.store.search import CaptionFilter, Position, SearchLimits, SearchTimeout, search_captions

T0 = datetime(2026, 10, 1, tzinfo=UTC)
ROWS = 600
SCAN = 50  # rows a request may examine: the table is twelve budgets long
KEY = "bounded-read-key"
# Newest-first positions (0 = newest) of the rows that match the filters below: the first is four budgets deep,
# then a run of neighbours (the cut falls among them on some page), then single rows far apart.
DEEP = {200, 201, 202, 203, 204, 330, 331, 480, 598, 599}
FAILED = {260, 261, 262, 410, 560}


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    engine = create_db_engine(database_url_for(request, tmp_path))
    ensure_schema(engine)
    yield engine
    engine.dispose()


def seed(engine: Engine, shuffled: bool) -> list[dict[str, Any]]:
    """ROWS rows, three cameras per instant (the same capture time on three rows); inserted oldest first or in
    random order, so ids follow capture time or not at all."""
    rows = []
    for position in range(ROWS):  # 0 is the newest
        instant = T0 + timedelta(seconds=(ROWS - position) // 3)
        rows.append(
            {
                "pipeline": "p",
                "camera": f"cam-{position % 3}",
                "source": "s",
                "frame_index": position,
                "offset_s": 0.0,
                "captured_at": instant,
                "reason": "new-event",
                "event_key": "",
                "people": [],
                "people_count": 4 if position in DEEP else position % 2,
                "image_width": 1,
                "image_height": 1,
                "status": "failed" if position in FAILED else "captioned",
                # 150 places: with fewer than ~100 distinct words PostgreSQL guesses how many rows a prefix matches.
                "caption": f"a person walking near spot{position % 150}"
                + (" with an umbrella" if position % 7 == 0 else ""),
                "model": "m",
            }
        )
    order = list(reversed(rows))  # oldest first, as a pipeline writes them
    if shuffled:
        random.Random(5).shuffle(order)
    with engine.begin() as conn:
        conn.execute(insert(CaptionRecord), order)
        if engine.dialect.name == "postgresql":
            # What autovacuum does after a load: the statistics the planner's choices (and estimates) read.
            conn.execute(text("ANALYZE captions"))
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT id, frame_index FROM captions")).all()
    by_position = dict((position, row_id) for row_id, position in ids)
    for row in rows:
        row["id"] = by_position[row["frame_index"]]
    return rows


def expected(rows: list[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]) -> list[int]:
    chosen = [(row["captured_at"], row["id"]) for row in rows if keep(row)]
    return [row_id for _, row_id in sorted(chosen, reverse=True)]


def pages(engine: Engine, query: CaptionFilter, limit: int, scan_rows: int) -> list[list[int]]:
    """Every page of `query`, following the cursors to the end."""
    out: list[list[int]] = []
    after: Position | None = None
    for _ in range(10 * ROWS):
        rows, after = search_captions(engine, query, limit, after, SearchLimits(scan_rows=scan_rows))
        assert len(rows) <= limit
        out.append([row.id for row in rows])
        if after is None:
            return out
    raise AssertionError("the cursors never reach the end")


def flat(found: list[list[int]]) -> list[int]:
    return [row_id for page in found for row_id in page]


QUERIES: list[tuple[CaptionFilter, Callable[[dict[str, Any]], bool]]] = [
    (CaptionFilter(min_people=4), lambda r: r["people_count"] >= 4),
    (CaptionFilter(min_people=9999), lambda r: False),
    (CaptionFilter(statuses=["failed"]), lambda r: r["status"] == "failed"),
    (
        CaptionFilter(statuses=["failed"], cameras=["cam-0", "cam-2"]),
        lambda r: r["status"] == "failed" and r["camera"] in ("cam-0", "cam-2"),
    ),
    (CaptionFilter(min_people=4, cameras=["cam-1"]), lambda r: r["people_count"] >= 4 and r["camera"] == "cam-1"),
    (
        CaptionFilter(min_people=4, since=T0 + timedelta(seconds=20), until=T0 + timedelta(seconds=160)),
        lambda r: (
            r["people_count"] >= 4 and T0 + timedelta(seconds=20) <= r["captured_at"] < T0 + timedelta(seconds=160)
        ),
    ),
    (CaptionFilter(min_people=1), lambda r: r["people_count"] >= 1),  # half the rows: pages fill at once
]


@pytest.mark.parametrize("shuffled", [False, True], ids=["ids-in-order", "ids-shuffled"])
def test_filters_no_index_serves_page_partially_to_exactly_the_matches(engine: Engine, shuffled: bool) -> None:
    rows = seed(engine, shuffled)
    for query, keep in QUERIES:
        found = pages(engine, query, 3, SCAN)
        assert flat(found) == expected(rows, keep), query  # in order, none missed, none twice
        if keep is QUERIES[0][1]:
            # The first match is four budgets deep: the first pages are empty but not the end, and no request
            # went further than its budget (twelve budgets of rows need at least twelve requests).
            assert found[0] == [] and len(found) >= ROWS // SCAN
    assert pages(engine, CaptionFilter(min_people=9999), 3, SCAN) == [[]] * (ROWS // SCAN)
    # A budget larger than the table: one page, as before.
    assert pages(engine, CaptionFilter(min_people=4), 50, 10 * ROWS) == [expected(rows, QUERIES[0][1])]


@pytest.mark.parametrize("shuffled", [False, True], ids=["ids-in-order", "ids-shuffled"])
def test_text_with_other_filters_is_bounded_too(engine: Engine, shuffled: bool) -> None:
    rows = seed(engine, shuffled)
    queries: list[tuple[CaptionFilter, Callable[[dict[str, Any]], bool]]] = [
        # Every row says walking: the full-text index hands out all of them, the filter keeps ten.
        (CaptionFilter(text="walking", min_people=4), lambda r: r["people_count"] >= 4),
        (CaptionFilter(text="walking", min_people=9999), lambda r: False),
        (
            CaptionFilter(text="walk", statuses=["failed"], cameras=["cam-0", "cam-1"]),
            lambda r: r["status"] == "failed" and r["camera"] in ("cam-0", "cam-1"),
        ),
        (
            CaptionFilter(text="umbrella", min_people=1),
            lambda r: "umbrella" in r["caption"] and r["people_count"] >= 1,
        ),
    ]
    if shuffled:
        # Ids far from capture-time order make the windows narrow (down to a row a request for a word in every
        # row): two searches say enough there.
        queries = [queries[0], queries[3]]
    found = [pages(engine, query, 3, SCAN) for query, _ in queries]
    for (query, keep), its_pages in zip(queries, found, strict=True):
        assert flat(its_pages) == expected(rows, keep), query
    first = found[0]
    # Bounded: no request looked at more than its budget of rows (on PostgreSQL the last budget's worth may come
    # at once from the GIN index, when the planner expects no more matches than the budget there).
    assert len(first) >= ROWS // SCAN - 1
    if not shuffled:
        assert first[0] == []  # the first match is four budgets deep


def test_a_rare_word_with_a_filter_still_fills_its_page_from_the_text_index(engine: Engine) -> None:
    rows = seed(engine, False)
    # "umbrella" is in one row of seven (86 rows): fewer than the budget, so they are all read from the full-text
    # index (FTS5, or the GIN index by the planner's estimate) and the page is exact and full.
    query = CaptionFilter(text="umbrella", min_people=1)
    rows_found, after = search_captions(engine, query, 5, None, SearchLimits(scan_rows=400))
    assert [row.id for row in rows_found] == expected(
        rows, lambda r: "umbrella" in r["caption"] and r["people_count"] >= 1
    )[:5]
    assert after is not None


# -- through the API ---------------------------------------------------------------------------------------------


def client_for(engine: Engine, tmp_path: Path, **settings: Any) -> TestClient:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "database_url": engine.url.render_as_string(hide_password=False),
        "vlm_base_url": "http://127.0.0.1:9/v1",
        "api_keys": [ApiKey(name="reader", sha256=hash_key(KEY), scopes={"read"})],
        **settings,
    }
    app = create_app(ApiSettings(_env_file=None, **values))  # type: ignore[call-arg]
    return TestClient(app, headers={"Authorization": f"Bearer {KEY}"}, raise_server_exceptions=False)


def test_api_pages_are_marked_partial_and_their_cursors_reach_every_match(engine: Engine, tmp_path: Path) -> None:
    rows = seed(engine, True)
    with client_for(engine, tmp_path, api_search_scan_rows=SCAN) as client:
        ids: list[int] = []
        params: dict[str, Any] = {"min_people": 4, "limit": 3}
        partial_pages = 0
        for _ in range(10 * ROWS):
            response = client.get("/v1/captions", params=params)
            assert response.status_code == 200, response.text
            page = CaptionPage.model_validate_json(response.content)
            ids += [item.id for item in page.items]
            if page.partial:
                partial_pages += 1
                assert page.next_cursor is not None and len(page.items) < page.limit
            if page.next_cursor is None:
                break
            params["cursor"] = page.next_cursor
        assert ids == expected(rows, lambda r: r["people_count"] >= 4)
        assert partial_pages >= ROWS // SCAN - 4  # the empty stretches came back partial, not as the end
        first = client.get("/v1/captions", params={"min_people": 4, "limit": 3}).json()
        assert first["items"] == [] and first["partial"] is True and first["next_cursor"]
        full = client.get("/v1/captions", params={"limit": 3}).json()
        assert len(full["items"]) == 3 and full["partial"] is False


def seed_many(engine: Engine, count: int) -> None:
    """`count` rows made by the database itself (a walk of them takes far longer than the time limits below)."""
    columns = (
        "pipeline, camera, source, frame_index, offset_s, captured_at, reason, event_key, event_ids, score, people, "
        "people_count, image_width, image_height, image_tokens, status, attempts, caption, model, created_at, "
        "updated_at"
    )
    if engine.dialect.name == "sqlite":
        instant = "strftime('%Y-%m-%d %H:%M:%S', '2026-10-01', '+' || i || ' seconds') || '.000000+00:00'"
        numbers = "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :count - 1) "
        source = "FROM n"
        empty = "'[]'"
    else:
        instant = "timestamptz '2026-10-01 00:00:00+00' + i * interval '1 second'"
        numbers = ""
        source = "FROM generate_series(0, :count - 1) AS i"
        empty = "'[]'::json"
    statement = (
        f"{numbers}INSERT INTO captions ({columns}) SELECT 'p', 'cam-' || (i % 3), 's', i, 0, {instant}, "
        f"'new-event', '', {empty}, 0, {empty}, i % 3, 1, 1, 0, 'captioned', 1, 'a person walking', 'm', "
        f"{instant}, {instant} {source}"
    )
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # The per-camera count triggers update one row 100,000 times in one transaction (minutes); these tests
            # read no counts.
            conn.execute(text("ALTER TABLE captions DISABLE TRIGGER USER"))
        conn.execute(text(statement), {"count": count})
        if engine.dialect.name == "postgresql":
            conn.execute(text("ALTER TABLE captions ENABLE TRIGGER USER"))
            conn.execute(text("ANALYZE captions"))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def many(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """100,000 rows, made once for the tests below, which only read them (seconds of seeding each otherwise)."""
    engine = create_db_engine(database_url_for(request, tmp_path_factory.mktemp("many")))
    ensure_schema(engine)
    seed_many(engine, 100_000)
    yield engine
    engine.dispose()


def test_a_search_stopped_at_the_time_limit_answers_503_with_retry_after(many: Engine, tmp_path: Path) -> None:
    # 100,000 rows and a scan bound above that: the walk for a filter matching nothing runs through all of them,
    # some 500,000 SQLite steps (the time check runs every 100,000) and tens of milliseconds on PostgreSQL,
    # against a limit of a microsecond (1 ms, PostgreSQL's least). Whatever the machine's speed, it is stopped.
    engine = many
    limits = {"api_search_scan_rows": 10_000_000, "api_search_timeout_s": 1e-6}
    with client_for(engine, tmp_path, **limits) as client:
        for params in ({"min_people": 9999}, {"q": "walking", "min_people": 9999}, {"status": "failed"}):
            response = client.get("/v1/captions", params=params)
            assert response.status_code == 503, (params, response.text)
            assert response.headers["retry-after"].isdigit()
            error = response.json()["error"]
            assert error["type"] == "search_timeout" and "limit" in error["message"], error
    with client_for(engine, tmp_path, api_search_scan_rows=10_000_000) as client:
        response = client.get("/v1/captions", params={"min_people": 9999})  # the default limit: seconds
        assert response.status_code == 200 and response.json()["items"] == []


def test_the_time_limit_ends_with_its_search(many: Engine) -> None:
    # The stopped connection goes back to the pool without its limit (SQLite's progress handler removed,
    # PostgreSQL's statement_timeout local to the search's transaction): the next search on it runs to the end.
    engine = many
    unbounded = SearchLimits(scan_rows=10_000_000)
    with pytest.raises(SearchTimeout):
        search_captions(engine, CaptionFilter(min_people=9999), 5, None, SearchLimits(10_000_000, 1e-6))
    assert search_captions(engine, CaptionFilter(min_people=9999), 5, None, unbounded) == ([], None)
    rows, _ = search_captions(engine, CaptionFilter(min_people=2), 5, None, unbounded)
    assert [row.frame_index for row in rows] == [99_998, 99_995, 99_992, 99_989, 99_986]
