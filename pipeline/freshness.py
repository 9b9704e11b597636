"""Tracking whether each shard's BM25 index is current, in Redis.

Every committed write bumps the shard's *dirty version*; a rebuild records the dirty version it started
from in its manifest (``built_version``). The index is current when ``built_version >= dirty version``.
A rebuild is scheduled at most once per debounce window: the first write after a rebuild starts wins the
``scheduled`` flag, later writes see it taken. The rebuild clears the flag *before* it reads the version,
so a write that commits during a build always schedules another one.

A full rebuild costs time in proportion to the shard, so the wait before one is never shorter than twice
the previous build took: under a steady stream of writes rebuilds then take at most a third of one core,
however large the shard grows (fresh writes stay searchable by the vector leg meanwhile).
"""

from __future__ import annotations

from typing import Any

_PREFIX = "shardfuse:bm25"


class Bm25Freshness:
    def __init__(self, redis: Any, *, flag_ttl_s: int = 120) -> None:
        self._redis = redis
        self._flag_ttl_s = flag_ttl_s

    def mark_dirty(self, shard: int) -> bool:
        """Record a committed write to ``shard``; True when the caller must schedule a rebuild."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.incr(f"{_PREFIX}:{shard}:dirty")
        pipe.set(f"{_PREFIX}:{shard}:scheduled", 1, nx=True, ex=self._flag_ttl_s)
        _, scheduled = pipe.execute()
        return bool(scheduled)

    def begin_rebuild(self, shard: int) -> int:
        """Release the schedule flag and return the dirty version this rebuild will make current."""
        pipe = self._redis.pipeline(transaction=True)
        pipe.delete(f"{_PREFIX}:{shard}:scheduled")
        pipe.get(f"{_PREFIX}:{shard}:dirty")
        _, version = pipe.execute()
        return int(version or 0)

    def record_build(self, shard: int, *, seconds: float) -> None:
        """Remember how long the last rebuild of ``shard`` took (it paces the next one)."""
        self._redis.set(f"{_PREFIX}:{shard}:build_seconds", f"{seconds:.3f}")

    def rebuild_delay(self, shard: int, *, debounce_s: float) -> float:
        """Seconds to wait before the next rebuild: the debounce, or twice the last build if longer."""
        last = float(self._redis.get(f"{_PREFIX}:{shard}:build_seconds") or 0.0)
        return max(debounce_s, 2 * last)

    def dirty_version(self, shard: int) -> int:
        return int(self._redis.get(f"{_PREFIX}:{shard}:dirty") or 0)

    def dirty_versions(self, shards: int) -> list[int]:
        """Every shard's write counter, in one round trip."""
        values = self._redis.mget([f"{_PREFIX}:{shard}:dirty" for shard in range(shards)])
        return [int(v or 0) for v in values]
