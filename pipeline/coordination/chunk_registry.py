"""Which document of a zone first indexed a chunk's exact text: the entropy filter's memory across
documents (license headers, vendored boilerplate), so a chunk repeated in many files is indexed once.

A Redis hash per zone, ``chunk hash → path`` of the first document that claimed it (``HSETNX``). A chunk
is *repeated* for a document when another path holds its hash. Re-publishing a document finds its own
claims, not repeats. Limits: a claim outlives its document (deleting or rewriting the first file does not
hand its chunks to the next one), and the hash grows by one field per distinct chunk of the zone
(about 100 bytes each); ``forget(zone)`` drops a zone's registry. Redis errors reach callers as ours
(:mod:`shardfuse.pipeline.coordination.redis_errors`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors

_PREFIX = "shardfuse:chunks"
_WHAT = "the chunk registry"


class RedisChunkRegistry:
    def __init__(self, client: Any) -> None:
        self._redis = client

    def repeated(self, zone: str, path: str, chunk_hashes: Sequence[str]) -> set[str]:
        """Claim ``chunk_hashes`` for ``path``; return those another path of ``zone`` claimed first."""
        distinct = list(dict.fromkeys(chunk_hashes))
        if not distinct:
            return set()
        key = f"{_PREFIX}:{zone}"
        with redis_errors(self._redis, _WHAT):
            pipe = self._redis.pipeline(transaction=False)
            for chunk_hash in distinct:
                pipe.hsetnx(key, chunk_hash, path)
            claimed = pipe.execute()
            contested = [h for h, new in zip(distinct, claimed, strict=True) if not new]
            if not contested:
                return set()
            owners = self._redis.hmget(key, contested)
        return {h for h, owner in zip(contested, owners, strict=True) if owner is not None and _text(owner) != path}

    def forget(self, zone: str) -> None:
        with redis_errors(self._redis, _WHAT):
            self._redis.delete(f"{_PREFIX}:{zone}")


def _text(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value
