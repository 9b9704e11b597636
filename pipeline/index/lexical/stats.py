"""Zone-wide term statistics, so BM25 scores do not depend on how documents are spread over shards.

Each shard's bm25s index bakes in IDFs computed over the shard's own documents, every zone together. A
query gathers, from every shard, how many of the zone's documents it holds and how many contain each query
term (:class:`TermStats`), sums them (:func:`combine`), and each shard then rescales its stored per-term
scores by ``zone_idf / shard_idf`` — Elasticsearch's ``dfs_query_then_fetch``, done in one process because
a query worker searches every shard itself. Only the length normalisation (the shard's average document
length) stays local.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TermStats:
    """How many of a zone's documents a shard (or all shards) holds, and how many contain each term."""

    docs: int = 0
    df: Mapping[str, int] = field(default_factory=dict)

    def idf(self, term: str) -> float:
        """Lucene's BM25 IDF of ``term`` over these documents (the variant bm25s's ``lucene`` method uses)."""
        return lucene_idf(self.df.get(term, 0), self.docs)


def lucene_idf(df: int, docs: int) -> float:
    """``log(1 + (N - df + 0.5) / (df + 0.5))``: always positive, so a rescale never divides by zero."""
    return math.log(1.0 + (docs - df + 0.5) / (df + 0.5))


def combine(parts: Iterable[TermStats]) -> TermStats:
    """The statistics of the union of disjoint document sets (one per shard)."""
    docs = 0
    df: dict[str, int] = {}
    for part in parts:
        docs += part.docs
        for term, count in part.df.items():
            df[term] = df.get(term, 0) + count
    return TermStats(docs=docs, df=df)
