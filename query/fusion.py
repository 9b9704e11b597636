"""Rank fusion, as pure functions over each leg's ranked ``(id, score)`` lists (best first).

- :func:`rrf` — reciprocal rank fusion (Cormack et al., 2009), optionally weighted per leg;
- :func:`weighted` — min-max normalised scores, ``alpha`` on the vector leg, ``1 - alpha`` on keyword;
- :func:`rrf_weighted` — RRF with ``alpha`` on the vector leg (``alpha = 0.5`` is plain RRF);
- :func:`convex` — per-leg min-max normalisation, a weighted sum whose weights are renormalised over the
  legs that are on, then min-max normalised again, so scores are comparable across queries;
- :func:`relative` — the same sum over scores relative to each leg's best (``score / best``), a candidate a
  leg missed counting as that leg's weakest — or as 0 when the leg is *complete* (it returned every
  candidate it scores above zero: a rare word's keyword leg holds fewer hits than it was asked for). Min-max
  gives a leg's last candidate 0 however close it scored to the first, and a candidate the leg missed 0 too;
  dividing by the best keeps the gaps the leg measured. On SciFact train (BM25 + all-MiniLM-L6-v2, document
  level) it beat min-max by ~0.005–0.008 nDCG@10.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

KEYWORD = "keyword"
VECTOR = "vector"

Leg = Sequence[tuple[str, float]]  # (chunk id, raw score), best first


class Fusion(enum.StrEnum):
    RRF = "rrf"
    WEIGHTED = "weighted"
    RRF_WEIGHTED = "rrf_weighted"
    CONVEX = "convex"
    RELATIVE = "relative"


@dataclass(frozen=True, slots=True)
class FusedHit:
    """A fused result: its fused score and, per leg, its 1-based rank (absent when the leg missed it)."""

    chunk_id: str
    score: float
    ranks: Mapping[str, int] = field(default_factory=dict)


def _ranks(legs: Mapping[str, Leg]) -> dict[str, dict[str, int]]:
    """Each candidate's 1-based rank per leg. Equal scores share the rank of the first of them (competition
    ranking): the order among ties is only the chunk ids' order, and chunk ids hold the publisher's sequence,
    so the same corpus published twice would otherwise rank (and RRF-score) its ties differently."""
    ranks: dict[str, dict[str, int]] = {}
    for leg, hits in legs.items():
        rank, previous = 0, None
        for position, (chunk_id, score) in enumerate(hits, start=1):
            if score != previous:
                rank, previous = position, score
            ranks.setdefault(chunk_id, {}).setdefault(leg, rank)  # a repeated id keeps its best rank
    return ranks


def _ordered(scores: dict[str, float], ranks: dict[str, dict[str, int]]) -> list[FusedHit]:
    # Ties: the better single-leg rank first, then the id, so the output is deterministic.
    ordered = sorted(scores, key=lambda c: (-scores[c], min(ranks[c].values()), c))
    return [FusedHit(chunk_id=c, score=scores[c], ranks=ranks[c]) for c in ordered]


def rrf(legs: Mapping[str, Leg], *, k: int = 60, weights: Mapping[str, float] | None = None) -> list[FusedHit]:
    """``score(d) = Σ_leg w_leg / (k + rank_leg(d))``; weights default to 1."""
    if k < 1:
        raise ValueError("rrf k must be at least 1")
    ranks = _ranks(legs)
    scores = {
        chunk_id: sum((weights or {}).get(leg, 1.0) / (k + rank) for leg, rank in leg_ranks.items())
        for chunk_id, leg_ranks in ranks.items()
    }
    return _ordered(scores, ranks)


def rrf_weighted(legs: Mapping[str, Leg], *, alpha: float = 0.5, k: int = 60) -> list[FusedHit]:
    """RRF with weight ``2·alpha`` on the vector leg and ``2·(1 − alpha)`` on the keyword leg."""
    _check_alpha(alpha)
    return rrf(legs, k=k, weights={VECTOR: 2 * alpha, KEYWORD: 2 * (1 - alpha)})


def min_max(hits: Leg) -> dict[str, float]:
    """Scores scaled to [0, 1] within one leg; a leg whose scores are all equal scores 1.0 throughout."""
    if not hits:
        return {}
    scores = [score for _, score in hits]
    low, high = min(scores), max(scores)
    span = high - low
    normalised: dict[str, float] = {}
    for chunk_id, score in hits:
        normalised.setdefault(chunk_id, (score - low) / span if span > 0 else 1.0)
    return normalised


def max_scaled(hits: Leg) -> dict[str, float]:
    """Scores divided by the leg's best (at most 1.0); a leg whose best is not positive is min-max scaled."""
    if not hits:
        return {}
    best = max(score for _, score in hits)
    if best <= 0:
        return min_max(hits)
    scaled: dict[str, float] = {}
    for chunk_id, score in hits:
        scaled.setdefault(chunk_id, score / best)
    return scaled


def weighted(legs: Mapping[str, Leg], *, alpha: float = 0.5) -> list[FusedHit]:
    """``alpha · vector + (1 − alpha) · keyword`` over min-max normalised scores (0 where a leg missed)."""
    _check_alpha(alpha)
    return _linear(legs, {VECTOR: alpha, KEYWORD: 1 - alpha}, renormalise=False)


def convex(legs: Mapping[str, Leg], *, weights: Mapping[str, float] | None = None) -> list[FusedHit]:
    """Normalise each leg, sum with ``weights`` renormalised over the legs present (a leg that is off —
    absent, or weight 0 — gives its share to the others), then min-max normalise the fused scores."""
    return _linear(legs, weights or {leg: 1.0 for leg in legs}, renormalise=True)


def relative(legs: Mapping[str, Leg], *, weights: Mapping[str, float] | None = None,
             complete: Collection[str] = ()) -> list[FusedHit]:
    """:func:`convex` over scores relative to each leg's best (:func:`max_scaled`); a candidate a leg missed
    scores that leg's lowest scaled score, not 0 (the leg ranked it below everything it returned) — unless
    the leg is in ``complete``: it returned every candidate it scores at all, so a candidate it missed scored
    0. Without that, a leg of one hit (a word only one document holds) would give every candidate it missed
    its one hit's score, and add nothing to that hit's rank."""
    return _linear(legs, weights or {leg: 1.0 for leg in legs}, renormalise=True, scale=max_scaled, floor=True,
                   complete=complete)


def _linear(legs: Mapping[str, Leg], weights: Mapping[str, float], *, renormalise: bool,
            scale: Callable[[Leg], dict[str, float]] = min_max, floor: bool = False,
            complete: Collection[str] = ()) -> list[FusedHit]:
    if any(w < 0 for w in weights.values()):
        raise ValueError("fusion weights must not be negative")
    active = {leg: weights.get(leg, 0.0) for leg in legs if weights.get(leg, 0.0) > 0 and legs[leg]}
    if renormalise and active:
        total = sum(active.values())
        active = {leg: w / total for leg, w in active.items()}
    ranks = _ranks(legs)
    scores = dict.fromkeys(ranks, 0.0)
    for leg, weight in active.items():
        values = scale(legs[leg])
        missed = min(values.values()) if floor and values and leg not in complete else 0.0
        for chunk_id in scores:
            scores[chunk_id] += weight * values.get(chunk_id, missed)
    if renormalise:
        scores = min_max(list(scores.items())) if scores else scores
    return _ordered(scores, ranks)


def _check_alpha(alpha: float) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be within 0..1, got {alpha}")


def leg_kind(leg: str) -> str:
    """The kind of a leg: expansion legs are named ``keyword+…`` / ``vector+…`` after the leg they extend."""
    return leg.split("+", 1)[0]


def fuse(
    method: Fusion,
    legs: Mapping[str, Leg],
    *,
    alpha: float = 0.5,
    rrf_k: int = 60,
    weights: Mapping[str, float] | None = None,
    complete: Collection[str] = (),
) -> list[FusedHit]:
    """Fuse with the named method (the request's ``fusion``).

    ``weights`` (default 1 per leg) scale each leg on top of the method's own weighting: the router's lean
    and the smaller share of expansion legs. ``alpha`` splits the alpha-based methods between the vector
    kind and the keyword kind of legs. ``complete`` names the legs that returned every candidate they score
    (:func:`relative`'s missed candidates).
    """
    base = {leg: (weights or {}).get(leg, 1.0) for leg in legs}
    _check_alpha(alpha)
    split = {leg: w * (alpha if leg_kind(leg) == VECTOR else 1 - alpha) for leg, w in base.items()}
    methods: dict[Fusion, Callable[[], list[FusedHit]]] = {
        Fusion.RRF: lambda: rrf(legs, k=rrf_k, weights=base),
        Fusion.RRF_WEIGHTED: lambda: rrf(legs, k=rrf_k, weights={leg: 2 * w for leg, w in split.items()}),
        Fusion.WEIGHTED: lambda: _linear(legs, split, renormalise=False),
        Fusion.CONVEX: lambda: convex(legs, weights=split),
        Fusion.RELATIVE: lambda: relative(legs, weights=split, complete=complete),
    }
    return methods[method]()
