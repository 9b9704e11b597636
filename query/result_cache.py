"""Caching whole search answers.

The key holds the request and the *state* of every shard: its write counter (bumped by every commit)
and its published BM25 generation. Any write or rebuild therefore changes the key of every affected query,
and stale answers are never served; nothing is ever purged (entries expire by TTL).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any, Protocol

from shardfuse.pipeline.config.settings import QuerySettings
from shardfuse.query.request import SearchRequest

_PREFIX = "shardfuse:results:"


class ResultCache(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def put(self, key: str, answer: dict[str, Any]) -> None: ...


def settings_fingerprint(settings: QuerySettings) -> str:
    """A short digest of the query settings, computed once per service: part of every cache key, so a worker
    restarted with other boosts or routing never serves answers ranked the old way."""
    return hashlib.sha256(settings.model_dump_json().encode()).hexdigest()[:16]


def cache_key(
    request: SearchRequest, *, shard_state: Sequence[tuple[int, int | None]], settings_fingerprint: str = "",
    model: str = "default",
) -> str:
    """A key for ``request`` against shards in ``shard_state`` (per shard: write version, BM25 generation),
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
    """Answers as JSON in Redis with a TTL; Redis being down only costs the cache, never the query."""

    def __init__(self, redis: Any, *, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = self._redis.get(key)
        except Exception:  # noqa: BLE001 - a cache failure must not fail the search
            return None
        return None if raw is None else dict(json.loads(raw))

    def put(self, key: str, answer: dict[str, Any]) -> None:
        try:
            self._redis.set(key, json.dumps(answer), ex=self._ttl_s)
        except Exception:  # noqa: BLE001 - a cache failure must not fail the search
            return
