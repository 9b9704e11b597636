from __future__ import annotations

import pytest

from shardfuse.query.fusion import Fusion, convex, fuse, max_scaled, min_max, relative, rrf, rrf_weighted, weighted


def _leg(*ids: str) -> list[tuple[str, float]]:
    return [(chunk_id, float(len(ids) - i)) for i, chunk_id in enumerate(ids)]


def test_rrf_matches_hand_computed_scores() -> None:
    fused = rrf({"keyword": _leg("a", "b", "c"), "vector": _leg("c", "a", "d")}, k=60)
    scores = {hit.chunk_id: hit.score for hit in fused}
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [h.chunk_id for h in fused] == ["a", "c", "b", "d"]
    assert fused[0].ranks == {"keyword": 1, "vector": 2}
    assert fused[3].ranks == {"vector": 3}


def test_rrf_k_changes_how_much_top_ranks_dominate() -> None:
    legs = {"keyword": _leg("x", "a", "b", "y"), "vector": _leg("z", "c", "d", "y")}
    # y is fourth in both legs; x and z are first in one. k=1: 1/2 > 2/5, so one first place wins;
    # k=60: 2/64 > 1/61, so agreement between the legs wins.
    assert rrf(legs, k=1)[0].chunk_id in {"x", "z"}
    assert rrf(legs, k=60)[0].chunk_id == "y"


def test_rrf_weights_and_rrf_weighted() -> None:
    legs = {"keyword": _leg("a", "b"), "vector": _leg("b", "a")}
    assert rrf(legs, weights={"vector": 3.0})[0].chunk_id == "b"
    assert rrf_weighted(legs, alpha=0.9)[0].chunk_id == "b"
    assert rrf_weighted(legs, alpha=0.1)[0].chunk_id == "a"
    plain, half = rrf(legs), rrf_weighted(legs, alpha=0.5)
    assert [(h.chunk_id, h.score) for h in plain] == [(h.chunk_id, pytest.approx(h.score)) for h in half]


def test_weighted_uses_min_max_scores_and_alpha_on_the_vector_leg() -> None:
    legs = {"keyword": [("a", 10.0), ("b", 6.0), ("c", 2.0)], "vector": [("c", 0.9), ("b", 0.5), ("d", 0.1)]}
    scores = {h.chunk_id: h.score for h in weighted(legs, alpha=0.25)}
    # keyword normalised: a 1, b .5, c 0; vector normalised: c 1, b .5, d 0
    assert scores == pytest.approx({"a": 0.75, "b": 0.5, "c": 0.25, "d": 0.0})
    assert weighted(legs, alpha=1.0)[0].chunk_id == "c" and weighted(legs, alpha=0.0)[0].chunk_id == "a"
    with pytest.raises(ValueError):
        weighted(legs, alpha=1.5)


def test_convex_renormalises_weights_of_legs_that_are_off_and_normalises_again() -> None:
    legs = {"keyword": [("a", 4.0), ("b", 2.0), ("c", 0.0)], "vector": []}
    # the vector leg is empty (off): keyword takes the whole weight, scores end in [0, 1]
    assert {h.chunk_id: h.score for h in convex(legs, weights={"keyword": 0.3, "vector": 0.7})} == pytest.approx(
        {"a": 1.0, "b": 0.5, "c": 0.0}
    )
    both = {"keyword": [("a", 4.0), ("b", 0.0)], "vector": [("b", 1.0), ("a", 0.0)]}
    # raw: a = .25·1 + .75·0 = .25, b = .25·0 + .75·1 = .75 → normalised a 0, b 1
    assert {h.chunk_id: h.score for h in convex(both, weights={"keyword": 1, "vector": 3})} == pytest.approx(
        {"a": 0.0, "b": 1.0}
    )


def test_relative_keeps_the_gaps_a_leg_measured() -> None:
    # The vector leg scored a at a quarter of its best; min-max calls that 0, as it calls c's keyword score of
    # 0, so a and c tie. Relative to each leg's best, a keeps its quarter and ranks above c.
    legs = {"keyword": [("a", 10.0), ("b", 9.0), ("c", 0.0)], "vector": [("c", 0.8), ("b", 0.7), ("a", 0.2)]}
    assert [h.chunk_id for h in relative(legs)] == ["b", "a", "c"]
    tied = {h.chunk_id: h.score for h in convex(legs)}
    assert tied["a"] == pytest.approx(tied["c"])
    assert max_scaled([("a", 2.0), ("b", 1.0)]) == {"a": 1.0, "b": 0.5}
    assert max_scaled([("a", -1.0), ("b", -3.0)]) == {"a": 1.0, "b": 0.0}  # no positive best: min-max
    # a candidate a leg missed counts as that leg's weakest, not as 0
    missed = relative({"keyword": [("a", 4.0), ("b", 2.0)], "vector": [("b", 1.0), ("c", 0.5)]})
    raw = {"a": 0.5 * 1 + 0.5 * 0.5, "b": 0.5 * 0.5 + 0.5 * 1, "c": 0.5 * 0.5 + 0.5 * 0.5}
    low, high = min(raw.values()), max(raw.values())
    assert {h.chunk_id: h.score for h in missed} == pytest.approx({k: (v - low) / (high - low) for k, v in raw.items()})


def test_a_complete_leg_of_one_hit_puts_that_hit_first() -> None:
    # A word only one document holds: the keyword leg finds it alone, the vector leg (which always fills its
    # depth) ranks it low. Counted as the leg's weakest, every candidate the keyword leg missed would score
    # that one hit's score, and the hit would fall to the bottom of the default fusion.
    legs = {"keyword": [("unique", 7.5)], "vector": [("a", 0.9), ("b", 0.8), ("c", 0.7), ("unique", 0.6)]}
    ranked = [h.chunk_id for h in fuse(Fusion.RELATIVE, legs, alpha=0.6, complete={"keyword"})]
    assert ranked[0] == "unique"
    assert [h.chunk_id for h in fuse(Fusion.RELATIVE, legs, alpha=0.6)][-1] == "unique"  # the leg not complete
    # Complete or not, a leg with more hits than that keeps its order among them, and every other method is
    # untouched by the flag.
    full = {"keyword": [("a", 4.0), ("b", 2.0)], "vector": [("b", 1.0), ("c", 0.5)]}
    done = {h.chunk_id: h.score for h in relative(full, complete={"keyword"})}
    assert done["a"] > done["c"] and done["b"] == 1.0
    for method in Fusion:
        assert fuse(method, full, complete={"keyword"}) == fuse(method, full) or method is Fusion.RELATIVE


def test_min_max_edge_cases_and_dispatch() -> None:
    assert min_max([]) == {} and min_max([("a", 3.0), ("b", 3.0)]) == {"a": 1.0, "b": 1.0}
    legs = {"keyword": _leg("a", "b"), "vector": _leg("b", "a")}
    for method in Fusion:
        fused = fuse(method, legs, alpha=0.5, rrf_k=60)
        assert {h.chunk_id for h in fused} == {"a", "b"}
    assert [h.chunk_id for h in rrf({"keyword": _leg("b", "a", "c")})] == ["b", "a", "c"]
    assert rrf({}) == [] and rrf({"keyword": []}) == []
    with pytest.raises(ValueError):
        rrf({"keyword": _leg("a")}, k=0)


def test_equal_scores_share_a_rank_whatever_order_the_ids_put_them_in() -> None:
    # Two deployments of one corpus give a tie's members different chunk ids (they hold the publisher's seq),
    # so the order within a tie differs; the ranks a user sees, and RRF's scores, must not.
    one = rrf({"keyword": [("p", 3.0), ("q", 2.0), ("r", 2.0), ("s", 1.0)]})
    other = rrf({"keyword": [("p", 3.0), ("r", 2.0), ("q", 2.0), ("s", 1.0)]})
    for fused in (one, other):
        ranks = {hit.chunk_id: hit.ranks["keyword"] for hit in fused}
        assert ranks == {"p": 1, "q": 2, "r": 2, "s": 4}
        scores = {hit.chunk_id: hit.score for hit in fused}
        assert scores["q"] == scores["r"] == pytest.approx(1 / 62)
        assert scores["s"] == pytest.approx(1 / 64)
    assert [h.chunk_id for h in one] == [h.chunk_id for h in other] == ["p", "q", "r", "s"]
