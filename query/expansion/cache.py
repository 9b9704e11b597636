"""Caching expansions: a backend-neutral key, the port, and its Redis adapter."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Protocol

from shardfuse.pipeline.coordination.bounded_cache import BoundedRedisCache
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.query.expansion.prompt import PROMPT_VERSION, Expansion, normalised

log = logging.getLogger(__name__)


def cache_key(query: str, *, model: str, max_variants: int) -> str:
    """A backend-neutral key for the expansion of ``query``: the SHA-256 of everything that shapes it.

    :data:`PROMPT_VERSION` is part of it, so a prompt change never serves expansions of the old prompt.
    Cache adapters add their own namespace (``RedisExpansionCache``'s ``prefix``).
    """
    payload = {"v": PROMPT_VERSION, "model": model, "max_variants": max_variants, "query": normalised(query)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class ExpansionCache(Protocol):
    def get(self, key: str) -> Expansion | None: ...

    def put(self, key: str, expansion: Expansion, ttl_s: int) -> None: ...


class RedisExpansionCache:
    """Expansions as JSON in Redis under ``prefix`` + key, with a TTL, at most ``max_entries`` of them and none
    over ``max_entry_bytes`` (:class:`~shardfuse.pipeline.coordination.bounded_cache.BoundedRedisCache`: it
    shares the broker's Redis). Redis being down, or an entry being corrupt, costs the cache and nothing
    else: errors are logged and swallowed."""

    def __init__(self, client: Any, *, prefix: str = "shardfuse:expansion:", max_entries: int = 10_000,
                 max_entry_bytes: int = 4096) -> None:
        self._cache = BoundedRedisCache(client, name="expansions", max_entries=max_entries,
                                        max_entry_bytes=max_entry_bytes)
        self._prefix = prefix

    def get(self, key: str) -> Expansion | None:
        try:
            raw = self._cache.get(self._prefix + key)
        except TransientError as exc:
            log.warning("expansion cache unavailable, reading: %s", exc)
            return None
        if raw is None:
            return None
        try:
            return Expansion.from_dict(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("ignoring a corrupt expansion cache entry %s: %s", key, exc)
            return None

    def put(self, key: str, expansion: Expansion, ttl_s: int) -> None:
        try:
            self._cache.put(self._prefix + key, json.dumps(expansion.to_dict()), ttl_s=ttl_s)
        except TransientError as exc:
            log.warning("expansion cache unavailable, writing: %s", exc)
