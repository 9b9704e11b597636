"""Tracking whether each shard's BM25 index is current, in Redis.

Every committed write bumps the shard's *dirty version*; a rebuild records the dirty version it started
from in its manifest (``built_version``). The index is current when ``built_version >= dirty version``.
A rebuild is scheduled at most once per debounce window: the first write after a rebuild starts wins the
``scheduled`` flag, later writes see it taken. The rebuild clears the flag *before* it reads the version,
so a write that commits during a build always schedules another one.

A full rebuild costs time in proportion to the shard, so the wait before one is never shorter than twice
the previous build took: under a steady stream of writes rebuilds then take at most a third of one core,
however large the shard grows (fresh writes stay searchable by the vector leg meanwhile).

Full rebuilds are the *merge* now: a commit also records which documents it touched (a sorted set per
shard, ``(zone, path)`` scored by the dirty version that counted it, in the same Lua call as the bump), so
the maintenance worker can index just those documents as a delta segment over the published generation
(``pipeline/index/lexical/delta.py``). A commit that cannot name its documents marks the shard ``untracked``
at its version, and the next update is a full rebuild.

Redis errors reach callers as ours (:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NamedTuple

from shardfuse.pipeline.coordination.redis_errors import redis_errors

_PREFIX = "shardfuse:bm25"
_WHAT = "BM25 freshness"

# Commits whose time is kept (``shardfuse status``/the exporter: how long a shard has been behind).
DIRTY_AT_KEEP = 4096
# KEYS: dirty, touched, untracked, scheduled, dirty_at. ARGV: flag TTL, "1" when the documents are unknown,
# keys...
_MARK_DIRTY = """
local version = redis.call('INCR', KEYS[1])
local now = redis.call('TIME')
redis.call('ZADD', KEYS[5], version, version .. ':' .. now[1] .. ':' .. now[2])
redis.call('ZREMRANGEBYRANK', KEYS[5], 0, -""" + str(DIRTY_AT_KEEP + 1) + """)
if ARGV[2] == '1' then
  redis.call('SET', KEYS[3], version)
end
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[2], version, ARGV[i])
end
if redis.call('SET', KEYS[4], 1, 'NX', 'EX', tonumber(ARGV[1])) then
  return 1
end
return 0
"""
# KEYS: touched, untracked. ARGV: version up to which the base generation covers everything.
_TRIM = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local untracked = tonumber(redis.call('GET', KEYS[2]) or '0')
if untracked <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[2])
end
return 0
"""


class Touched(NamedTuple):
    """The dirty version, the documents written after a base version (as of that dirty version), and
    whether a write the documents of which are unknown landed after it."""

    version: int
    keys: list[tuple[str, str]]
    untracked: bool
    versions: list[int] = []  # per key, the dirty version of its last write

    def since(self, version: int) -> list[tuple[str, str]]:
        """The keys last written after ``version``."""
        return [key for key, at in zip(self.keys, self.versions, strict=True) if at > version]


def _member(zone: str, path: str) -> str:
    return json.dumps([zone, path], ensure_ascii=False)


def _key(member: bytes | str) -> tuple[str, str]:
    zone, path = json.loads(member)
    return str(zone), str(path)


class Bm25Freshness:
    def __init__(self, redis: Any, *, flag_ttl_s: int = 120) -> None:
        self._redis = redis
        self._flag_ttl_s = flag_ttl_s

    def mark_dirty(self, shard: int, keys: Iterable[tuple[str, str]] | None = None) -> bool:
        """Record a committed write to ``shard`` of the documents ``keys`` (``(zone, path)``; None when
        unknown, which costs a full rebuild); True when the caller must schedule an update."""
        members = [] if keys is None else sorted({_member(z, p) for z, p in keys})
        p = f"{_PREFIX}:{shard}"
        with redis_errors(self._redis, _WHAT):
            scheduled = self._redis.eval(
                _MARK_DIRTY, 5, f"{p}:dirty", f"{p}:touched", f"{p}:untracked", f"{p}:scheduled", f"{p}:dirty_at",
                self._flag_ttl_s, "1" if keys is None else "0", *members,
            )
        return bool(int(scheduled))

    def touched(self, shard: int, *, since: int) -> Touched:
        """The dirty version and, atomically with it, the documents written after version ``since``."""
        p = f"{_PREFIX}:{shard}"
        with redis_errors(self._redis, _WHAT):
            pipe = self._redis.pipeline(transaction=True)
            pipe.get(f"{p}:dirty")
            pipe.zrangebyscore(f"{p}:touched", f"({since}", "+inf", withscores=True)
            pipe.get(f"{p}:untracked")
            version, members, untracked = pipe.execute()
        return Touched(int(version or 0), [_key(m) for m, _ in members], int(untracked or 0) > since,
                       [int(score) for _, score in members])

    def trim(self, shard: int, *, upto: int) -> None:
        """Forget the documents a generation covering version ``upto`` holds."""
        p = f"{_PREFIX}:{shard}"
        with redis_errors(self._redis, _WHAT):
            self._redis.eval(_TRIM, 2, f"{p}:touched", f"{p}:untracked", upto)

    def claim_merge(self, shard: int, *, ttl_s: int = 3600) -> bool:
        """True for the one caller that must schedule a merge of ``shard`` (until :meth:`release_merge`)."""
        with redis_errors(self._redis, _WHAT):
            return bool(self._redis.set(f"{_PREFIX}:{shard}:merge", 1, nx=True, ex=ttl_s))

    def release_merge(self, shard: int) -> None:
        with redis_errors(self._redis, _WHAT):
            self._redis.delete(f"{_PREFIX}:{shard}:merge")

    def begin_rebuild(self, shard: int) -> int:
        """Release the schedule flag and return the dirty version this rebuild will make current."""
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

    def behind_s(self, shard: int, *, built_version: int) -> float:
        """How long ago (on the Redis server's clock) the first commit an index built at ``built_version``
        lacks was made; 0 when it lacks none. Only the last :data:`DIRTY_AT_KEEP` commits are remembered, so
        an index further behind than that shows the age of the oldest one remembered."""
        with redis_errors(self._redis, _WHAT):
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrangebyscore(f"{_PREFIX}:{shard}:dirty_at", f"({built_version}", "+inf", start=0, num=1)
            pipe.time()
            first, (seconds, micros) = pipe.execute()
        if not first:
            return 0.0
        member = first[0].decode() if isinstance(first[0], bytes) else str(first[0])
        _, at_s, at_us = member.split(":")
        return max(0.0, (int(seconds) - int(at_s)) + (int(micros) - int(at_us)) / 1e6)

    def dirty_version(self, shard: int) -> int:
        with redis_errors(self._redis, _WHAT):
            return int(self._redis.get(f"{_PREFIX}:{shard}:dirty") or 0)

    def dirty_versions(self, shards: int) -> list[int]:
        """Every shard's write counter, in one round trip."""
        with redis_errors(self._redis, _WHAT):
            values = self._redis.mget([f"{_PREFIX}:{shard}:dirty" for shard in range(shards)])
        return [int(v or 0) for v in values]


def message_documents(kwargs: dict[str, Any]) -> list[tuple[str, str]] | None:
    """The ``(zone, path)`` of every item of an ingest (``event``/``events``) or embed (``document``/
    ``documents``) message's arguments; None when an item does not name its document.

    A superset of what a task committed is harmless: a delta re-reads each named document's current chunks.
    """
    items: list[Any] = []
    for one, many in (("event", "events"), ("document", "documents")):
        if kwargs.get(one) is not None:
            items.append(kwargs[one])
        items.extend(kwargs.get(many) or [])
    keys: list[tuple[str, str]] = []
    for item in items:
        event = item.get("event") if isinstance(item, dict) and isinstance(item.get("event"), dict) else item
        if not isinstance(event, dict):
            return None
        zone, path = event.get("zone"), event.get("path")
        if not isinstance(zone, str) or not isinstance(path, str):
            return None
        keys.append((zone, path))
    return keys or None
