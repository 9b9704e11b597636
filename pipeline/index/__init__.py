"""The index: per-shard PostgreSQL + pgvector stores and per-shard BM25 indexes."""
