"""Answering one search: fan out to every shard, merge each leg, fuse, hydrate."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.embeddings import Embedder
from pipeline.store import ChunkRecord
from query.cache import ResultCache, cache_key
from query.fusion import KEYWORD, VECTOR, fuse
from query.ranking import diversify, snippet
from query.request import SearchRequest
from query.shards import LegHit, ShardSearcher


@dataclass(frozen=True, slots=True)
class _Leg:
    hits: list[tuple[int, LegHit]]  # (shard, hit), best first after merging
    ms: float


class SearchService:
    """Stateless query logic over a set of shards: any instance can answer any query."""

    def __init__(
        self,
        *,
        shards: Sequence[ShardSearcher],
        embedder: Embedder,
        over_fetch: int = 3,
        rrf_k: int = 60,
        max_chunks_per_file: int = 3,
        full_text_top_n: int = 8,
        snippet_chars: int = 240,
        cache: ResultCache | None = None,
        write_versions: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        self._shards = list(shards)
        self._embedder = embedder
        self._over_fetch = over_fetch
        self._rrf_k = rrf_k
        self._max_per_file = max_chunks_per_file or None
        self._full_text_top_n = full_text_top_n
        self._snippet_chars = snippet_chars
        self._cache = cache
        # Per shard, a counter every committed write bumps: part of the cache key.
        self._write_versions = write_versions
        # Two legs per shard run at once; the pool lives as long as the service (one per worker process).
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self._shards)), thread_name_prefix="shard")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def search(self, request: SearchRequest, *, use_cache: bool = True) -> dict[str, Any]:
        """Answer ``request``, from the result cache when the shards have not changed since."""
        if not use_cache or self._cache is None or self._write_versions is None:
            return self._search(request)
        started = time.perf_counter()
        versions = self._write_versions()
        generations = [shard.current_generation() for shard in self._shards]
        key = cache_key(request, shard_state=list(zip(versions, generations, strict=True)))
        cached = self._cache.get(key)
        if cached is not None:
            cached["cache"] = "hit"
            cached["timings_ms"] = {"total": round(_ms(started), 3), "computed": cached["timings_ms"]}
            return cached
        answer = self._search(request)
        self._cache.put(key, answer)
        answer["cache"] = "miss"
        return answer

    def _search(self, request: SearchRequest) -> dict[str, Any]:
        started = time.perf_counter()
        limit = request.k * self._over_fetch
        timings: dict[str, float] = {}

        embedding: npt.NDArray[np.float32] | None = None
        if request.mode.uses_vector:
            t = time.perf_counter()
            embedding = self._embedder.embed_query(request.query)
            timings["embed"] = _ms(t)

        pending: dict[str, list[tuple[int, Future[tuple[list[LegHit], float]]]]] = {KEYWORD: [], VECTOR: []}
        for shard in self._shards:
            if request.mode.uses_keyword:
                pending[KEYWORD].append(
                    (shard.shard, self._pool.submit(_timed, shard.keyword, request.query, request, limit))
                )
            if embedding is not None:
                pending[VECTOR].append(
                    (shard.shard, self._pool.submit(_timed, shard.vector, embedding, request, limit))
                )
        legs = {name: _merge(futures, limit) for name, futures in pending.items() if futures}
        for name, leg in legs.items():
            timings[name] = leg.ms

        t = time.perf_counter()
        fused = fuse(
            request.fusion,
            {name: [(h.chunk_id, h.score) for _, h in leg.hits] for name, leg in legs.items()},
            alpha=request.alpha,
            rrf_k=request.rrf_k or self._rrf_k,
        )
        timings["fuse"] = _ms(t)

        t = time.perf_counter()
        located = {h.chunk_id: shard for leg in legs.values() for shard, h in leg.hits}
        leg_scores = {name: {h.chunk_id: h.score for _, h in leg.hits} for name, leg in legs.items()}
        records = self._hydrate([f.chunk_id for f in fused], located, request.zone)
        timings["hydrate"] = _ms(t)

        # Chunks replaced or deleted since their BM25 generation was built do not hydrate: drop them.
        present = ((hit, records[hit.chunk_id]) for hit in fused if hit.chunk_id in records)
        results: list[dict[str, Any]] = []
        for hit, record in diversify(present, key=lambda pair: pair[1].path, max_per_key=self._max_per_file):
            full = len(results) < self._full_text_top_n
            results.append(
                {
                    "rank": len(results) + 1,
                    "chunk_id": record.chunk_id,
                    "zone": record.zone,
                    "path": record.path,
                    "start_line": record.start_line,
                    "end_line": record.end_line,
                    "text": record.text if full else snippet(record.text, max_chars=self._snippet_chars),
                    "truncated": not full and len(record.text) > self._snippet_chars,
                    "score": hit.score,
                    "fused_score": hit.score,
                    "keyword_score": leg_scores.get(KEYWORD, {}).get(hit.chunk_id),
                    "vector_score": leg_scores.get(VECTOR, {}).get(hit.chunk_id),
                    "keyword_rank": hit.ranks.get(KEYWORD),
                    "vector_rank": hit.ranks.get(VECTOR),
                    "shard": located[hit.chunk_id],
                }
            )
            if len(results) == request.k:
                break
        timings["total"] = _ms(started)
        return {
            "query": request.query,
            "zone": request.zone,
            "mode": request.mode.value,
            "fusion": request.fusion.value,
            "k": request.k,
            "results": results,
            "timings_ms": {name: round(value, 3) for name, value in timings.items()},
            "shards": {
                "queried": len(self._shards),
                "bm25_generations": {str(s.shard): s.generation() for s in self._shards},
            },
        }

    def _hydrate(self, chunk_ids: list[str], located: dict[str, int], zone: str) -> dict[str, ChunkRecord]:
        by_shard: dict[int, list[str]] = {}
        for chunk_id in chunk_ids:
            by_shard.setdefault(located[chunk_id], []).append(chunk_id)
        searchers = {s.shard: s for s in self._shards}
        futures = [self._pool.submit(searchers[shard].fetch, ids, zone=zone) for shard, ids in by_shard.items()]
        records: dict[str, ChunkRecord] = {}
        for future in futures:
            records.update(future.result())
        return records


def _timed(leg: Any, what: Any, request: SearchRequest, limit: int) -> tuple[list[LegHit], float]:
    t = time.perf_counter()
    hits = leg(what, zone=request.zone, limit=limit, where=request.where or None)
    return hits, _ms(t)


def _merge(futures: list[tuple[int, Future[tuple[list[LegHit], float]]]], limit: int) -> _Leg:
    """One leg across shards: every shard's hits by score, best first, cut to ``limit``.

    Raw BM25 scores are compared across shards as Elasticsearch does without DFS: each shard's IDF comes
    from its own documents, which hash placement keeps statistically alike.
    """
    merged: list[tuple[int, LegHit]] = []
    slowest = 0.0
    for shard, future in futures:
        hits, ms = future.result()
        slowest = max(slowest, ms)
        merged.extend((shard, hit) for hit in hits)
    merged.sort(key=lambda item: (-item[1].score, item[1].chunk_id))
    return _Leg(hits=merged[:limit], ms=slowest)


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
