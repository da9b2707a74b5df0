"""The vector index's inverted lists on columns made here (no database): the first copies of each code kept before
any sort, the rows each list keeps under a mask, and the mask made again after a change in place."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from visioncap.store import vector_index
from visioncap.store.embeddings import DIMENSIONS
from visioncap.store.vector_index import (
    IndexFilter,
    VectorIndex,
    _Columns,
    bits_of,
    group,
    nearest_lists,
    train_centroids,
)

CODES = 40  # captions written again and again
COPIES = 500
DISTINCT = 5_000
LISTS = 16


def _index(runs_of_one: bool = False) -> tuple[VectorIndex, np.ndarray]:
    """An index over 40 vectors copied 500 times each and 5,000 distinct ones (interleaved, as cameras write them)
    over 4 cameras, in 16 lists; `runs_of_one`: every row a run of its own (nothing kept back before the sort)."""
    rng = np.random.default_rng(46)
    distinct = rng.standard_normal((CODES + DISTINCT, DIMENSIONS)).astype(np.float32)
    distinct /= np.linalg.norm(distinct, axis=1, keepdims=True)
    choice = np.concatenate([np.arange(CODES).repeat(COPIES), CODES + np.arange(DISTINCT)])
    rng.shuffle(choice)
    vectors = distinct[choice]
    rows = len(vectors)
    columns = _Columns(rows)
    numbers = np.arange(rows, dtype=np.int64)
    columns.append(
        numbers + 1, bits_of(vectors), (numbers % 4).astype(np.int32), numbers * 1_000_000,
        np.ones(rows, np.int32), np.zeros(rows, np.int8),
    )  # fmt: skip
    centroids = train_centroids(vectors[rng.choice(rows, 2_000, replace=False)], LISTS, rng)
    grouped, lists = group(columns, centroids, nearest_lists(centroids, vectors))
    index = VectorIndex.holding(grouped, lists, {f"cam-{n}": n for n in range(4)})
    if runs_of_one:
        lists.runs = np.arange(lists.covered, dtype=np.int32)
    return index, distinct


@pytest.mark.parametrize("cameras", [(), ("cam-1",), ("cam-1", "cam-2")])
def test_the_first_copies_of_a_code_are_those_the_sorted_cap_would_choose(
    cameras: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vector_index, "PROBE_ROWS_PER_CANDIDATE", 8)
    runs, _ = _index()
    whole, distinct = _index(runs_of_one=True)
    assert len(np.unique(runs._state.lists.runs)) < runs._state.lists.covered / 4  # the copies make long runs
    for query in distinct[:CODES:4]:  # a query on a copied code: hundreds of its copies in its list
        found, every = runs.nearest(query, IndexFilter(cameras=cameras), 64, per_code=4)
        expected, _ = whole.nearest(query, IndexFilter(cameras=cameras), 64, per_code=4)
        assert found.tolist() == expected.tolist() and not every
        position = {int(row_id): n for n, row_id in enumerate(runs._state.columns.ids[: runs.size])}
        codes = Counter(runs._state.columns.bits[position[int(row_id)]].tobytes() for row_id in found)
        assert len(found) == 64 and max(codes.values()) == 4
        # What the sort saw: the first copies of each run only, against every row of the probed lists.
        with runs._lock, whole._lock:
            mask, kept = (
                (None, None) if not cameras else runs._masked_rows(runs._state.columns, IndexFilter(cameras=cameras))
            )
            read = vector_index._probe(runs._state.columns, runs._state.lists, mask, kept, query, 64, 4)[0]
            every_row = vector_index._probe(whole._state.columns, whole._state.lists, mask, kept, query, 64)[0]
        assert sum(map(len, read)) < sum(map(len, every_row)) / 2


def test_rows_kept_per_list_under_a_mask() -> None:
    index, _ = _index()
    lists = index._state.lists
    assert lists is not None
    where = IndexFilter(cameras=["cam-3"])
    with index._lock:
        mask, kept = index._masked_rows(index._state.columns, where)
    labels = np.searchsorted(lists.starts, np.flatnonzero(mask), side="right") - 1
    assert kept is not None and kept.tolist() == np.bincount(labels, minlength=LISTS).tolist()
    assert int(kept.sum()) == index.count(where) == (CODES * COPIES + DISTINCT) // 4


def test_the_rows_kept_per_list_are_counted_only_for_a_search_that_probes_the_lists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`count` (all an exact search's scope asks) makes the mask alone; the first search that probes the lists
    counts their kept rows once, and the next one under the same filter reuses them."""
    index, distinct = _index()
    counted: list[int] = []
    real = vector_index._kept_per_list

    def counting(lists: vector_index._Lists, mask: np.ndarray) -> np.ndarray:
        counted.append(int(mask.sum()))
        return real(lists, mask)

    monkeypatch.setattr(vector_index, "_kept_per_list", counting)
    where = IndexFilter(cameras=["cam-2"])
    assert index.count(where) == (CODES * COPIES + DISTINCT) // 4
    assert counted == []
    index.nearest(distinct[CODES], where, 50)
    index.nearest(distinct[CODES + 1], where, 50)
    assert counted == [(CODES * COPIES + DISTINCT) // 4]


def test_a_change_in_place_makes_the_mask_again() -> None:
    """A row captioned again with another camera: the next count under the same filter sees it (the mask kept
    from the call before is not reused)."""
    index, distinct = _index()
    where = IndexFilter(cameras=["cam-0"])
    before = index.count(where)
    position = int(np.flatnonzero(index._state.columns.cameras[: index.size] == 1)[0])
    row_id = int(index._state.columns.ids[position])
    late = [(row_id, "cam-0", "2026-10-01T00:00:00", 1, "captioned", distinct[0].tobytes(), None)]
    with index._lock:
        index._replace(index._state, late)
    assert index.count(where) == before + 1
    assert (
        index._state.lists is not None
        and position in index._state.lists.moved
        and index._state.lists.runs[position] < 0
    )


def test_the_lists_leave_room_for_the_rows_before_the_next_build() -> None:
    """Columns built at capacity doubled on the first new caption (770 MB more at 10M rows): the build leaves room
    for as many rows as the lists take before they are stale, so appending them moves no column."""
    index, _ = _index()
    columns, lists = index._state.columns, index._state.lists
    assert lists is not None
    room = int(vector_index._STALE_SHARE * lists.covered)
    before = [id(getattr(columns, name)) for name in vector_index._COLUMN_NAMES]
    rows = np.arange(room, dtype=np.int64)
    columns.append(
        10**9 + rows, np.zeros((room, DIMENSIONS // 8), np.uint8), np.zeros(room, np.int32), rows,
        np.zeros(room, np.int32), np.zeros(room, np.int8),
    )  # fmt: skip
    assert [id(getattr(columns, name)) for name in vector_index._COLUMN_NAMES] == before
    assert not lists.stale(columns.size) and lists.stale(columns.size + 1)
