"""Pacing the BM25 updates of each shard, in Redis — only what is safe to lose.

*What* an update must index comes from PostgreSQL (:mod:`shardfuse.pipeline.index.store.change_log`: the
documents changed since the snapshot the published index was read at), so nothing here decides whether a
committed document reaches the keyword leg. Losing every key below (a flush, a crash that loses the last
second, a failover to a replica that lacked it) costs at most one update that no commit schedules; the
maintenance pool's watchdog and ``shardfuse wait`` find such a shard from PostgreSQL
(:func:`shardfuse.workers.monitor.bm25_freshness`) and send it.

Per shard:

- ``scheduled``: an update is scheduled at most once per debounce window: the first commit after an update
  starts wins the flag, later ones see it taken. The update clears the flag *before* it asks PostgreSQL what
  changed, so a commit during an update always schedules another one.
- ``dirty``: the shard's *write version*, part of the result cache's keys (with the published index's
  identity): every commit moves it forward. It is the Redis server's clock in microseconds, made strictly
  increasing (``max(previous + 1, now)``), so even after Redis lost it, or lost its last writes, the next
  commit gets a version above every version given before (a counter would repeat the lost values, and a
  cached answer keyed by one of them would be served again).
- ``merge``: the claim of the one update that schedules the shard's merge; ``build_seconds``: how long the
  last merge took. A full rebuild costs time in proportion to the shard, so the wait before one is never
  shorter than twice the previous build took: under a steady stream of writes rebuilds then take at most a
  third of one core, however large the shard grows.
- ``last_update``: when the last delta update ended and how long it took; while documents wait in the queues
  the next one waits a multiple of that (:func:`shardfuse.pipeline.index.maintenance.update_bm25`), so a
  bulk load's deltas, each rewritten whole, do not take the maintenance process over.

Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors

_PREFIX = "shardfuse:bm25"
_WHAT = "BM25 freshness"

# KEYS: dirty, scheduled. ARGV: flag TTL. Returns 1 when the caller won the flag (it must schedule).
# The clock is composed as a string: Lua numbers are doubles, which SET would print as 1.7e+15.
_MARK_DIRTY = """
local now = redis.call('TIME')
local clock = now[1] .. string.format('%06d', tonumber(now[2]))
local version = redis.call('INCR', KEYS[1])
if version < tonumber(clock) then
  redis.call('SET', KEYS[1], clock)
end
if redis.call('SET', KEYS[2], 1, 'NX', 'EX', tonumber(ARGV[1])) then
  return 1
end
return 0
"""


class Bm25Freshness:
    def __init__(self, redis: Any, *, flag_ttl_s: int = 120) -> None:
        self._redis = redis
        self._flag_ttl_s = flag_ttl_s

    def mark_dirty(self, shard: int, keys: Iterable[tuple[str, str]] | None = None) -> bool:
        """Record a committed write to ``shard``: move its write version forward; True when the caller must
        schedule an update. ``keys`` (the documents written) are not needed: PostgreSQL knows them."""
        del keys
        p = f"{_PREFIX}:{shard}"
        with redis_errors(self._redis, _WHAT):
            scheduled = self._redis.eval(_MARK_DIRTY, 2, f"{p}:dirty", f"{p}:scheduled", self._flag_ttl_s)
        return bool(int(scheduled))

    def claim_merge(self, shard: int, *, ttl_s: int = 3600) -> bool:
        """True for the one caller that must schedule a merge of ``shard`` (until :meth:`release_merge`)."""
        with redis_errors(self._redis, _WHAT):
            return bool(self._redis.set(f"{_PREFIX}:{shard}:merge", 1, nx=True, ex=ttl_s))

    def release_merge(self, shard: int) -> None:
        with redis_errors(self._redis, _WHAT):
            self._redis.delete(f"{_PREFIX}:{shard}:merge")

    def begin_rebuild(self, shard: int) -> int:
        """Release the schedule flag (a later commit schedules again); the shard's write version."""
        with redis_errors(self._redis, _WHAT):
            pipe = self._redis.pipeline(transaction=True)
            pipe.delete(f"{_PREFIX}:{shard}:scheduled")
            pipe.get(f"{_PREFIX}:{shard}:dirty")
            _, version = pipe.execute()
        return int(version or 0)

    def record_build(self, shard: int, *, seconds: float) -> None:
        """Remember how long the last rebuild of ``shard`` took (it paces the next one)."""
        with redis_errors(self._redis, _WHAT):
            self._redis.set(f"{_PREFIX}:{shard}:build_seconds", f"{seconds:.3f}")

    def rebuild_delay(self, shard: int, *, debounce_s: float) -> float:
        """Seconds to wait before the next rebuild: the debounce, or twice the last build if longer."""
        with redis_errors(self._redis, _WHAT):
            last = float(self._redis.get(f"{_PREFIX}:{shard}:build_seconds") or 0.0)
        return max(debounce_s, 2 * last)

    def record_update(self, shard: int, *, seconds: float, at: float) -> None:
        """Remember when the last delta update of ``shard`` ended (``at``, epoch seconds) and how long it took:
        during a load it spaces the next one (:func:`shardfuse.pipeline.index.maintenance.update_bm25`)."""
        with redis_errors(self._redis, _WHAT):
            self._redis.set(f"{_PREFIX}:{shard}:last_update", f"{at:.3f}:{seconds:.3f}", ex=3600)

    def update_wait(self, shard: int, *, factor: float, now: float) -> float:
        """Seconds until ``factor`` times the last delta update's duration has passed since it ended (0: now)."""
        with redis_errors(self._redis, _WHAT):
            value = self._redis.get(f"{_PREFIX}:{shard}:last_update")
        if not value:
            return 0.0
        text = value.decode() if isinstance(value, bytes) else str(value)
        ended, _, seconds = text.partition(":")
        try:
            return max(0.0, float(ended) + factor * float(seconds) - now)
        except ValueError:  # not ours: pace nothing
            return 0.0

    def dirty_version(self, shard: int) -> int:
        """The shard's write version (0: no commit recorded since Redis lost it)."""
        with redis_errors(self._redis, _WHAT):
            return int(self._redis.get(f"{_PREFIX}:{shard}:dirty") or 0)

    def dirty_versions(self, shards: int) -> list[int]:
        """Every shard's write version, in one round trip."""
        with redis_errors(self._redis, _WHAT):
            values = self._redis.mget([f"{_PREFIX}:{shard}:dirty" for shard in range(shards)])
        return [int(v or 0) for v in values]
