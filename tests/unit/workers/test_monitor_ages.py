"""The stuck-work view of ``shardfuse status``: how long the oldest message of each queue has waited, and
how long the longest-held delivered one has been held (kombu's Redis layout, on fakeredis)."""

from __future__ import annotations

import json

import fakeredis

from shardfuse.pipeline.config.settings import Settings
from shardfuse.workers.monitor import LostRebuilds, oldest_in_flight_s, oldest_waiting_s
from shardfuse.workers.names import PUBLISHED_HEADER

NOW = 5_000.0


def _message(published: float | None) -> bytes:
    headers = {"task": "shardfuse.ingest"} | ({} if published is None else {PUBLISHED_HEADER: published})
    return json.dumps({"body": "", "headers": headers, "properties": {}}).encode()


def test_the_oldest_waiting_message_is_the_one_next_in_line() -> None:
    client = fakeredis.FakeRedis()
    # kombu pushes on the left and pops on the right: the rightmost message is the oldest.
    client.lpush("ingest", _message(NOW - 90), _message(NOW - 10))
    client.lpush("embed\x06\x163", _message(NOW - 30))  # a priority list of the embed queue
    client.lpush("maintenance", _message(None))  # published by something that does not stamp
    ages = oldest_waiting_s(client, now=NOW)
    assert ages == {"ingest": 90.0, "embed": 30.0, "maintenance": None, "query": None}


def test_a_hostile_message_next_in_line_leaves_its_queue_without_an_age() -> None:
    # Anyone who can write to the broker can put any bytes on a queue; status reads the head before a worker
    # has set such an item aside. JSON nested past what the decoder recurses through must not break it.
    client = fakeredis.FakeRedis()
    client.lpush("ingest", b"[" * 100_000 + b"]" * 100_000)
    client.lpush("embed", b"not json", _message(NOW - 30))
    client.lpush("query", b'{"headers": 1}')
    assert oldest_waiting_s(client, now=NOW) == {"ingest": None, "embed": None, "maintenance": None, "query": None}


def test_the_longest_held_delivery_is_reported_per_queue() -> None:
    client = fakeredis.FakeRedis()
    for tag, queue, at in (("a", "ingest", NOW - 300), ("b", "ingest", NOW - 5), ("c", "embed", NOW - 42)):
        client.hset("unacked", tag, json.dumps([{"body": ""}, "", queue]))
        client.zadd("unacked_index", {tag: at})
    client.zadd("unacked_index", {"acked-meanwhile": NOW - 999})  # index entry whose message is gone
    assert oldest_in_flight_s(client, now=NOW) == {"ingest": 300.0, "embed": 42.0, "maintenance": None,
                                                   "query": None}


def _state(stale: list[int], maintenance: int = 0) -> dict[str, object]:
    return {"pending": {"ingest": 0, "embed": 0, "maintenance": maintenance}, "stale_shards": stale}


def test_a_shard_stale_with_no_maintenance_work_past_the_grace_is_due_a_rebuild_once_per_grace() -> None:
    lost = LostRebuilds(Settings(bm25={"rebuild_debounce_s": 1}))
    assert lost.grace_s == 6
    assert lost.due(_state([1]), now=100.0) == []  # stale since now: its rebuild may still be on its way
    assert lost.due(_state([1], maintenance=1), now=110.0) == []  # a rebuild is waiting or running
    assert lost.due(_state([1]), now=106.5) == [1]
    assert lost.due(_state([1]), now=107.0) == []  # sent: not again before another grace
    assert lost.due(_state([1]), now=113.0) == [1]


def test_a_shard_that_caught_up_starts_its_grace_afresh() -> None:
    lost = LostRebuilds(Settings(bm25={"rebuild_debounce_s": 1}))
    assert lost.due(_state([0]), now=100.0) == []
    assert lost.due(_state([]), now=103.0) == []  # rebuilt in time
    assert lost.due(_state([0]), now=107.0) == []  # stale again from a new write: a new grace
    assert lost.due(_state([0]), now=113.5) == [0]
