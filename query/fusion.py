"""Rank fusion, as pure functions over ranked id lists."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class FusedHit:
    """A fused result: its fused score and, per leg, its 1-based rank (absent when the leg missed it)."""

    chunk_id: str
    score: float
    ranks: Mapping[str, int] = field(default_factory=dict)


def rrf(legs: Mapping[str, Sequence[str]], *, k: int = 60) -> list[FusedHit]:
    """Reciprocal rank fusion (Cormack et al., 2009): ``score(d) = Σ_leg 1 / (k + rank_leg(d))``.

    ``legs`` maps a leg name to its ids, best first. Ties are broken by the best single-leg rank, then by
    id, so the output is deterministic.
    """
    if k < 1:
        raise ValueError("rrf k must be at least 1")
    scores: dict[str, float] = {}
    ranks: dict[str, dict[str, int]] = {}
    for leg, ids in legs.items():
        for rank, chunk_id in enumerate(ids, start=1):
            leg_ranks = ranks.setdefault(chunk_id, {})
            if leg in leg_ranks:  # a leg that lists an id twice counts its best rank once
                continue
            leg_ranks[leg] = rank
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + rank)
    ordered = sorted(scores, key=lambda c: (-scores[c], min(ranks[c].values()), c))
    return [FusedHit(chunk_id=c, score=scores[c], ranks=ranks[c]) for c in ordered]
