"""Caching query embeddings: a per-process LRU in front of Redis in front of the embedder.

Users repeat queries, and a query's vector costs a model call (or a paid request) on the search path. The
LRU answers a repeat in the same worker process in microseconds; Redis shares vectors between processes
and across restarts. Both are only caches: Redis being down costs the cache, never a query. Both are
bounded: the Redis side keeps at most ``redis_entries`` vectors
(:class:`~shardfuse.pipeline.coordination.bounded_cache.BoundedRedisCache`), since it shares the broker's Redis.

The Redis key is a digest of the embedder's ``name``, its dimensions and the text: ``name`` identifies the
vector space (see :class:`~shardfuse.pipeline.embed.providers.base.Embedder`), so two models never read each other's
vectors. The value is the raw little-endian float32 bytes of the vector.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardfuse.pipeline.config.settings import EmbedderSettings
from shardfuse.pipeline.coordination.bounded_cache import BoundedRedisCache
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.pipeline.embed.providers.base import Embedder, Vectors

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "shardfuse:qemb:"
DEFAULT_REDIS_ENTRIES = 20_000
_WIRE_DTYPE = np.dtype("<f4")
# After a Redis failure, skip Redis this long: a host that black-holes packets would otherwise cost every
# query a socket timeout, and logging each failure would flood the log.
_REDIS_BACKOFF_S = 5.0


@dataclass(frozen=True, slots=True)
class QueryCacheStats:
    """Counters since the cache was built: where each query's vector came from, and Redis failures."""

    lru_hits: int = 0
    redis_hits: int = 0
    misses: int = 0
    redis_errors: int = 0


class _Lru:
    """A bounded, thread-safe LRU of read-only vectors (``capacity`` 0: holds nothing)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, Vectors] = OrderedDict()

    def get(self, key: str) -> Vectors | None:
        with self._lock:
            vector = self._entries.get(key)
            if vector is not None:
                self._entries.move_to_end(key)
            return vector

    def put(self, key: str, vector: Vectors) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._entries[key] = vector
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


class CachedQueryEmbedder:
    """An :class:`Embedder` whose ``embed_query`` is cached; everything else is the wrapped embedder's.

    Lookup order: the process's LRU (``entries`` vectors; 0 switches it off), then Redis (``ttl_s`` seconds,
    at most ``redis_entries`` vectors; 0 or no client switches it off), then the embedder, whose answer fills
    both. Two threads missing on the
    same text at once both call the embedder: rare, and cheaper than holding a lock across a model call.

    ``redis`` is a ``redis.Redis`` (or compatible) client that returns bytes (``decode_responses=False``).
    """

    def __init__(
        self,
        embedder: Embedder,
        *,
        entries: int,
        redis: Any | None = None,
        ttl_s: int = 0,
        redis_entries: int = DEFAULT_REDIS_ENTRIES,
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if entries < 0 or ttl_s < 0:
            raise ValueError(f"entries and ttl_s must not be negative, got {entries} and {ttl_s}")
        self._embedder = embedder
        self._lru = _Lru(entries)
        self._redis = (
            BoundedRedisCache(redis, name="query-embeddings", max_entries=redis_entries,
                              max_entry_bytes=embedder.dimensions * _WIRE_DTYPE.itemsize)
            if redis is not None and ttl_s > 0 and redis_entries > 0 else None
        )  # fmt: skip
        self._ttl_s = ttl_s
        self._prefix = prefix
        self._clock = clock
        self._redis_skip_until = 0.0
        self._stats_lock = threading.Lock()
        self._stats = QueryCacheStats()

    @classmethod
    def from_settings(cls, embedder: Embedder, settings: EmbedderSettings, *, redis: Any | None) -> CachedQueryEmbedder:
        """The cache ``embedder.query_cache_entries``, ``query_cache_ttl_s`` and ``query_cache_redis_entries``
        ask for."""
        return cls(embedder, entries=settings.query_cache_entries, redis=redis, ttl_s=settings.query_cache_ttl_s,
                   redis_entries=settings.query_cache_redis_entries)

    # -- the Embedder port, delegated ------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._embedder.name

    @property
    def dimensions(self) -> int:
        return self._embedder.dimensions

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        """Not cached here: document chunks go through the chunk embedding cache instead."""
        return self._embedder.embed_documents(texts)

    # -- the cached path -------------------------------------------------------------------------------
    @property
    def stats(self) -> QueryCacheStats:
        with self._stats_lock:
            return self._stats

    def redis_key(self, text: str) -> str:
        """The Redis key of ``text``'s vector under this embedder (JSON keeps the three parts apart)."""
        payload = json.dumps([self.name, self.dimensions, text], ensure_ascii=False)
        return self._prefix + hashlib.sha256(payload.encode("utf-8")).hexdigest()

    def embed_query(self, text: str) -> Vectors:
        """The query's vector, from the first of LRU, Redis and the embedder that has it (a fresh copy:
        callers may modify it without touching the cache)."""
        key = self.redis_key(text)
        vector = self._lru.get(key)
        if vector is not None:
            self._count(lru_hits=1)
            return vector.copy()
        vector = self._redis_get(key)
        if vector is not None:
            self._count(redis_hits=1)
        else:
            self._count(misses=1)
            vector = _frozen(self._embedder.embed_query(text))
            self._redis_put(key, vector)
        self._lru.put(key, vector)
        return vector.copy()

    def _redis_get(self, key: str) -> Vectors | None:
        if not self._redis_usable():
            return None
        try:
            raw = self._redis.get(key)  # type: ignore[union-attr]  # checked by _redis_usable
        except TransientError as exc:
            self._redis_failed("read", exc)
            return None
        if not isinstance(raw, bytes | bytearray | memoryview) or len(raw) != self.dimensions * _WIRE_DTYPE.itemsize:
            # Not a vector this embedder wrote (a client decoding to str, or a foreign value): recompute.
            return None
        return _frozen(np.frombuffer(raw, dtype=_WIRE_DTYPE))

    def _redis_put(self, key: str, vector: Vectors) -> None:
        if not self._redis_usable():
            return
        try:
            self._redis.put(key, vector.astype(_WIRE_DTYPE).tobytes(), ttl_s=self._ttl_s)  # type: ignore[union-attr]
        except TransientError as exc:
            self._redis_failed("write", exc)

    def _redis_usable(self) -> bool:
        return self._redis is not None and self._clock() >= self._redis_skip_until

    def _redis_failed(self, action: str, exc: Exception) -> None:
        self._count(redis_errors=1)
        self._redis_skip_until = self._clock() + _REDIS_BACKOFF_S
        log.warning(
            "query embedding cache: Redis %s failed (%s); skipping Redis for %.0f s", action, exc, _REDIS_BACKOFF_S,
        )  # fmt: skip

    def _count(self, *, lru_hits: int = 0, redis_hits: int = 0, misses: int = 0, redis_errors: int = 0) -> None:
        with self._stats_lock:
            s = self._stats
            self._stats = QueryCacheStats(
                lru_hits=s.lru_hits + lru_hits,
                redis_hits=s.redis_hits + redis_hits,
                misses=s.misses + misses,
                redis_errors=s.redis_errors + redis_errors,
            )


def _frozen(vector: Vectors) -> Vectors:
    """A read-only float32 copy: what the LRU holds must not change under a caller's feet."""
    out = np.array(vector, dtype=np.float32, copy=True)
    out.setflags(write=False)
    return out
