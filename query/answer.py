"""The answer a search returns (the ``shardfuse.search`` task's JSON): ranked results with their scores and
ranks per leg, the route taken, timings and the shards' generations. Plain functions over plain data.

A result's ``start_line``/``end_line`` are what to show: the lines of the definition the query names when
the chunk holds one (``symbol``: ``{name, start_line, end_line}``, :mod:`shardfuse.query.symbol_ranges`), else
the chunk's; ``chunk_start_line``/``chunk_end_line`` are always the chunk's. ``metadata`` is the document's
(the write event's), and its ``title``, ``url`` and ``source`` are also given on their own for attribution
(None when absent or not a string)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.boosts import Boost, QueryTerms
from shardfuse.query.fusion import KEYWORD, VECTOR, FusedHit
from shardfuse.query.hydration import file_key
from shardfuse.query.ranking import diversify, snippet
from shardfuse.query.request import SearchRequest
from shardfuse.query.router import Route
from shardfuse.query.symbol_ranges import symbol_range

# A fused hit with its chunk, its boosted score and the boost behind it (boosts.rerank's output).
Ranked = tuple[tuple[FusedHit, ChunkRecord], float, Boost]
# Metadata keys a result also carries on their own, for attribution.
ATTRIBUTION = ("title", "url", "source")


def results(
    ranked: Sequence[Ranked], *, k: int, leg_scores: Mapping[str, Mapping[str, float]], located: Mapping[str, int],
    settings: QuerySettings, query_terms: QueryTerms | None = None, min_score: float | None = None,
    include_text: bool = True, max_per_file: int | None = None,
) -> list[dict[str, Any]]:
    """The top ``k`` of ``ranked`` scoring at least ``min_score``, after at most ``max_per_file`` per file
    (None: no cap); the first ``full_text_top_n`` carry their chunk's text, the rest a snippet, none any with
    ``include_text=False``. With ``query_terms``, a result whose chunk defines what the query names gets that
    definition's lines."""
    kept = ranked if min_score is None else [entry for entry in ranked if entry[1] >= min_score]
    per_file = diversify(kept, key=lambda r: file_key(r[0][1]), max_per_key=max_per_file)
    found = []
    for rank, entry in enumerate(islice(per_file, k), start=1):
        result = _result(rank, entry, leg_scores=leg_scores, shard=located[entry[0][0].chunk_id], settings=settings)
        if not include_text:
            del result["text"], result["truncated"]
        _add_lines(result, entry[0][1], query_terms)
        _add_attribution(result, entry[0][1])
        found.append(result)
    return found


def _add_lines(result: dict[str, Any], record: ChunkRecord, query_terms: QueryTerms | None) -> None:
    named = None if query_terms is None else symbol_range(
        query_terms, record.symbol_lines, start_line=record.start_line, end_line=record.end_line)
    result["symbol"] = None if named is None else named.to_json()
    if named is not None:
        result["start_line"], result["end_line"] = named.start_line, named.end_line


def _add_attribution(result: dict[str, Any], record: ChunkRecord) -> None:
    result["metadata"] = dict(record.metadata)
    for key in ATTRIBUTION:
        value = record.metadata.get(key)
        result[key] = value if isinstance(value, str) else None


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
        "chunk_start_line": record.start_line,
        "chunk_end_line": record.end_line,
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
    generations: Mapping[str, int | None], candidates: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The whole answer to ``request``, searched with the embedding model ``model``; ``candidates``: how many
    each leg brought to fusion, how many fused and how many were hydrated (:func:`candidate_counts`)."""
    return {
        "query": request.query,
        "zone": request.zone,
        "zones": list(request.zones),
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
        "candidates": dict(candidates or {}),
    }


def candidate_counts(legs: Mapping[str, int], *, fused: int, hydrated: int) -> dict[str, Any]:
    """The candidates a search considered: per leg (``keyword``, ``vector``, expansion legs ``keyword+1`` …),
    after fusion (distinct chunks), and hydrated (fetched and still present, so ranked)."""
    return {"legs": dict(legs), "fused": fused, "hydrated": hydrated}
