"""BM25 freshness (shardfuse.pipeline.index.lexical.freshness) raises only our errors: Redis down is a
StoreUnavailableError for every call a write, a rebuild or ``shardfuse status`` makes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis

from shardfuse.pipeline.core.errors import StoreUnavailableError, TransientError
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness

CALLS: dict[str, Callable[[Bm25Freshness], Any]] = {
    "mark_dirty": lambda f: f.mark_dirty(0, [("z", "a.md")]),
    "claim_merge": lambda f: f.claim_merge(0),
    "release_merge": lambda f: f.release_merge(0),
    "begin_rebuild": lambda f: f.begin_rebuild(0),
    "record_build": lambda f: f.record_build(0, seconds=1.0),
    "rebuild_delay": lambda f: f.rebuild_delay(0, debounce_s=1.0),
    "dirty_version": lambda f: f.dirty_version(0),
    "dirty_versions": lambda f: f.dirty_versions(2),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_call_on_a_redis_that_is_down_is_store_unavailable(call: str) -> None:
    server = fakeredis.FakeServer()
    freshness = Bm25Freshness(fakeredis.FakeRedis(server=server))
    server.connected = False
    with pytest.raises(StoreUnavailableError, match="BM25 freshness: Redis at .* is unreachable") as caught:
        CALLS[call](freshness)
    assert isinstance(caught.value.__cause__, redis.ConnectionError)


def test_a_value_redis_refuses_to_read_is_transient() -> None:
    client = fakeredis.FakeRedis()
    client.hset("shardfuse:bm25:0:dirty", "not", "a counter")  # GET on a hash: WRONGTYPE
    with pytest.raises(TransientError, match=r"failed \(ResponseError"):
        Bm25Freshness(client).dirty_version(0)
