"""Caching whole search answers.

The key holds the request and the *state* of every shard: its write version (moved forward by every
commit: :class:`~shardfuse.pipeline.index.lexical.freshness.Bm25Freshness`) and its published BM25 index —
generation *and* delta segment (:attr:`~shardfuse.pipeline.index.lexical.manifest.ShardManifest.identity`).
A commit changes the key (the vector leg sees it at once), and so does publishing the delta that makes it
searchable by keyword: an answer computed between the two is never served after the publish. Nothing is ever
purged (entries expire by TTL).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.pipeline.coordination.bounded_cache import BoundedRedisCache
from shardfuse.query.request import SearchRequest

log = logging.getLogger(__name__)
_PREFIX = "shardfuse:results:"


class ResultCache(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, answer: dict[str, Any]) -> None: ...


def settings_fingerprint(settings: QuerySettings) -> str:
    """A short digest of the query settings, computed once per service: part of every cache key, so a worker
    restarted with other boosts or routing never serves answers ranked the old way."""
    return hashlib.sha256(settings.model_dump_json().encode()).hexdigest()[:16]


def cache_key(
    request: SearchRequest, *, shard_state: Sequence[tuple[int, str | None]], settings_fingerprint: str = "",
    model: str = "default",
) -> str:
    """A key for ``request`` against shards in ``shard_state`` (per shard: write version, published BM25
    index identity, None when nothing is published),
    answered under the settings of ``settings_fingerprint`` with the embedding model ``model`` (a zone
    switched to another model never gets the old model's answers)."""
    payload = {
        "request": request.model_dump(mode="json", exclude={"cache"}),
        "shards": [list(state) for state in shard_state],
        "settings": settings_fingerprint,
        "model": model,
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    return f"{_PREFIX}{request.zone}:{digest}"


class RedisResultCache:
    """Answers as JSON in Redis with a TTL, at most ``max_entries`` of them and none over ``max_entry_bytes``
    (:class:`~shardfuse.pipeline.coordination.bounded_cache.BoundedRedisCache`: it shares the broker's Redis).
    Redis being down, or an entry being unreadable, only costs the cache, never the query."""

    def __init__(self, redis: Any, *, ttl_s: int, max_entries: int = 2_000, max_entry_bytes: int = 64 * 1024) -> None:
        self._cache = BoundedRedisCache(redis, name="results", max_entries=max_entries,
                                        max_entry_bytes=max_entry_bytes)
        self._ttl_s = ttl_s

    @classmethod
    def from_settings(cls, redis: Any, settings: QuerySettings) -> RedisResultCache:
        """The cache ``query.result_cache_ttl_s``, ``result_cache_max_entries`` and ``…_max_entry_bytes`` ask for."""
        return cls(redis, ttl_s=settings.result_cache_ttl_s, max_entries=settings.result_cache_max_entries,
                   max_entry_bytes=settings.result_cache_max_entry_bytes)

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = self._cache.get(key)
            return None if raw is None else dict(json.loads(raw))
        except Exception:  # noqa: BLE001 - a cache failure (or a corrupt entry) must not fail the search
            log.debug("result cache: reading %s failed", key, exc_info=True)  # at query rate: no warning flood
            return None

    def put(self, key: str, answer: dict[str, Any]) -> None:
        try:
            self._cache.put(key, json.dumps(answer), ttl_s=self._ttl_s)
        except Exception:  # noqa: BLE001 - a cache failure must not fail the search
            log.debug("result cache: writing %s failed", key, exc_info=True)
