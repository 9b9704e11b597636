"""One deferred HNSW build scheduled per shard at a time, however many commits of a bulk load ask."""

from __future__ import annotations

import fakeredis
import pytest

from shardfuse.pipeline.coordination.build_schedule import VectorIndexSchedule
from shardfuse.pipeline.core.errors import StoreUnavailableError


def test_the_first_claim_of_a_shard_wins_until_the_build_clears_it() -> None:
    schedule = VectorIndexSchedule(fakeredis.FakeRedis())
    assert schedule.claim(0) is True
    assert [schedule.claim(0) for _ in range(5)] == [False] * 5
    assert schedule.claim(1) is True  # shards are independent
    assert schedule.scheduled(0) and schedule.scheduled(1)
    schedule.clear(0)
    assert not schedule.scheduled(0)
    assert schedule.claim(0) is True


def test_a_lost_redis_is_a_store_unavailable_error() -> None:
    server = fakeredis.FakeServer()
    schedule = VectorIndexSchedule(fakeredis.FakeRedis(server=server))
    server.connected = False
    with pytest.raises(StoreUnavailableError, match="vector index build schedule"):
        schedule.claim(0)
