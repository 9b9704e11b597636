"""Which document of a zone first indexed a chunk's exact text: the entropy filter's memory across
documents (license headers, vendored boilerplate), so a chunk repeated in many files is indexed once.

A Redis hash per zone, ``chunk hash → path`` of the first document that claimed it. A chunk is *repeated*
for a document when another path holds its hash. Re-publishing a document finds its own claims, not repeats.

The registry grows with the corpus, not with traffic, but it lives in the broker's Redis: each zone's hash
holds at most ``max_chunks`` claims (``entropy.registry_max_chunks``; 135 bytes each, measured in
docs/operations.md, "Memory budget"). Past it, a new chunk is not claimed: it is indexed (it is not a repeat
of anything claimed), and a later copy of it is not recognised as a repeat. Claims already made keep working.
Claiming and the bound are one Lua script, so concurrent documents never overshoot it.

Limits: a claim outlives its document (deleting or rewriting the first file does not hand its chunks to the
next one); ``forget(zone)`` drops a zone's registry. Redis errors reach callers as ours
(:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors

_PREFIX = "shardfuse:chunks"
_WHAT = "the chunk registry"


# KEYS[1] the zone's hash; ARGV[1] the claiming path, ARGV[2] max_chunks, ARGV[3..] chunk hashes. Returns,
# per hash, its owner's path (this one's if it was just claimed), or false (nil) where the bound stopped a claim.
_CLAIM = """
local size = redis.call('HLEN', KEYS[1])
local limit = tonumber(ARGV[2])
local owners = {}
for i = 3, #ARGV do
  local owner = redis.call('HGET', KEYS[1], ARGV[i])
  if owner then
    owners[i - 2] = owner
  elseif size < limit then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[1])
    size = size + 1
    owners[i - 2] = ARGV[1]
  else
    owners[i - 2] = false
  end
end
return owners
"""
DEFAULT_MAX_CHUNKS = 1_000_000


class RedisChunkRegistry:
    def __init__(self, client: Any, *, max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        self._redis = client
        self.max_chunks = max_chunks
        self._claim = client.register_script(_CLAIM)

    def repeated(self, zone: str, path: str, chunk_hashes: Sequence[str]) -> set[str]:
        """Claim ``chunk_hashes`` for ``path`` (while the zone's registry is under its bound); return those
        another path of ``zone`` claimed first."""
        distinct = list(dict.fromkeys(chunk_hashes))
        if not distinct:
            return set()
        with redis_errors(self._redis, _WHAT):
            owners = self._claim(keys=[f"{_PREFIX}:{zone}"], args=[path, self.max_chunks, *distinct])
        return {h for h, owner in zip(distinct, owners, strict=True) if owner is not None and _text(owner) != path}

    def size(self, zone: str) -> int:
        """How many chunk hashes ``zone``'s registry holds."""
        with redis_errors(self._redis, _WHAT):
            return int(self._redis.hlen(f"{_PREFIX}:{zone}"))

    def forget(self, zone: str) -> None:
        with redis_errors(self._redis, _WHAT):
            self._redis.delete(f"{_PREFIX}:{zone}")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
