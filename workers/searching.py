"""The query worker's :class:`~shardfuse.query.search.SearchService`, built from its runtime's pieces."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder
from shardfuse.pipeline.index.lexical import LexicalShardReader
from shardfuse.query.expansion.expander import QueryExpander, RedisExpansionCache
from shardfuse.query.rerank import build_stage
from shardfuse.query.result_cache import RedisResultCache
from shardfuse.query.search import SearchService
from shardfuse.query.shard_batches import store_batches
from shardfuse.query.shard_legs import StoreShardSearcher

if TYPE_CHECKING:
    from shardfuse.workers.runtime import WorkerRuntime


def build_searcher(runtime: WorkerRuntime) -> SearchService:
    """Fetch every shard's published BM25 index before the first answer (a node that starts empty would
    otherwise answer without its keyword leg), follow new publishes in the background, and serve both legs."""
    settings = runtime.settings
    q = settings.query
    rerank = build_stage(settings.rerank)  # first: a reranker that cannot load is a configuration error at start
    follower = runtime.bm25_follower
    follower.sync()
    follower.start()
    shards = []
    for store in runtime.stores:
        lexical = LexicalShardReader(settings.bm25_root, store.shard, tokenizer=runtime.lexical_tokenizer)
        lexical.refresh()  # map the published generation now, not on the first query
        shards.append(StoreShardSearcher(store=store, lexical=lexical, ef_search=q.hnsw_ef_search))
    return SearchService(
        shards=shards,
        embedder=runtime.embedder,
        # Repeated queries skip the model: a per-process LRU, then Redis shared by every query worker.
        cached_embedder=CachedQueryEmbedder.from_settings(runtime.embedder, settings.embedder, redis=runtime.redis),
        settings=q,
        cache=RedisResultCache.from_settings(runtime.redis, q) if q.result_cache_ttl_s else None,
        write_versions=lambda: runtime.freshness.dirty_versions(settings.shards),
        # Builds its HTTP client on first use; with expansion disabled it answers "skipped" at once.
        expander=QueryExpander(settings=q.expansion, cache=RedisExpansionCache(
            runtime.redis, max_entries=q.expansion.cache_max_entries,
            max_entry_bytes=q.expansion.cache_max_entry_bytes)),
        models=runtime.models,
        rerank=rerank,
        batches=store_batches(runtime.stores, ef_search=q.hnsw_ef_search,
                              statements_per_database=q.statements_per_database),
    )
