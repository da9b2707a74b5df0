"""The labelled sets of the search-quality benchmark and its measures: the second set keeps the queries that were
written before it (benchmarks/search_quality/building-site-queries.json, committed first), every label points at a
caption, and nDCG@10 and recall@5 score rankings as defined."""

from __future__ import annotations

import json
import math

import pytest

from visioncap.bench.common.machine import REPO
from visioncap.bench.search.quality import SETS, evaluate, load_set, ndcg, recall


def test_the_second_set_asks_the_queries_written_before_it() -> None:
    written = json.loads((REPO / "benchmarks" / "search_quality" / "building-site-queries.json").read_text())
    labelled = load_set(SETS["building-site"])
    assert [query for query, _ in labelled.queries] == written["queries"]


@pytest.mark.parametrize("name", sorted(SETS))
def test_every_label_points_at_a_caption_and_every_query_has_enough(name: str) -> None:
    labelled = load_set(SETS[name])
    assert len(set(labelled.captions)) == len(labelled.captions), "a caption twice"
    for query, relevant in labelled.queries:
        assert len(relevant) >= 5 and len(set(relevant)) == len(relevant), query
        assert all(1 <= caption_id <= len(labelled.captions) for caption_id in relevant), query


def test_ndcg_and_recall_score_rankings_as_defined() -> None:
    relevant = [1, 2, 3]
    assert ndcg([1, 2, 3, 9], relevant) == pytest.approx(1.0)
    assert ndcg([9, 8, 7], relevant) == 0.0
    # One relevant caption, found second: 1/log2(3) over the ideal 1/log2(2) + 1/log2(3) + 1/log2(4).
    ideal = 1 + 1 / math.log2(3) + 0.5
    assert ndcg([9, 1], relevant) == pytest.approx((1 / math.log2(3)) / ideal)
    assert ndcg([9] * 10 + [1], relevant) == 0.0, "a hit past the tenth place counts nothing"
    assert recall([1, 9, 2, 8, 7, 3], relevant) == pytest.approx(2 / 3)


def test_evaluate_reports_both_measures_per_mode() -> None:
    labelled = load_set(SETS["building-site"])
    first_query, relevant = labelled.queries[0]

    def perfect(params: dict[str, object]) -> list[int]:
        text = params.get("q") or params.get("semantic")
        found = relevant if text == first_query else []
        return list(found)[: int(params["limit"])]  # type: ignore[call-overload]

    result = evaluate(perfect, labelled)
    assert result["queries"][0]["semantic"] == 1.0 and result["queries"][0]["semantic_ndcg"] == pytest.approx(1.0)
    share = 1 / len(labelled.queries)
    assert result["recall_at_5"]["words"] == pytest.approx(share)
    assert result["ndcg_at_10"]["hybrid"] == pytest.approx(share)
