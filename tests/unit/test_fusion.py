from __future__ import annotations

import pytest

from query.fusion import rrf


def test_rrf_matches_hand_computed_scores() -> None:
    fused = rrf({"keyword": ["a", "b", "c"], "vector": ["c", "a", "d"]}, k=60)
    scores = {hit.chunk_id: hit.score for hit in fused}
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [h.chunk_id for h in fused] == ["a", "c", "b", "d"]
    assert fused[0].ranks == {"keyword": 1, "vector": 2}
    assert fused[3].ranks == {"vector": 3}


def test_rrf_k_changes_how_much_top_ranks_dominate() -> None:
    legs = {"keyword": ["x", "a", "b", "y"], "vector": ["z", "c", "d", "y"]}
    # y is fourth in both legs; x and z are first in one. k=1: 1/2 > 2/5, so one first place wins;
    # k=60: 2/64 > 1/61, so agreement between the legs wins.
    assert rrf(legs, k=1)[0].chunk_id in {"x", "z"}
    assert rrf(legs, k=60)[0].chunk_id == "y"


def test_rrf_single_leg_keeps_its_order_and_edge_cases() -> None:
    assert [h.chunk_id for h in rrf({"keyword": ["b", "a", "c"]})] == ["b", "a", "c"]
    assert rrf({}) == [] and rrf({"keyword": []}) == []
    duplicated = rrf({"keyword": ["a", "a", "b"]})
    assert duplicated[0].score == pytest.approx(1 / 61) and duplicated[0].ranks == {"keyword": 1}
    with pytest.raises(ValueError):
        rrf({"keyword": ["a"]}, k=0)
