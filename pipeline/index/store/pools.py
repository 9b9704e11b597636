"""The connection pools a process needs for every shard: one per distinct DSN, opened on first use."""

from __future__ import annotations

import os
import threading
from types import TracebackType
from typing import Any

from psycopg_pool import ConnectionPool

from shardfuse.pipeline.config.settings import Settings, VectorIndexSettings
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.shard_store import ShardStore
from shardfuse.pipeline.index.store.vector_index import BuildSettings


class ShardPools:
    """Pools keyed by DSN, so shards that share a database share a pool; closed together."""

    def __init__(self, settings: Settings, *, min_size: int, max_size: int) -> None:
        self._settings = settings
        self._min_size = min_size
        self._max_size = max_size
        self._pools: dict[str, ConnectionPool[Any]] = {}
        self._lock = threading.Lock()

    def pool(self, dsn: str) -> ConnectionPool[Any]:
        with self._lock:
            if dsn not in self._pools:
                self._pools[dsn] = open_pool(dsn, min_size=self._min_size, max_size=self._max_size)
            return self._pools[dsn]

    @property
    def shared(self) -> ConnectionPool[Any]:
        """The pool of the database holding the shared tables (dead letters)."""
        return self.pool(self._settings.postgres.dsn)

    def stores(self) -> list[ShardStore]:
        """One store per shard (schemas are not created here: see :meth:`ShardStore.ensure_schema`)."""
        dimensions = self._settings.embedder.dimensions
        index = build_settings(self._settings.vector_index)
        return [
            ShardStore(self.pool(self._settings.shard_dsn(shard)), shard, dimensions=dimensions, index=index)
            for shard in range(self._settings.shards)
        ]

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                pool.close()
            self._pools.clear()

    def __enter__(self) -> ShardPools:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def build_settings(settings: VectorIndexSettings) -> BuildSettings:
    """How this machine builds HNSW indexes (parallel workers default to one less than its cores)."""
    workers = settings.build_parallel_workers or max(1, (os.cpu_count() or 2) - 1)
    return BuildSettings(
        m=settings.m,
        ef_construction=settings.ef_construction,
        memory_mb=settings.build_memory_mb,
        parallel_workers=workers,
        storage=settings.storage,
    )
