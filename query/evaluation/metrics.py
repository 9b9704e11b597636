"""Ranking metrics over one query: a ranked list of document ids against graded relevance judgments.

Definitions follow BEIR/pytrec_eval: nDCG with gain = grade and discount log2(rank + 1), the ideal list
built from the judgments; Recall@k over the documents judged relevant (grade > 0); MRR@k the reciprocal
rank of the first relevant document within the top k.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def _relevant(qrels: Mapping[str, int]) -> dict[str, int]:
    return {doc: grade for doc, grade in qrels.items() if grade > 0}


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Normalised discounted cumulative gain of the top ``k``; 0.0 when nothing is judged relevant."""
    relevant = _relevant(qrels)
    if not relevant:
        return 0.0
    dcg = sum(relevant.get(doc, 0) / math.log2(rank + 1) for rank, doc in enumerate(ranked[:k], start=1))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(grade / math.log2(rank + 1) for rank, grade in enumerate(ideal, start=1))
    return dcg / idcg


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents found in the top ``k``."""
    relevant = _relevant(qrels)
    if not relevant:
        return 0.0
    return len(relevant.keys() & set(ranked[:k])) / len(relevant)


def mrr_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """1 / rank of the first relevant document in the top ``k``; 0.0 if there is none."""
    relevant = _relevant(qrels)
    for rank, doc in enumerate(ranked[:k], start=1):
        if doc in relevant:
            return 1.0 / rank
    return 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0–100) by linear interpolation between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
