"""Dead-worker release (shardfuse.workers.broker.redelivery): which unacknowledged messages count as orphaned, and that
releasing them goes through the restore callback once, under one reaper at a time."""

from __future__ import annotations

import json
import time

import fakeredis
import pytest

from shardfuse.pipeline.coordination.liveness import alive_key
from shardfuse.workers.broker.redelivery import (
    CLAIMANTS_KEY,
    CLAIMS_PREFIX,
    DeliveryWatch,
    claimed_tags,
    orphaned_tags,
    publish_claims,
    release_orphans,
)
from tests.support.polling import eventually

NOW = 1_000_000.0


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def _delivered(client: fakeredis.FakeRedis, tag: str, *, at: float, queue: str = "ingest") -> None:
    """What kombu's Redis transport records for a message handed to a worker."""
    client.hset("unacked", tag, json.dumps([{"body": "", "headers": {}}, "", queue]))
    client.zadd("unacked_index", {tag: at})


def test_an_old_message_nobody_claims_is_orphaned(client: fakeredis.FakeRedis) -> None:
    _delivered(client, "old-unclaimed", at=NOW - 100)
    _delivered(client, "old-claimed", at=NOW - 100)
    _delivered(client, "new-unclaimed", at=NOW - 1)  # may not be in its worker's claims yet
    publish_claims(client, holder="w1", tags=["old-claimed"], ttl_s=30)
    assert orphaned_tags(client, grace_s=40, now=NOW) == ["old-unclaimed"]


def test_claims_of_a_dead_worker_expire_and_its_messages_become_orphans(client: fakeredis.FakeRedis) -> None:
    _delivered(client, "t1", at=NOW - 100)
    publish_claims(client, holder="w1", tags=["t1"], ttl_s=30)
    assert orphaned_tags(client, grace_s=40, now=NOW) == []
    client.delete(CLAIMS_PREFIX + "w1")  # its claims expired: it stopped beating
    assert orphaned_tags(client, grace_s=40, now=NOW) == ["t1"]
    assert client.smembers(CLAIMANTS_KEY) == set()  # forgotten until it beats again


def test_claims_are_replaced_not_accumulated(client: fakeredis.FakeRedis) -> None:
    publish_claims(client, holder="w1", tags=["a", "b"], ttl_s=30)
    publish_claims(client, holder="w1", tags=["b"], ttl_s=30)
    publish_claims(client, holder="w2", tags=["c"], ttl_s=30)
    assert claimed_tags(client) == {"b", "c"}


def test_one_reaper_at_a_time_restores_each_orphan(client: fakeredis.FakeRedis) -> None:
    for tag in ("x", "y"):
        _delivered(client, tag, at=0)
    restored: list[str] = []
    assert release_orphans(client, restored.append, holder="r1", grace_s=10, lock_s=5) == ["x", "y"]
    # A second reaper within the lock's lifetime does nothing (the first one's pass may still be running).
    assert release_orphans(client, restored.append, holder="r2", grace_s=10, lock_s=5) == []
    assert restored == ["x", "y"]


def test_the_watch_claims_what_its_worker_holds_and_restores_the_rest(client: fakeredis.FakeRedis) -> None:
    _delivered(client, "mine", at=0)
    _delivered(client, "lost", at=0)
    restored: list[str] = []
    watch = DeliveryWatch(client, interval_s=0.5, dead_after_s=2, restore=restored.append, tags=lambda: {"mine"})
    watch.beat()
    assert restored == ["lost"]
    assert claimed_tags(client) == {"mine"}


def test_a_watch_started_before_redis_answers_starts_watching_when_it_does() -> None:
    server = fakeredis.FakeServer()
    server.connected = False  # the broker is not up yet
    client = fakeredis.FakeRedis(server=server)
    restored: list[str] = []
    watch = DeliveryWatch(client, interval_s=0.05, dead_after_s=1, restore=restored.append, tags=lambda: {"mine"})
    try:
        assert watch.start() is watch  # no exception: the worker goes on starting
        assert not watch.watching
        server.connected = True
        _delivered(client, "lost", at=0)
        eventually(lambda: watch.watching, timeout=10, what="the watch to start", interval=0.02)
        assert client.exists(alive_key(watch.holder))
        eventually(lambda: restored == ["lost"], timeout=10, what="the lost message to be restored", interval=0.02)
        assert claimed_tags(client) == {"mine"}
    finally:
        watch.stop()
    assert not client.exists(alive_key(watch.holder))


def test_a_watch_stopped_before_redis_answered_never_starts() -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    client = fakeredis.FakeRedis(server=server)
    watch = DeliveryWatch(client, interval_s=0.05, dead_after_s=1, restore=lambda tag: None, tags=set).start()
    watch.stop()
    server.connected = True
    time.sleep(0.2)  # four intervals: a starter still running would have started it
    assert not watch.watching
    assert not client.exists(alive_key(watch.holder))
