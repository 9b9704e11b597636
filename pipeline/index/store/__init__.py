"""Shard stores: one PostgreSQL schema (or database) per shard holding ``documents`` and ``chunks``."""

from shardfuse.pipeline.index.store.changes import ApplyOutcome, DocStatus, DocumentChange
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.embedding_cache import (
    CacheStats,
    ChunkEmbeddingCache,
    EmbeddingCache,
    MemoryEmbeddingCache,
)
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.pools import ShardPools
from shardfuse.pipeline.index.store.reads import ChunkRecord, VectorHit
from shardfuse.pipeline.index.store.shard_store import ShardStore

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
