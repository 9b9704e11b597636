"""The answer a search returns (the ``shardfuse.search`` task's JSON): ranked results with their scores and
ranks per leg, the route taken, timings and the shards' generations. Plain functions over plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.boosts import Boost
from shardfuse.query.fusion import KEYWORD, VECTOR, FusedHit
from shardfuse.query.ranking import diversify, snippet
from shardfuse.query.request import SearchRequest
from shardfuse.query.router import Route

# A fused hit with its chunk, its boosted score and the boost behind it (boosts.rerank's output).
Ranked = tuple[tuple[FusedHit, ChunkRecord], float, Boost]


def results(
    ranked: Sequence[Ranked], *, k: int, leg_scores: Mapping[str, Mapping[str, float]], located: Mapping[str, int],
    settings: QuerySettings,
) -> list[dict[str, Any]]:
    """The top ``k`` of ``ranked`` after at most ``max_chunks_per_file`` per file; the first
    ``full_text_top_n`` carry their chunk's text, the rest a snippet."""
    per_file = diversify(ranked, key=lambda r: r[0][1].path, max_per_key=settings.max_chunks_per_file or None)
    return [
        _result(rank, entry, leg_scores=leg_scores, shard=located[entry[0][0].chunk_id], settings=settings)
        for rank, entry in enumerate(islice(per_file, k), start=1)
    ]


def _result(
    rank: int, entry: Ranked, *, leg_scores: Mapping[str, Mapping[str, float]], shard: int, settings: QuerySettings
) -> dict[str, Any]:
    (hit, record), score, boost = entry
    full = rank <= settings.full_text_top_n
    return {
        "rank": rank,
        "chunk_id": record.chunk_id,
        "zone": record.zone,
        "path": record.path,
        "start_line": record.start_line,
        "end_line": record.end_line,
        "language": record.language,
        "heading_path": list(record.heading_path),
        "symbols": list(record.symbols),
        "primary_symbol": record.primary_symbol,
        "role": record.role,
        "text": record.text if full else snippet(record.text, max_chars=settings.snippet_chars),
        "truncated": not full and len(record.text) > settings.snippet_chars,
        "score": score,
        "fused_score": hit.score,
        "boost": boost.factor,
        "boost_reasons": list(boost.reasons),
        "keyword_score": leg_scores.get(KEYWORD, {}).get(hit.chunk_id),
        "vector_score": leg_scores.get(VECTOR, {}).get(hit.chunk_id),
        "keyword_rank": hit.ranks.get(KEYWORD),
        "vector_rank": hit.ranks.get(VECTOR),
        "shard": shard,
    }


def answer(
    request: SearchRequest, *, model: str, results: list[dict[str, Any]], plan: Route, timings: Mapping[str, float],
    generations: Mapping[str, int | None],
) -> dict[str, Any]:
    """The whole answer to ``request``, searched with the embedding model ``model``."""
    return {
        "query": request.query,
        "zone": request.zone,
        "mode": request.mode.value,
        "fusion": request.fusion.value,
        "k": request.k,
        "model": model,
        "results": results,
        "route": {
            "complexity": round(plan.complexity, 3),
            "limit_multiplier": round(plan.limit_multiplier, 3),
            "keyword_weight": round(plan.keyword_weight, 3),
            "vector_weight": round(plan.vector_weight, 3),
        },
        "timings_ms": {name: round(value, 3) for name, value in timings.items()},
        "shards": {"queried": len(generations), "bm25_generations": dict(generations)},
    }
