"""The stuck-work view of ``shardfuse status``: how long the oldest message of each queue has waited, and
how long the longest-held delivered one has been held (kombu's Redis layout, on fakeredis)."""

from __future__ import annotations

import json

import fakeredis

from workers.monitor import oldest_in_flight_s, oldest_waiting_s
from workers.names import PUBLISHED_HEADER

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


def test_the_longest_held_delivery_is_reported_per_queue() -> None:
    client = fakeredis.FakeRedis()
    for tag, queue, at in (("a", "ingest", NOW - 300), ("b", "ingest", NOW - 5), ("c", "embed", NOW - 42)):
        client.hset("unacked", tag, json.dumps([{"body": ""}, "", queue]))
        client.zadd("unacked_index", {tag: at})
    client.zadd("unacked_index", {"acked-meanwhile": NOW - 999})  # index entry whose message is gone
    assert oldest_in_flight_s(client, now=NOW) == {"ingest": 300.0, "embed": 42.0, "maintenance": None,
                                                   "query": None}
