"""The per-key rate limit: a token bucket in Redis (a real redis-server, for the Lua script's semantics), shared by
every process that asks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shardfuse.pipeline.coordination.token_bucket import Decision, TokenBucket
from shardfuse.pipeline.core.errors import StoreUnavailableError
from tests.support.socket_redis import socket_redis


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    with socket_redis(tmp_path_factory.mktemp("redis")) as sock:
        connection = redis.Redis(unix_socket_path=str(sock))
        yield connection
        connection.close()


def test_a_burst_is_allowed_then_refused_with_the_wait_until_a_token(client: redis.Redis) -> None:
    bucket = TokenBucket(client, name="t1", rate_per_s=2.0, burst=3)
    assert [bucket.take("k", now=100.0).allowed for _ in range(3)] == [True, True, True]
    refused = bucket.take("k", now=100.0)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(0.5)
    assert refused.retry_after_header == "1"
    assert bucket.take("k", now=100.5).allowed  # one token refilled
    assert not bucket.take("k", now=100.5).allowed
    assert bucket.take("other", now=100.5).allowed  # each caller has a bucket of its own


def test_two_processes_share_one_bucket(client: redis.Redis) -> None:
    first = TokenBucket(client, name="t2", rate_per_s=1.0, burst=2)
    second = TokenBucket(redis.Redis(connection_pool=client.connection_pool), name="t2", rate_per_s=1.0, burst=2)
    assert first.take("k", now=10.0).allowed and second.take("k", now=10.0).allowed
    assert not first.take("k", now=10.0).allowed and not second.take("k", now=10.0).allowed


def test_an_idle_bucket_refills_to_its_burst_only_and_expires(client: redis.Redis) -> None:
    bucket = TokenBucket(client, name="t3", rate_per_s=10.0, burst=2)
    assert bucket.take("k", now=0.0).allowed
    allowed = [bucket.take("k", now=1000.0).allowed for _ in range(3)]
    assert allowed == [True, True, False]  # an hour of quiet buys no more than the burst
    assert 0 < client.ttl("shardfuse:ratelimit:t3:k") <= 2  # the Redis server's clock decides the expiry
    assert Decision(False, 0.01).retry_after_header == "1"


def test_redis_out_of_reach_is_ours(tmp_path: Path) -> None:
    gone = redis.Redis(unix_socket_path=str(tmp_path / "nothing.sock"))
    with pytest.raises(StoreUnavailableError, match="rate limit"):
        TokenBucket(gone, name="t4", rate_per_s=1.0, burst=1).take("k")
    with pytest.raises(ValueError, match="rate_per_s > 0"):
        TokenBucket(gone, name="t4", rate_per_s=0, burst=1)
