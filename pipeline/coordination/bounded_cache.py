"""A cache in the broker's Redis that cannot grow past its bound: at most ``max_entries`` entries of at most
``max_entry_bytes`` each, every one with a TTL.

The caches of the query path (query embeddings, whole answers, expansions) share a Redis with the queues,
which must never be evicted (``noeviction``): query traffic alone must not be able to fill it. Redis has
no per-prefix memory limit, so each cache keeps an index of its keys, a sorted set scored by expiry time,
and one Lua script stores an entry, indexes it and deletes the entries expiring soonest (the oldest, for a
cache with one TTL) beyond ``max_entries``, atomically, so concurrent writers never overshoot the bound.
An entry larger than ``max_entry_bytes`` is not stored at all. The index costs about as much as a key
name per entry (docs/operations.md, "Memory budget", has measured figures).

The script deletes entry keys it is not handed in ``KEYS`` (the ones it evicts): fine on one Redis server or
a replicated one, which is what shardfuse runs on (its broker needs BLMOVE on one server), not on a
Redis Cluster. Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`);
callers treat them as a cache miss.
"""

from __future__ import annotations

from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors

INDEX_PREFIX = "shardfuse:cache-index:"

# KEYS[1] the entry, KEYS[2] the index; ARGV[1] the value, ARGV[2] the TTL in ms, ARGV[3] max_entries.
# The server's clock scores expiry times, so workers' clocks never disagree about what has expired. A bound
# lowered by a restart with new settings is trimmed 500 keys per DEL (Lua's unpack has a stack limit).
_PUT = """
local now_s, now_us = unpack(redis.call('TIME'))
local now = tonumber(now_s) * 1000 + math.floor(tonumber(now_us) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
redis.call('ZADD', KEYS[2], now + ttl, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
while excess > 0 do
  local batch = math.min(excess, 500)
  local oldest = redis.call('ZRANGE', KEYS[2], 0, batch - 1)
  redis.call('DEL', unpack(oldest))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, batch - 1)
  excess = excess - batch
end
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return 1
"""


class BoundedRedisCache:
    """Values under their own keys (``get``/``put`` take whole key names), indexed in
    ``shardfuse:cache-index:<name>``; ``max_entries`` 0 stores nothing."""

    def __init__(self, client: Any, *, name: str, max_entries: int, max_entry_bytes: int) -> None:
        if max_entries < 0 or max_entry_bytes < 0:
            raise ValueError(f"max_entries and max_entry_bytes must not be negative: {max_entries}, {max_entry_bytes}")
        self._redis = client
        self._what = f"the {name} cache"
        self.index_key = INDEX_PREFIX + name
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self._put = client.register_script(_PUT)

    def get(self, key: str) -> Any:
        """The value stored under ``key`` (as the client returns it), or None."""
        with redis_errors(self._redis, self._what):
            return self._redis.get(key)

    def put(self, key: str, value: bytes | str, *, ttl_s: float) -> bool:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds, evicting beyond the bound; False (nothing
        stored) for a value over ``max_entry_bytes``, a cache of no entries, or no TTL."""
        size = len(value.encode("utf-8") if isinstance(value, str) else value)
        ttl_ms = int(ttl_s * 1000)
        if size > self.max_entry_bytes or self.max_entries == 0 or ttl_ms <= 0:
            return False
        with redis_errors(self._redis, self._what):
            self._put(keys=[key, self.index_key], args=[value, ttl_ms, self.max_entries])
        return True

    def size(self) -> int:
        """How many entries the index holds (some may have expired since the last write)."""
        with redis_errors(self._redis, self._what):
            return int(self._redis.zcard(self.index_key))
