"""Which shards have a deferred HNSW index build scheduled: one Redis flag per shard, so that the commits
of a bulk load schedule one build per shard, not one each."""

from __future__ import annotations

from typing import Any

from shardfuse.pipeline.coordination.redis_errors import redis_errors

FLAG = "shardfuse:vector_index:scheduled"
# Outlives a stuck build: the flag lapses and the next commit schedules another.
FLAG_TTL_S = 3600


class VectorIndexSchedule:
    """The per-shard "a build is scheduled" flags, in the broker's Redis."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def claim(self, shard: int) -> bool:
        """Take the shard's flag; True when this caller must send the build (nobody else has)."""
        with redis_errors(self._client, "the vector index build schedule"):
            return bool(self._client.set(f"{FLAG}:{shard}", 1, nx=True, ex=FLAG_TTL_S))

    def clear(self, shard: int) -> None:
        """Let the next commit to ``shard`` schedule a build again."""
        with redis_errors(self._client, "the vector index build schedule"):
            self._client.delete(f"{FLAG}:{shard}")

    def scheduled(self, shard: int) -> bool:
        with redis_errors(self._client, "the vector index build schedule"):
            return bool(self._client.exists(f"{FLAG}:{shard}"))
