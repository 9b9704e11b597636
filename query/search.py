"""Answering one search: route, fan out to every shard, merge each leg, expand, fuse, hydrate, boost.

The stages, each a pure function elsewhere in ``query/`` except the fan-out:

1. :func:`shardfuse.query.router.route` picks the over-fetch multiplier and the legs' weights from the query
   text;
2. the query is embedded and the vector leg's searches are sent to every shard (PostgreSQL works on them
   while this process runs the keyword leg);
3. every shard reports its share of the zone's term statistics, summed so BM25 IDFs are zone-wide
   (:mod:`shardfuse.pipeline.index.lexical.stats`), then the keyword leg searches every shard; both legs are
   merged across shards by score (:mod:`shardfuse.query.fan_out`);
4. optionally (off by default), :class:`shardfuse.query.expansion.expander.QueryExpander` adds keyword and vector
   legs for LLM-written variants of the query, unless the keyword leg's top hit is already decisive;
5. :func:`shardfuse.query.fusion.fuse` fuses the legs; the fused hits are hydrated from their shards;
6. :func:`shardfuse.query.boosts.rerank` applies field, exactness and symbol boosts, then
   :mod:`shardfuse.query.answer` caps chunks per file and only the top ``full_text_top_n`` results carry their
   full text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from shardfuse.pipeline.config.settings import DEFAULT_MODEL, QuerySettings
from shardfuse.pipeline.core.errors import InvalidQueryError
from shardfuse.pipeline.embed.providers import Embedder
from shardfuse.pipeline.index.store import ChunkRecord
from shardfuse.query import answer
from shardfuse.query.boosts import NO_BOOST, Candidate, QueryTerms, prepare_query, rerank
from shardfuse.query.expansion.expander import Expansion, QueryExpander
from shardfuse.query.fan_out import Leg, PendingLeg, ShardFanOut, elapsed_ms, located, located_zones, merge
from shardfuse.query.fusion import KEYWORD, VECTOR, FusedHit, fuse
from shardfuse.query.grep.service import GrepService
from shardfuse.query.hydration import hydrate_enough
from shardfuse.query.leg_weights import leg_weights
from shardfuse.query.request import Mode, SearchRequest
from shardfuse.query.rerank.stage import NO_RERANK, RerankStage, cacheable
from shardfuse.query.result_cache import ResultCache, cache_key, settings_fingerprint
from shardfuse.query.router import NEUTRAL, route
from shardfuse.query.shard_batches import ShardBatches
from shardfuse.query.shard_legs import ShardSearcher


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
        rerank: RerankStage = NO_RERANK,
        batches: ShardBatches | None = None,
    ) -> None:
        # Lives as long as the service (one per worker process), with its threads. ``batches``: shards read
        # together (query/shard_batches.py); by default each on its own.
        self._fan_out = ShardFanOut(shards, batches=batches)
        self._grep = GrepService(shards=shards, submit=self._fan_out.submit, settings=settings.grep)
        # Zones reindexed to another embedding model; None: every zone uses ``embedder``.
        self._models = models
        self._embedder = embedder
        # The same model behind a query-embedding cache; ``cache=False`` requests go around it so their
        # timings include the model, as a first-time query's would.
        self._cached_embedder = cached_embedder or embedder
        self._settings = settings
        self._settings_fingerprint = settings_fingerprint(settings) + rerank.fingerprint
        self._cache = cache
        # Per shard, a write version every commit moves forward: part of the cache key, with the published
        # BM25 index (its generation and delta) of each shard.
        self._write_versions = write_versions
        self._expander = expander
        self._rerank = rerank  # after boosts, within its budget (query/rerank/stage.py)

    def close(self) -> None:
        self._fan_out.close()
        self._rerank.close()
        if self._expander is not None:
            self._expander.close()

    def search(self, request: SearchRequest) -> dict[str, Any]:
        """Answer ``request``, from the result cache when no shard has had a commit or published a BM25
        generation or delta since (unless the request says ``cache=False``: then around both caches)."""
        model = self._model(request)
        if not request.cache:
            return self._search(request, model, embedder=model.direct)
        if self._cache is None or self._write_versions is None:
            return self._search(request, model, embedder=model.cached)
        started = time.perf_counter()
        # The write versions first: a commit landing in between then changes the next query's key.
        state = list(zip(self._write_versions(), self._fan_out.current_indexes(), strict=True))
        key = cache_key(request, shard_state=state, settings_fingerprint=self._settings_fingerprint, model=model.name)
        cached = self._cache.get(key)
        if cached is not None:
            cached["cache"] = "hit"
            cached["timings_ms"] = {"total": round(elapsed_ms(started), 3), "computed": cached["timings_ms"]}
            return cached
        found = self._search(request, model, embedder=model.cached)
        if cacheable(found):  # not an answer whose rerank fell back
            self._cache.put(key, found)
        found["cache"] = "miss"
        return found

    def _model(self, request: SearchRequest) -> _Model:
        """The request's model if it names one (to compare a reindex's model before switching), else the
        zone's: read once, so the query's embedding and the column it searches always belong together. Zones
        searched together must share their model (their vectors compare only then)."""
        actives = {zone: self._models.active(zone) for zone in request.zones} if self._models else {}
        if not request.model and len(set(actives.values())) > 1:
            raise InvalidQueryError(f"zones searched together must use one embedding model; {actives} differ "
                                    "(search them separately, or name one with model)")
        name = request.model or actives.get(request.zone, DEFAULT_MODEL)
        if name == DEFAULT_MODEL:
            return _Model(DEFAULT_MODEL, self._embedder, self._cached_embedder)
        if self._models is None:
            raise InvalidQueryError(f"embedding model {name!r} is not configured on this query worker")
        direct, cached = self._models.embedders(name)
        return _Model(name, direct, cached)

    def _search(self, request: SearchRequest, model: _Model, *, embedder: Embedder) -> dict[str, Any]:
        if request.mode is Mode.GREP:
            return self._grep.answer(request)
        started = time.perf_counter()
        settings = self._settings
        timings: dict[str, float] = {}
        plan = route(request.query) if _on(request.route, settings.router.enabled) else NEUTRAL
        limit = max(math.ceil(request.k * settings.over_fetch * plan.limit_multiplier), settings.min_leg_depth)
        # A code-like query's exact tokens: the grep leg's searches run beside the other two legs.
        grep = (self._fan_out.later(lambda: self._grep.legs(request, limit, timings=timings))
                if self._grep.leg_tokens(request) else None)
        legs = self._legs(request, limit, model.name, embedder=embedder, timings=timings)
        if grep is not None:
            legs.update(grep.result())
        expansion = self._expand(request, limit, model, legs=legs, timings=timings)

        t = time.perf_counter()
        fused = fuse(
            request.fusion,
            {name: [(h.chunk_id, h.score) for _, h in leg.hits] for name, leg in legs.items()},
            alpha=request.alpha,
            rrf_k=request.rrf_k or settings.rrf_k,
            weights=leg_weights(legs, plan, grep_weight=settings.grep.leg_weight),
            complete={name for name, leg in legs.items() if leg.complete},
        )
        timings["fuse"] = elapsed_ms(t)
        t = time.perf_counter()
        shards = located(list(legs.values()))
        per_file = settings.max_chunks_per_file if request.max_per_file is None else request.max_per_file
        present = hydrate_enough(self._fan_out, fused, shards=shards, k=request.k,
                                 zones=located_zones(list(legs.values()), default=request.zone),
                                 rerank_depth=settings.rerank_depth, max_per_file=per_file or None)
        timings["hydrate"] = elapsed_ms(t)
        t = time.perf_counter()
        query_terms = prepare_query(request.query)
        ranked = self._boost(request, present, query_terms)
        timings["boost"] = elapsed_ms(t)
        ranked, reranked = self._rerank.apply(request.query, ranked, requested=request.rerank, timings=timings)

        leg_scores = {name: {h.chunk_id: h.score for _, h in legs[name].hits} for name in (KEYWORD, VECTOR)
                      if name in legs}
        results = answer.results(ranked, k=request.k, leg_scores=leg_scores, located=shards, settings=settings,
                                 query_terms=query_terms, min_score=request.min_score,
                                 include_text=request.include_text, max_per_file=per_file or None)
        timings["total"] = elapsed_ms(started)
        counts = answer.candidate_counts({name: len(leg.hits) for name, leg in legs.items()}, fused=len(fused),
                                         hydrated=len(present))
        found = answer.answer(request, model=model.name, results=results, plan=plan, timings=timings,
                              generations=self._fan_out.generations(), candidates=counts)
        if expansion is not None:
            found["expansion"] = expansion
        if reranked is not None:
            found["rerank"] = reranked
        return found

    def _legs(
        self, request: SearchRequest, limit: int, model: str, *, embedder: Embedder, timings: dict[str, float]
    ) -> dict[str, Leg]:
        """The request's keyword and vector legs, each merged across shards."""
        # The vector leg is the long one (an HNSW search per shard, in PostgreSQL): its searches are sent
        # first, and the keyword leg (numpy in this process) runs while the server works on them.
        vector: PendingLeg | None = None
        if request.mode.uses_vector:
            t = time.perf_counter()
            embedding = embedder.embed_query(request.query)
            timings["embed"] = elapsed_ms(t)
            vector = self._fan_out.submit_vector(embedding, zones=request.zones, where=request.where,
                                                 limit=request.vector_depth or limit, model=model)
        keyword = (self._fan_out.keyword(request.query, zones=request.zones, where=request.where,
                                         limit=request.keyword_depth or limit)
                   if request.mode.uses_keyword else None)
        legs: dict[str, Leg] = {}
        if vector is not None:
            legs[VECTOR] = merge(vector, request.vector_depth or limit, min_score=request.min_similarity)
        if keyword is not None:
            legs[KEYWORD] = keyword
        timings.update((name, leg.ms) for name, leg in legs.items())
        return legs

    def _expand(
        self, request: SearchRequest, limit: int, model: _Model, *, legs: dict[str, Leg], timings: dict[str, float]
    ) -> dict[str, Any] | None:
        """Add expansion legs to ``legs`` when expansion is on; what it did, for the answer."""
        if self._expander is None or not _on(request.expand, self._settings.expansion.enabled):
            return None
        keyword_scores = [h.score for _, h in legs[KEYWORD].hits[:2]] if KEYWORD in legs else None
        outcome = self._expander.expand(request.query, keyword_scores=keyword_scores)
        timings["expand"] = outcome.ms
        info: dict[str, Any] = {"source": outcome.source, "reason": outcome.reason}
        if outcome.expansion is not None:
            t = time.perf_counter()
            legs.update(self._expansion_legs(outcome.expansion, request, limit, model))
            timings["expansion_legs"] = elapsed_ms(t)
            info["legs"] = sorted(name for name in legs if "+" in name)
        return info

    def _expansion_legs(self, expansion: Expansion, request: SearchRequest, limit: int,
                        model: _Model) -> dict[str, Leg]:
        """One extra keyword leg per lexical variant and one extra vector leg per question or passage."""
        where = request.where
        keyword: dict[str, Future[Leg]] = {
            f"{KEYWORD}+{i}": self._fan_out.keyword_later(variant, zones=request.zones, where=where, limit=limit)
            for i, variant in enumerate(expansion.lexical if request.mode.uses_keyword else (), start=1)
        }
        pending: dict[str, PendingLeg] = {}
        if request.mode.uses_vector:
            # Questions are embedded as queries; the hypothetical passage as the documents it imitates.
            embeddings = [model.direct.embed_query(question) for question in expansion.questions]
            if expansion.passage:
                embeddings.append(model.direct.embed_documents([expansion.passage])[0])
            for i, embedding in enumerate(embeddings, start=1):
                pending[f"{VECTOR}+{i}"] = self._fan_out.submit_vector(
                    np.asarray(embedding, dtype=np.float32), zones=request.zones, where=where, limit=limit,
                    model=model.name)
        legs = {name: merge(futures, limit, min_score=request.min_similarity) for name, futures in pending.items()}
        return {**{name: future.result() for name, future in keyword.items()}, **legs}

    def _boost(self, request: SearchRequest, present: list[tuple[FusedHit, ChunkRecord]],
               query_terms: QueryTerms) -> list[answer.Ranked]:
        boosts = self._settings.boosts
        if not _on(request.boost, boosts.enabled):
            return [(pair, pair[0].score, NO_BOOST) for pair in present]
        return rerank(
            present,
            query_terms=query_terms,
            candidate_of=lambda pair: _candidate(pair[1]),
            score_of=lambda pair: pair[0].score,
            settings=boosts,
        )



def _on(requested: bool | None, default: bool) -> bool:
    return default if requested is None else requested


def _candidate(record: ChunkRecord) -> Candidate:
    return Candidate(path=record.path, text=record.text, metadata=record.metadata, symbols=record.symbols,
                     primary_symbol=record.primary_symbol, role=record.role)
