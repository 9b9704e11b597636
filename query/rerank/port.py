"""The reranker port: scores for (query, text) pairs, and the failures only a reranker has.

An adapter raises only our exception tree: :class:`~shardfuse.pipeline.core.errors.TransientError` for what a
retry within the budget may cure (a 429, a 5xx, a timeout, a connection refused, an answer that does not
parse), :class:`~shardfuse.pipeline.core.errors.PermanentError` for what it cannot (a rejected key, an unknown
model). The stage (:mod:`shardfuse.query.rerank.stage`) turns either into the fused order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from shardfuse.pipeline.core.errors import EmbeddingProviderError


class Reranker(Protocol):
    """Scores texts against a query: one score per text, in the texts' order, higher is more relevant."""

    @property
    def name(self) -> str:
        """The provider and model, as answers and logs name it (``cohere:rerank-v3.5``); never a key."""
        ...

    def rerank(self, query: str, texts: Sequence[str], *, timeout_s: float) -> list[float]:
        """Scores for ``texts`` (at least one), within ``timeout_s`` or a :class:`RerankTimeoutError`."""
        ...

    def close(self) -> None: ...


class RerankTimeoutError(EmbeddingProviderError):
    """The reranker did not answer within what was left of the rerank budget."""


class MalformedRerankError(EmbeddingProviderError):
    """The reranker answered with something that is not a score for each text (not JSON, a missing or repeated
    index, a score that is not a finite number)."""


def scores_by_index(pairs: Sequence[tuple[object, object]], count: int, *, source: str) -> list[float]:
    """One score per text from an answer's ``(index, score)`` pairs, each index ``0 … count-1`` exactly once;
    :class:`MalformedRerankError` otherwise."""
    scores: list[float | None] = [None] * count
    for index, score in pairs:
        if type(index) is not int or not 0 <= index < count:
            raise MalformedRerankError(f"{source} answered with index {index!r} for {count} texts")
        if scores[index] is not None:
            raise MalformedRerankError(f"{source} answered twice for text {index}")
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise MalformedRerankError(f"{source} answered with score {score!r} for text {index}")
        scores[index] = float(score)
    missing = [i for i, score in enumerate(scores) if score is None]
    if missing:
        raise MalformedRerankError(f"{source} scored {count - len(missing)} of {count} texts (none for {missing[:5]})")
    return [float(score) for score in scores if score is not None]
