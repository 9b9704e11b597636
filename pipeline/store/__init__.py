"""Shard stores: one PostgreSQL schema (or database) per shard holding ``documents`` and ``chunks``."""

from pipeline.store.changes import ApplyOutcome, DocStatus, DocumentChange
from pipeline.store.connections import open_pool
from pipeline.store.embedding_cache import CacheStats, ChunkEmbeddingCache, EmbeddingCache, MemoryEmbeddingCache
from pipeline.store.filters import ChunkFilter
from pipeline.store.pools import ShardPools
from pipeline.store.reads import ChunkRecord, VectorHit
from pipeline.store.shard_store import ShardStore

__all__ = [
    "ApplyOutcome",
    "CacheStats",
    "ChunkEmbeddingCache",
    "ChunkFilter",
    "ChunkRecord",
    "DocStatus",
    "DocumentChange",
    "EmbeddingCache",
    "MemoryEmbeddingCache",
    "ShardPools",
    "ShardStore",
    "VectorHit",
    "open_pool",
]
