"""Caching expansions: a backend-neutral key, the port, and its Redis adapter."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Protocol

from redis.exceptions import RedisError

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


class _Redis(Protocol):
    def get(self, name: str) -> Any: ...

    def set(self, name: str, value: str, *, ex: int) -> Any: ...


class RedisExpansionCache:
    """Expansions as JSON in Redis under ``prefix`` + key, with a TTL. Redis being down, or an entry being
    corrupt, costs the cache and nothing else: errors are logged and swallowed."""

    def __init__(self, client: _Redis, *, prefix: str = "shardfuse:expansion:") -> None:
        self._redis = client
        self._prefix = prefix

    def get(self, key: str) -> Expansion | None:
        try:
            raw = self._redis.get(self._prefix + key)
        except RedisError as exc:
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
            self._redis.set(self._prefix + key, json.dumps(expansion.to_dict()), ex=ttl_s)
        except RedisError as exc:
            log.warning("expansion cache unavailable, writing: %s", exc)
