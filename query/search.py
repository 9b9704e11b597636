"""Answering one search: route, fan out to every shard, merge each leg, expand, fuse, hydrate, boost.

The stages, each a pure function elsewhere in ``query/`` except the fan-out:

1. :func:`shardfuse.query.router.route` picks the over-fetch multiplier and the legs' weights from the query text;
2. the query is embedded and the vector leg's searches are sent to every shard (PostgreSQL works on them
   while this process runs the keyword leg);
3. every shard reports its share of the zone's term statistics, summed so BM25 IDFs are zone-wide
   (:mod:`shardfuse.pipeline.index.lexical.stats`), then the keyword leg searches every shard; both legs are merged
   across
   shards by score;
4. optionally (off by default), :class:`shardfuse.query.expansion.expander.QueryExpander` adds keyword and vector legs
for
   LLM-written variants of the query, unless the keyword leg's top hit is already decisive;
5. :func:`shardfuse.query.fusion.fuse` fuses the legs; the fused hits are hydrated from their shards;
6. :func:`shardfuse.query.boosts.rerank` applies field, exactness and symbol boosts, then :func:`diversify` caps
   chunks per file and only the top ``full_text_top_n`` results carry their full text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, QuerySettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.embed.providers import Embedder
from shardfuse.pipeline.index.lexical.stats import combine
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query.boosts import NO_BOOST, Boost, Candidate, prepare_query, rerank
from shardfuse.query.expansion.expander import Expansion, QueryExpander
from shardfuse.query.fusion import KEYWORD, VECTOR, FusedHit, fuse
from shardfuse.query.ranking import diversify, snippet
from shardfuse.query.request import SearchRequest
from shardfuse.query.result_cache import ResultCache, cache_key, settings_fingerprint
from shardfuse.query.router import NEUTRAL, Route, route
from shardfuse.query.shard_legs import LegHit, ShardSearcher

# An expansion leg counts this much of the leg it extends, shared among that kind's expansion legs: the
# original query stays the strongest evidence.
EXPANSION_SHARE = 0.5


class QueryModels(Protocol):
    """The embedding model each zone's queries use (``pipeline/index/store/zone_models.py``) and its embedders."""

    def active(self, zone: str) -> str: ...

    def embedders(self, model: str) -> tuple[Embedder, Embedder]:
        """``model``'s query embedder, and the same behind the query-embedding cache."""
        ...


@dataclass(frozen=True, slots=True)
class _Model:
    name: str
    direct: Embedder
    cached: Embedder


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
        settings: QuerySettings,
        cached_embedder: Embedder | None = None,
        cache: ResultCache | None = None,
        write_versions: Callable[[], Sequence[int]] | None = None,
        expander: QueryExpander | None = None,
        models: QueryModels | None = None,
    ) -> None:
        self._shards = list(shards)
        # Zones reindexed to another embedding model; None: every zone uses ``embedder``.
        self._models = models
        self._embedder = embedder
        # The same model behind a query-embedding cache; ``use_cache=False`` searches go around it so their
        # timings include the model, as a first-time query's would.
        self._cached_embedder = cached_embedder or embedder
        self._settings = settings
        self._settings_fingerprint = settings_fingerprint(settings)
        self._max_per_file = settings.max_chunks_per_file or None
        self._cache = cache
        # Per shard, a counter every committed write bumps: part of the cache key.
        self._write_versions = write_versions
        self._expander = expander
        # Shard-level work (one vector search or fetch on one shard; never waits on another future) runs on
        # ``_pool``. An expansion's extra keyword legs run on ``_phases``, beside its extra vector legs.
        # Both live as long as the service (one per worker process).
        self._pool = ThreadPoolExecutor(max_workers=max(2, 2 * len(self._shards)), thread_name_prefix="shard")
        # Sized for several concurrent requests (the query pool runs threads).
        self._phases = ThreadPoolExecutor(max_workers=8, thread_name_prefix="leg")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._phases.shutdown(wait=False, cancel_futures=True)
        if self._expander is not None:
            self._expander.close()

    def search(self, request: SearchRequest, *, use_cache: bool = True) -> dict[str, Any]:
        """Answer ``request``, from the result cache when the shards have not changed since."""
        model = self._model(request)
        if not use_cache:
            return self._search(request, model, embedder=model.direct)
        if self._cache is None or self._write_versions is None:
            return self._search(request, model, embedder=model.cached)
        started = time.perf_counter()
        versions = self._write_versions()
        generations = [shard.current_generation() for shard in self._shards]
        key = cache_key(request, shard_state=list(zip(versions, generations, strict=True)),
                        settings_fingerprint=self._settings_fingerprint, model=model.name)
        cached = self._cache.get(key)
        if cached is not None:
            cached["cache"] = "hit"
            cached["timings_ms"] = {"total": round(_ms(started), 3), "computed": cached["timings_ms"]}
            return cached
        answer = self._search(request, model, embedder=model.cached)
        self._cache.put(key, answer)
        answer["cache"] = "miss"
        return answer

    def _model(self, request: SearchRequest) -> _Model:
        """The request's model if it names one (to compare a reindex's model before switching), else the
        zone's: read once, so the query's embedding and the column it searches always belong together."""
        name = request.model or (self._models.active(request.zone) if self._models else DEFAULT_MODEL)
        if name == DEFAULT_MODEL:
            return _Model(DEFAULT_MODEL, self._embedder, self._cached_embedder)
        if self._models is None:
            raise InvalidQueryError(f"embedding model {name!r} is not configured on this query worker")
        direct, cached = self._models.embedders(name)
        return _Model(name, direct, cached)

    def _search(self, request: SearchRequest, model: _Model, *, embedder: Embedder) -> dict[str, Any]:
        started = time.perf_counter()
        settings = self._settings
        timings: dict[str, float] = {}
        plan = route(request.query) if _on(request.route, settings.router.enabled) else NEUTRAL
        limit = max(math.ceil(request.k * settings.over_fetch * plan.limit_multiplier), settings.min_leg_depth)

        # The vector leg is the long one (an HNSW search per shard, in PostgreSQL): its searches are sent
        # first, and the keyword leg (numpy in this process) runs while the server works on them.
        vector: list[tuple[int, Future[tuple[list[LegHit], float]]]] | None = None
        if request.mode.uses_vector:
            t = time.perf_counter()
            embedding = embedder.embed_query(request.query)
            timings["embed"] = _ms(t)
            vector = self._submit_vector(embedding, request, limit, model.name)
        keyword = self._keyword_leg(request.query, request, limit) if request.mode.uses_keyword else None
        legs: dict[str, _Leg] = {}
        if vector is not None:
            legs[VECTOR] = _merge(vector, limit)
        if keyword is not None:
            legs[KEYWORD] = keyword
        for name, leg in legs.items():
            timings[name] = leg.ms

        expansion_info: dict[str, Any] | None = None
        if self._expander is not None and _on(request.expand, settings.expansion.enabled):
            keyword_scores = [h.score for _, h in legs[KEYWORD].hits[:2]] if KEYWORD in legs else None
            outcome = self._expander.expand(request.query, keyword_scores=keyword_scores)
            timings["expand"] = outcome.ms
            expansion_info = {"source": outcome.source, "reason": outcome.reason}
            if outcome.expansion is not None:
                t = time.perf_counter()
                legs.update(self._expansion_legs(outcome.expansion, request, limit, model))
                timings["expansion_legs"] = _ms(t)
                expansion_info["legs"] = sorted(name for name in legs if "+" in name)

        t = time.perf_counter()
        fused = fuse(
            request.fusion,
            {name: [(h.chunk_id, h.score) for _, h in leg.hits] for name, leg in legs.items()},
            alpha=request.alpha,
            rrf_k=request.rrf_k or settings.rrf_k,
            weights=_leg_weights(legs, plan),
        )
        timings["fuse"] = _ms(t)

        t = time.perf_counter()
        located: dict[str, int] = {}
        for leg in legs.values():
            for shard, h in leg.hits:
                located.setdefault(h.chunk_id, shard)
        present = self._hydrate_enough(fused, located, request)
        timings["hydrate"] = _ms(t)

        t = time.perf_counter()
        ranked = self._boost(request, present)
        timings["boost"] = _ms(t)

        leg_scores = {name: {h.chunk_id: h.score for _, h in legs[name].hits} for name in (KEYWORD, VECTOR)
                      if name in legs}
        results: list[dict[str, Any]] = []
        for (hit, record), score, boost in diversify(ranked, key=lambda r: r[0][1].path,
                                                    max_per_key=self._max_per_file):
            full = len(results) < settings.full_text_top_n
            results.append(
                {
                    "rank": len(results) + 1,
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
                    "shard": located[hit.chunk_id],
                }
            )
            if len(results) == request.k:
                break
        timings["total"] = _ms(started)
        answer: dict[str, Any] = {
            "query": request.query,
            "zone": request.zone,
            "mode": request.mode.value,
            "fusion": request.fusion.value,
            "k": request.k,
            "model": model.name,
            "results": results,
            "route": {
                "complexity": round(plan.complexity, 3),
                "limit_multiplier": round(plan.limit_multiplier, 3),
                "keyword_weight": round(plan.keyword_weight, 3),
                "vector_weight": round(plan.vector_weight, 3),
            },
            "timings_ms": {name: round(value, 3) for name, value in timings.items()},
            "shards": {
                "queried": len(self._shards),
                "bm25_generations": {str(s.shard): s.generation() for s in self._shards},
            },
        }
        if expansion_info is not None:
            answer["expansion"] = expansion_info
        return answer

    def _keyword_leg(self, query: str, request: SearchRequest, limit: int) -> _Leg:
        """Every shard's share of the zone's statistics, summed; then every shard's search with them, merged.

        Runs in one thread, shard after shard: each step is a few hundred microseconds of numpy holding the
        GIL, and spreading them over the shard threads measured no faster (100,000 chunks, 4 shards, 2
        cores), only more hand-offs. ``ms`` covers the whole leg.
        """
        t = time.perf_counter()
        stats = combine(shard.keyword_stats(query, zone=request.zone) for shard in self._shards)
        merged: list[tuple[int, LegHit]] = []
        for shard in self._shards:
            hits = shard.keyword(query, zone=request.zone, limit=limit, where=request.where or None, stats=stats)
            merged.extend((shard.shard, hit) for hit in hits)
        return _Leg(hits=_best(merged, limit), ms=_ms(t))

    def _submit_vector(
        self, embedding: npt.NDArray[np.float32], request: SearchRequest, limit: int, model: str
    ) -> list[tuple[int, Future[tuple[list[LegHit], float]]]]:
        return [(shard.shard, self._pool.submit(_timed, shard.vector, embedding, request, limit, model=model))
                for shard in self._shards]

    def _expansion_legs(self, expansion: Expansion, request: SearchRequest, limit: int,
                        model: _Model) -> dict[str, _Leg]:
        """One extra keyword leg per lexical variant and one extra vector leg per question or passage."""
        keyword = {
            f"{KEYWORD}+{i}": self._phases.submit(self._keyword_leg, variant, request, limit)
            for i, variant in enumerate(expansion.lexical if request.mode.uses_keyword else (), start=1)
        }
        pending: dict[str, list[tuple[int, Future[tuple[list[LegHit], float]]]]] = {}
        if request.mode.uses_vector:
            # Questions are embedded as queries; the hypothetical passage as the documents it imitates.
            embeddings = [model.direct.embed_query(question) for question in expansion.questions]
            if expansion.passage:
                embeddings.append(model.direct.embed_documents([expansion.passage])[0])
            for i, embedding in enumerate(embeddings, start=1):
                pending[f"{VECTOR}+{i}"] = self._submit_vector(np.asarray(embedding, dtype=np.float32), request,
                                                               limit, model.name)
        legs = {name: _merge(futures, limit) for name, futures in pending.items()}
        return {**{name: future.result() for name, future in keyword.items()}, **legs}

    def _boost(
        self, request: SearchRequest, present: list[tuple[FusedHit, ChunkRecord]]
    ) -> list[tuple[tuple[FusedHit, ChunkRecord], float, Boost]]:
        boosts = self._settings.boosts
        if not _on(request.boost, boosts.enabled):
            return [(pair, pair[0].score, NO_BOOST) for pair in present]
        return rerank(
            present,
            query_terms=prepare_query(request.query),
            candidate_of=lambda pair: _candidate(pair[1]),
            score_of=lambda pair: pair[0].score,
            settings=boosts,
        )

    def _hydrate_enough(
        self, fused: list[FusedHit], located: dict[str, int], request: SearchRequest
    ) -> list[tuple[FusedHit, ChunkRecord]]:
        """The best fused candidates with their chunks, in rounds of ``max(1.5·k, rerank_depth)``.

        Only hydrated candidates are boosted, so the round size is also the rerank depth. Chunks replaced or
        deleted since their BM25 generation was built do not hydrate and are dropped; another round runs
        only when that, or the per-file cap, leaves fewer than ``k``.
        """
        window = max(request.k + request.k // 2, self._settings.rerank_depth)
        present: list[tuple[FusedHit, ChunkRecord]] = []
        for start in range(0, len(fused), window):
            batch = fused[start : start + window]
            records = self._hydrate([hit.chunk_id for hit in batch], located, request.zone)
            present.extend((hit, records[hit.chunk_id]) for hit in batch if hit.chunk_id in records)
            distinct = diversify(present, key=lambda pair: pair[1].path, max_per_key=self._max_per_file)
            if sum(1 for _ in distinct) >= request.k:
                break
        return present

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


def _timed(
    leg: Any, what: Any, request: SearchRequest, limit: int, **extra: Any
) -> tuple[list[LegHit], float]:
    t = time.perf_counter()
    hits = leg(what, zone=request.zone, limit=limit, where=request.where or None, **extra)
    return hits, _ms(t)


def _on(requested: bool | None, default: bool) -> bool:
    return default if requested is None else requested


def _leg_weights(legs: dict[str, _Leg], plan: Route) -> dict[str, float]:
    """The router's lean per kind of leg; expansion legs share ``EXPANSION_SHARE`` of their kind's weight."""
    lean = {KEYWORD: plan.keyword_weight, VECTOR: plan.vector_weight}
    extra = {kind: sum(1 for name in legs if name.startswith(kind + "+")) for kind in lean}
    weights: dict[str, float] = {}
    for name in legs:
        kind = name.split("+", 1)[0]
        weights[name] = lean[kind] if name == kind else lean[kind] * EXPANSION_SHARE / extra[kind]
    return weights


def _candidate(record: ChunkRecord) -> Candidate:
    return Candidate(path=record.path, text=record.text, metadata=record.metadata, symbols=record.symbols,
                     primary_symbol=record.primary_symbol, role=record.role)


def _merge(futures: list[tuple[int, Future[tuple[list[LegHit], float]]]], limit: int) -> _Leg:
    """One leg across shards: every shard's hits by score, best first, cut to ``limit``.

    BM25 scores compare across shards because every shard scored with the zone-wide IDFs.
    """
    merged: list[tuple[int, LegHit]] = []
    slowest = 0.0
    for shard, future in futures:
        hits, ms = future.result()
        slowest = max(slowest, ms)
        merged.extend((shard, hit) for hit in hits)
    return _Leg(hits=_best(merged, limit), ms=slowest)


def _best(merged: list[tuple[int, LegHit]], limit: int) -> list[tuple[int, LegHit]]:
    merged.sort(key=lambda item: (-item[1].score, item[1].chunk_id))
    return merged[:limit]


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
