"""The broker's Redis read by the delivery reaper (shardfuse.workers.broker.redelivery) and the monitor
(shardfuse.workers.monitor): Redis down reaches their callers (``shardfuse status``/``wait``, the heartbeat)
as a StoreUnavailableError naming it, not as a redis-py error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fakeredis
import pytest

from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.workers import monitor
from shardfuse.workers.broker.redelivery import claimed_tags, orphaned_tags, publish_claims, release_orphans

CALLS: dict[str, Callable[[fakeredis.FakeRedis], Any]] = {
    "publish_claims": lambda c: publish_claims(c, holder="w1", tags=["t1"], ttl_s=30),
    "claimed_tags": claimed_tags,
    "orphaned_tags": lambda c: orphaned_tags(c, grace_s=40),
    "release_orphans": lambda c: release_orphans(c, lambda tag: None, holder="w1", grace_s=40, lock_s=1),
    "queue_depths": monitor.queue_depths,
    "unacked_by_queue": monitor.unacked_by_queue,
    "oldest_waiting_s": monitor.oldest_waiting_s,
    "oldest_in_flight_s": monitor.oldest_in_flight_s,
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_broker_that_is_down_is_store_unavailable(call: str) -> None:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    CALLS[call](client)  # works while the server is up
    server.connected = False
    with pytest.raises(StoreUnavailableError, match="Redis at .* is unreachable"):
        CALLS[call](client)
