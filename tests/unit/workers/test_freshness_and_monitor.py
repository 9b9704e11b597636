"""BM25 freshness bookkeeping and broker views, on fakeredis (pure unit tests of Redis-using code)."""

from __future__ import annotations

import json

import fakeredis

from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.workers.monitor import queue_depths, unacked_by_queue


def test_first_write_schedules_a_rebuild_and_later_writes_ride_along() -> None:
    tracker = Bm25Freshness(fakeredis.FakeRedis())
    assert tracker.mark_dirty(0) is True
    first = tracker.dirty_version(0)
    assert tracker.mark_dirty(0) is False and tracker.mark_dirty(0) is False
    assert tracker.mark_dirty(1) is True  # shards are independent
    assert tracker.dirty_version(0) > first > 0  # every commit moves the write version forward


def test_a_write_during_a_rebuild_schedules_another_one() -> None:
    tracker = Bm25Freshness(fakeredis.FakeRedis())
    tracker.mark_dirty(0)
    seen = tracker.begin_rebuild(0)  # clears the flag
    assert seen == tracker.dirty_version(0)
    assert tracker.mark_dirty(0) is True  # committed while the build ran: not covered by it
    assert tracker.dirty_version(0) > seen


def test_write_versions_never_repeat_after_redis_lost_them() -> None:
    """The result cache keys answers by write version: after a flush (or a failover that lost the last
    writes) the next commit's version must be above every version given before, or an old answer could be
    served again under a repeated key."""
    client = fakeredis.FakeRedis()
    tracker = Bm25Freshness(client)
    given = []
    for _ in range(50):
        tracker.mark_dirty(0)
        given.append(tracker.dirty_version(0))
    assert given == sorted(set(given))  # strictly increasing
    client.flushall()
    assert tracker.dirty_versions(2) == [0, 0]
    assert tracker.mark_dirty(0) is True  # the flag was lost too: this commit schedules the update
    assert tracker.dirty_version(0) > max(given)
    client.set("shardfuse:bm25:0:dirty", given[10])  # lost its last writes (AOF everysec, a failover)
    tracker.mark_dirty(0)
    assert tracker.dirty_version(0) > max(given)


def test_queue_views_read_kombu_redis_layout() -> None:
    client = fakeredis.FakeRedis()
    client.rpush("ingest", "m1", "m2")
    client.rpush("ingest\x06\x169", "m3")  # a priority-9 message
    client.rpush("embed", "m4")
    client.hset("unacked", "tag1", json.dumps([{"body": "..."}, "", "maintenance"]))
    client.hset("unacked", "tag2", json.dumps([{"body": "..."}, "", "ingest"]))
    client.hset("unacked", "tag3", "corrupt")
    assert queue_depths(client) == {"ingest": 3, "embed": 1, "maintenance": 0, "query": 0}
    assert unacked_by_queue(client) == {"ingest": 1, "embed": 0, "maintenance": 1, "query": 0}


def test_rebuilds_are_paced_by_how_long_the_last_one_took() -> None:
    tracker = Bm25Freshness(fakeredis.FakeRedis())
    assert tracker.rebuild_delay(0, debounce_s=1.0) == 1.0  # no build yet: the debounce
    tracker.record_build(0, seconds=0.2)
    assert tracker.rebuild_delay(0, debounce_s=1.0) == 1.0
    tracker.record_build(0, seconds=3.0)
    assert tracker.rebuild_delay(0, debounce_s=1.0) == 6.0
    assert tracker.rebuild_delay(1, debounce_s=1.0) == 1.0  # per shard


def test_unacked_messages_are_counted_by_the_routing_key_at_their_end_whatever_their_body_holds() -> None:
    client = fakeredis.FakeRedis()
    tricky = '", "query"], "x", "maintenance\\"]'  # a body whose text looks like the end of an entry
    client.hset("unacked", "a", json.dumps([{"body": tricky, "chunks": [1, 2, "a,b"]}, "", "embed"]))
    client.hset("unacked", "b", json.dumps([{"body": "..."}, "", "embed"], indent=1))
    client.hset("unacked", "c", json.dumps([{"body": "..."}, "", "maintenance"], separators=(",", ":")))
    client.hset("unacked", "d", json.dumps([{"body": "..."}, "", 'a,"b"']))  # a key the tail cannot be read from
    client.hset("unacked", "e", json.dumps([{"body": "..."}, ["embed"]]))  # not a triple
    client.hset("unacked", "f", json.dumps([{"body": "..."}, "", ["ingest"]]))
    assert unacked_by_queue(client) == {"ingest": 0, "embed": 2, "maintenance": 1, "query": 0}
