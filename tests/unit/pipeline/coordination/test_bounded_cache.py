"""The caches in the broker's Redis cannot starve it (issue 20, item 6): each holds at most its bound of
entries, none over its entry size, whatever the traffic; a Redis that refuses writes costs the caches, never
a query. Against a real redis-server (the Lua scripts' semantics and memory figures are Redis's own).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis

from shardfuse.pipeline.coordination.bounded_cache import INDEX_PREFIX, BoundedRedisCache
from shardfuse.pipeline.coordination.chunk_registry import RedisChunkRegistry
from shardfuse.pipeline.core.errors import TransientError
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder
from shardfuse.query.expansion.cache import RedisExpansionCache
from shardfuse.query.expansion.prompt import Expansion
from shardfuse.query.result_cache import RedisResultCache
from tests.support.socket_redis import socket_redis

DIM = 384  # the default local model's size
TRAFFIC = 10  # distinct entries sent per entry of bound


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with socket_redis(tmp_path_factory.mktemp("redis")) as sock:
        yield sock


@pytest.fixture
def client(server: Path) -> Iterator[redis.Redis]:
    connection = redis.Redis(unix_socket_path=str(server))
    connection.flushall()
    yield connection
    connection.config_set("maxmemory", 0)
    connection.close()


def _count(client: redis.Redis, pattern: str) -> int:
    return sum(1 for _ in client.scan_iter(pattern, count=1000))


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _answer(number: int) -> dict[str, object]:
    text = f"def handler_{number}(request):\n    return respond(request)\n" * 20
    return {"results": [{"chunk_id": f"c{number}-{i}", "path": f"src/m{number}.py", "text": text, "score": 1.0}
                        for i in range(10)], "timings_ms": {"total": 12.5}}


def test_query_embeddings_stay_within_their_bound(client: redis.Redis) -> None:
    bound = 200
    cached = CachedQueryEmbedder(HashingEmbedder(DIM), entries=0, redis=client, ttl_s=3600, redis_entries=bound)
    for number in range(bound * TRAFFIC // 2):
        cached.embed_query(f"distinct query {number}")
    half = _used(client)
    for number in range(bound * TRAFFIC // 2, bound * TRAFFIC):
        cached.embed_query(f"distinct query {number}")
    assert _count(client, "shardfuse:qemb:*") == bound
    assert client.zcard(INDEX_PREFIX + "query-embeddings") == bound
    # Twice the traffic, not twice the memory: the second half replaced entries instead of adding them.
    assert _used(client) - half < 0.05 * half
    # The newest are the ones kept: a repeat of the last query is answered from Redis.
    again = CachedQueryEmbedder(HashingEmbedder(DIM), entries=0, redis=client, ttl_s=3600, redis_entries=bound)
    again.embed_query(f"distinct query {bound * TRAFFIC - 1}")
    assert again.stats.redis_hits == 1


def test_answers_stay_within_their_bound_and_size(client: redis.Redis) -> None:
    bound = 100
    cache = RedisResultCache(client, ttl_s=300, max_entries=bound, max_entry_bytes=64 * 1024)
    for number in range(bound * TRAFFIC):
        cache.put(f"shardfuse:results:z:{number}", _answer(number))
    assert _count(client, "shardfuse:results:*") == bound
    assert cache.get(f"shardfuse:results:z:{bound * TRAFFIC - 1}") == _answer(bound * TRAFFIC - 1)
    assert cache.get("shardfuse:results:z:0") is None  # the oldest went first
    huge = {"results": [{"text": "x" * 70_000}]}
    cache.put("shardfuse:results:z:huge", huge)
    assert cache.get("shardfuse:results:z:huge") is None  # over max_entry_bytes: never stored


def test_expansions_stay_within_their_bound(client: redis.Redis) -> None:
    bound = 100
    cache = RedisExpansionCache(client, max_entries=bound, max_entry_bytes=4096)
    expansion = Expansion(lexical=("alpha beta",), questions=("what does it ask?",), passage="An answer.")
    for number in range(bound * TRAFFIC):
        cache.put(f"key-{number}", expansion, 600)
    assert _count(client, "shardfuse:expansion:*") == bound
    assert cache.get(f"key-{bound * TRAFFIC - 1}") == expansion


def test_the_chunk_registry_stops_claiming_at_its_bound(client: redis.Redis) -> None:
    registry = RedisChunkRegistry(client, max_chunks=500)
    for document in range(50):
        registry.repeated("z", f"doc-{document}.md", [f"h-{document}-{i}" for i in range(100)])
    assert registry.size("z") == 500
    # Claims made before the bound still find repeats; chunks past it are simply not repeats.
    assert registry.repeated("z", "copy.md", ["h-0-0", "h-49-0"]) == {"h-0-0"}
    assert registry.repeated("z", "doc-0.md", ["h-0-1"]) == set()  # its own claim
    assert registry.size("z") == 500
    assert RedisChunkRegistry(client, max_chunks=500).repeated("other-zone", "a.md", ["h-0-0"]) == set()


def test_concurrent_writers_never_overshoot_the_bound(server: Path, client: redis.Redis) -> None:
    bound = 50
    start = threading.Barrier(8)

    def write(worker: int) -> None:
        own = redis.Redis(unix_socket_path=str(server))
        cache = BoundedRedisCache(own, name="race", max_entries=bound, max_entry_bytes=100)
        start.wait()
        for number in range(200):
            cache.put(f"race:{worker}:{number}", b"v" * 50, ttl_s=60)
        own.close()

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert _count(client, "race:*") == bound
    assert client.zcard(INDEX_PREFIX + "race") == bound


def test_expired_entries_leave_the_index(client: redis.Redis) -> None:
    cache = BoundedRedisCache(client, name="short", max_entries=10, max_entry_bytes=100)
    for number in range(5):
        assert cache.put(f"short:{number}", b"v", ttl_s=0.2)
    time.sleep(0.3)
    cache.put("short:new", b"v", ttl_s=60)
    assert cache.size() == 1
    assert 59_000 < client.pttl(INDEX_PREFIX + "short") <= 60_000  # the index expires with its last entry


def test_a_broker_that_refuses_writes_costs_the_caches_never_the_query(client: redis.Redis) -> None:
    # A broker at its maxmemory (noeviction) refuses every write, as it would under a backlog.
    client.set("ballast", b"x" * 2_000_000)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", _used(client) - 100_000)
    with pytest.raises(redis.ResponseError, match="maxmemory"):
        client.set("probe", b"1")

    embedder = CachedQueryEmbedder(HashingEmbedder(DIM), entries=0, redis=client, ttl_s=60)
    vector = embedder.embed_query("a query while the broker is full")
    np.testing.assert_array_equal(vector, HashingEmbedder(DIM).embed_query("a query while the broker is full"))
    assert embedder.stats.redis_errors == 1
    results = RedisResultCache(client, ttl_s=60)
    results.put("shardfuse:results:z:full", _answer(1))  # refused by Redis, swallowed
    assert results.get("shardfuse:results:z:full") is None
    expansions = RedisExpansionCache(client)
    expansions.put("k", Expansion(lexical=("a",)), 60)
    assert expansions.get("k") is None
    # The chunk registry is not a cache: its failure is ours, and the ingest task retries the document.
    with pytest.raises(TransientError, match="maxmemory"):
        RedisChunkRegistry(client).repeated("z", "a.md", ["h1"])
