"""The chunk embedding cache: ``(provider, model, dimensions, chunk_hash) → vector`` in PostgreSQL.

A chunk whose text was embedded before, by the same model at the same size, is not sent to the provider
again: re-indexing a mostly unchanged repository costs only its changed chunks. The table lives in the shared
schema (``shardfuse.embedding_cache``, created with the dead letters by
:func:`shardfuse.pipeline.index.store.schema.ensure_shared_schema`), not in a shard: the same text recurs across shards.
Its ``embedding`` column has no fixed dimension, so several models coexist; ``dimensions`` is in the key.

Rows are never updated: a chunk hash names its text, and the key names the model, so a stored vector is
final. That makes concurrent writers safe with ``ON CONFLICT DO NOTHING``: whoever commits first wins and
the others' identical vectors are dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.embed.providers.base import Vectors
from shardfuse.pipeline.index.store.connections import pooled_connection
from shardfuse.pipeline.index.store.schema import SHARED_SCHEMA, ensure_shared_schema

_TABLE = sql.Identifier(SHARED_SCHEMA, "embedding_cache")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters since the cache was built: hashes found, hashes not found, and rows newly stored (a row
    another writer stored first does not count)."""

    hits: int = 0
    misses: int = 0
    stored: int = 0

    @property
    def hit_rate(self) -> float:
        looked_up = self.hits + self.misses
        return self.hits / looked_up if looked_up else 0.0


class ChunkEmbeddingCache(Protocol):
    """The port: vectors by chunk hash, for one embedder."""

    def get_many(self, chunk_hashes: Iterable[str]) -> dict[str, Vectors]: ...

    def put_many(self, embeddings: Mapping[str, Vectors]) -> int: ...

    @property
    def stats(self) -> CacheStats: ...


class _Counters:
    """Thread-safe counters: an embed worker's batcher and its tasks share one cache across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats = CacheStats()

    def add(self, *, hits: int = 0, misses: int = 0, stored: int = 0) -> None:
        with self._lock:
            s = self._stats
            self._stats = CacheStats(hits=s.hits + hits, misses=s.misses + misses, stored=s.stored + stored)

    @property
    def snapshot(self) -> CacheStats:
        with self._lock:
            return self._stats


def _as_vector(chunk_hash: str, vector: Vectors, dimensions: int) -> Vectors:
    """``vector`` as a 1-D float32 array of ``dimensions``; anything else is a caller's bug, refused before it
    can be stored under a key that promises another size."""
    array = np.asarray(vector, dtype=np.float32)
    if array.shape != (dimensions,):
        raise ValueError(f"embedding for {chunk_hash} has shape {array.shape}, expected ({dimensions},)")
    return array


def _loaded(value: Any) -> Vectors:
    """A vector column's value as a writable float32 array (pgvector's loader gives a ``Vector``)."""
    return np.array(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


class EmbeddingCache:
    """The PostgreSQL adapter of :class:`ChunkEmbeddingCache`, for one provider, model and size.

    ``pool`` must hand out connections that know the ``vector`` type (:func:`shardfuse.pipeline.index.store.open_pool`).
    """

    def __init__(self, pool: ConnectionPool[Any], *, provider: str, model: str, dimensions: int) -> None:
        if dimensions < 1:
            raise ValueError(f"dimensions must be positive, got {dimensions}")
        self.pool = pool
        self.provider = provider
        self.model = model
        self.dimensions = dimensions
        self._counters = _Counters()

    @property
    def stats(self) -> CacheStats:
        return self._counters.snapshot

    def ensure_schema(self) -> None:
        """Create the shared tables, this one among them, if missing (workers do this at start)."""
        with self._connection() as conn:
            ensure_shared_schema(conn)

    def get_many(self, chunk_hashes: Iterable[str]) -> dict[str, Vectors]:
        """The stored vectors of those ``chunk_hashes`` that have one (float32, shape ``(dimensions,)``);
        the others are absent. One query whatever the number of hashes."""
        wanted = list(dict.fromkeys(chunk_hashes))
        if not wanted:
            return {}
        query = sql.SQL(
            "SELECT chunk_hash, embedding FROM {t} "
            "WHERE provider = %s AND model = %s AND dimensions = %s AND chunk_hash = ANY(%s)"
        ).format(t=_TABLE)
        # Binary results: the vectors come back bit for bit (the text form would round-trip through decimal).
        with self._connection() as conn, conn.cursor(binary=True) as cur:
            rows = cur.execute(query, (self.provider, self.model, self.dimensions, wanted)).fetchall()
        found = {row[0]: _loaded(row[1]) for row in rows}
        self._counters.add(hits=len(found), misses=len(wanted) - len(found))
        return found

    def put_many(self, embeddings: Mapping[str, Vectors]) -> int:
        """Store vectors by chunk hash; a hash already stored (by anyone) is left as it is. Returns how many
        rows were new.

        The rows are binary-COPied into a temporary table, then inserted in ``chunk_hash`` order: two
        writers inserting overlapping hashes in different orders could each wait for a key the other holds
        (a deadlock); in one order, the second just waits for the first to commit, then skips.
        """
        rows = [(h, _as_vector(h, v, self.dimensions)) for h, v in embeddings.items()]
        if not rows:
            return 0
        insert = sql.SQL(
            "INSERT INTO {t} (provider, model, dimensions, chunk_hash, embedding) "
            "SELECT %s, %s, %s, chunk_hash, embedding FROM embedding_cache_in ORDER BY chunk_hash "
            "ON CONFLICT (provider, model, dimensions, chunk_hash) DO NOTHING"
        ).format(t=_TABLE)
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            # ON COMMIT DROP: the pooled connection goes back without it, whether the transaction commits
            # or rolls back.
            cur.execute("CREATE TEMP TABLE embedding_cache_in (chunk_hash text, embedding vector) ON COMMIT DROP")
            with cur.copy("COPY embedding_cache_in (chunk_hash, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["text", "vector"])
                for row in rows:
                    copy.write_row(row)
            cur.execute(insert, (self.provider, self.model, self.dimensions))
            stored = max(cur.rowcount, 0)
        self._counters.add(stored=stored)
        return stored

    def _connection(self) -> AbstractContextManager[psycopg.Connection[Any]]:
        return pooled_connection(self.pool, what="embedding cache")


class MemoryEmbeddingCache:
    """An in-memory :class:`ChunkEmbeddingCache` for unit tests (unbounded: never use it in a worker)."""

    def __init__(self, *, dimensions: int) -> None:
        self.dimensions = dimensions
        self._lock = threading.Lock()
        self._rows: dict[str, Vectors] = {}
        self._counters = _Counters()

    @property
    def stats(self) -> CacheStats:
        return self._counters.snapshot

    def get_many(self, chunk_hashes: Iterable[str]) -> dict[str, Vectors]:
        wanted = list(dict.fromkeys(chunk_hashes))
        with self._lock:
            found = {h: self._rows[h].copy() for h in wanted if h in self._rows}
        self._counters.add(hits=len(found), misses=len(wanted) - len(found))
        return found

    def put_many(self, embeddings: Mapping[str, Vectors]) -> int:
        rows = {h: _as_vector(h, v, self.dimensions).copy() for h, v in embeddings.items()}
        with self._lock:
            new = {h: v for h, v in rows.items() if h not in self._rows}
            self._rows.update(new)
        self._counters.add(stored=len(new))
        return len(new)
