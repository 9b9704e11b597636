"""``shardfuse_pools_alive{queue}`` (shardfuse.workers.exporter.pool_family): the worker pools whose heartbeat
(their metrics endpoint's announcement in Redis) is current, per queue, 0 for a queue no pool consumes; what
the ShardfusePoolMissing alert reads. Announcements go through the pools' own EndpointDirectory, on fakeredis."""

from __future__ import annotations

import fakeredis
import pytest
import redis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.observability.endpoint_directory import ENDPOINTS_KEY, EndpointDirectory, PoolEndpoint
from shardfuse.workers.exporter import pool_family
from shardfuse.workers.names import Queue


def _alive(settings: Settings, client: fakeredis.FakeRedis) -> dict[str, float]:
    family = pool_family(settings, client)
    assert family.name == "shardfuse_pools_alive" and family.type == "gauge"
    return {sample.labels["queue"]: sample.value for sample in family.samples}


def test_each_queue_counts_its_announced_pools_and_a_queue_without_one_says_0() -> None:
    settings = Settings()
    client = fakeredis.FakeRedis()
    directory = EndpointDirectory(client, stale_after_s=settings.delivery.dead_after_s)
    for node, url in [("ingest@a", "http://a:9809/metrics"), ("ingest@b", "http://b:9809/metrics"),
                      ("query@a", "http://a:9810/metrics")]:
        directory.announce(PoolEndpoint(node=node, url=url))

    assert _alive(settings, client) == {"ingest": 2, "embed": 0, "maintenance": 0, "query": 1}
    assert set(_alive(settings, client)) == {queue.value for queue in Queue}


def test_a_pool_whose_heartbeat_stopped_no_longer_counts() -> None:
    settings = Settings()
    client = fakeredis.FakeRedis()
    directory = EndpointDirectory(client, stale_after_s=settings.delivery.dead_after_s)
    directory.announce(PoolEndpoint(node="embed@a", url="http://a:9809/metrics"))
    seconds, _ = client.time()
    silent_since = seconds - settings.delivery.dead_after_s - 1
    client.zadd(ENDPOINTS_KEY, {PoolEndpoint(node="embed@b", url="http://b:9809/metrics").member(): silent_since})

    assert _alive(settings, client)["embed"] == 1


def test_redis_out_of_reach_is_the_collectors_error_to_report() -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    with pytest.raises(redis.RedisError):  # ShardfuseCollector.collect reports it: shardfuse_up{component="redis"} 0
        pool_family(Settings(), fakeredis.FakeRedis(server=server))
