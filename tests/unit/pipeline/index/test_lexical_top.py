"""Property: a shard search's top-k cut keeps exactly the k best positive scores, ties broken by the lowest chunk id,
whether the sample's floor applies (arrays many times longer than k) or not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardfuse.pipeline.index.lexical.top_k import SAMPLE_STRIDE, top_positions

# Few distinct values, many of them zero: ties at the cut and zero runs, as in a shard's BM25 scores.
VALUES = np.asarray([0.0, 0.0, 0.0, 0.5, 1.0, 1.5, 2.25, 3.0], dtype=np.float32)


def _expected(scores: np.ndarray, k: int, ids: np.ndarray) -> list[int]:
    ranked = sorted((i for i in range(len(scores)) if scores[i] > 0), key=lambda i: (-scores[i], ids[i]))
    return sorted(ranked[:k])


@settings(max_examples=200, deadline=None)
@given(size=st.integers(min_value=0, max_value=4000), k=st.integers(min_value=0, max_value=120),
       seed=st.integers(0, 2**16))
def test_top_keeps_the_k_best_positive_scores_and_the_lowest_ids_among_ties(size: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.choice(VALUES, size)
    # Ids in an order unrelated to the positions, so "lowest id" is not "first position".
    ids = np.asarray([f"c{n:05d}" for n in rng.permutation(size)], dtype=np.str_)

    assert sorted(top_positions(scores, k, ids).tolist()) == _expected(scores, k, ids)


def test_the_sample_floor_is_used_and_exact_on_a_shard_sized_array() -> None:
    """25,000 scores, 70 % of them positive, k 30: the sample holds enough positive scores for its floor."""
    rng = np.random.default_rng(7)
    scores = np.where(rng.random(25_000) < 0.7, rng.gamma(2.0, 1.0, 25_000), 0.0).astype(np.float32)
    scores[rng.choice(25_000, 40, replace=False)] = scores.max()  # a tie across the cut
    ids = np.asarray([f"c{n:05d}" for n in range(25_000)], dtype=np.str_)
    assert np.count_nonzero(scores[::SAMPLE_STRIDE] > 0) >= 30

    assert sorted(top_positions(scores, 30, ids).tolist()) == _expected(scores, 30, ids)
