"""The query-embedding cache: LRU, Redis shared across processes, and Redis outages."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import fakeredis
import numpy as np
import pytest
import redis

from shardfuse.pipeline.config.settings import EmbedderSettings
from shardfuse.pipeline.embed.providers import HashingEmbedder, Vectors
from shardfuse.pipeline.embed.query_cache import CachedQueryEmbedder

DIM = 16


class CountingEmbedder:
    """A real (hashing) embedder that counts its query calls."""

    def __init__(self, dimensions: int = DIM, name: str | None = None) -> None:
        self._inner = HashingEmbedder(dimensions)
        self._name = name or self._inner.name
        self.query_calls: list[str] = []
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dimensions(self) -> int:
        return self._inner.dimensions

    def embed_documents(self, texts: Sequence[str]) -> Vectors:
        return self._inner.embed_documents(texts)

    def embed_query(self, text: str) -> Vectors:
        with self._lock:
            self.query_calls.append(text)
        return self._inner.embed_query(text)


class BrokenRedis:
    """A client whose server is down: every command fails as redis-py's does."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, key: str) -> Any:
        self.calls += 1
        raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    def register_script(self, script: str) -> Any:
        def run(*, keys: Any, args: Any) -> Any:
            self.calls += 1
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

        return run


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def _client(server: fakeredis.FakeServer) -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(server=server)


def test_delegates_everything_but_queries() -> None:
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=8)
    assert (cached.name, cached.dimensions) == (inner.name, inner.dimensions)
    np.testing.assert_array_equal(cached.embed_documents(["a b", "c"]), inner.embed_documents(["a b", "c"]))
    assert inner.query_calls == []


def test_lru_hit_avoids_the_embedder() -> None:
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=8)
    first = cached.embed_query("how are vectors stored")
    again = cached.embed_query("how are vectors stored")
    assert inner.query_calls == ["how are vectors stored"]
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, HashingEmbedder(DIM).embed_query("how are vectors stored"))
    assert again.dtype == np.float32 and again.shape == (DIM,)
    assert (cached.stats.lru_hits, cached.stats.misses) == (1, 1)


def test_a_caller_modifying_its_vector_does_not_touch_the_cache() -> None:
    cached = CachedQueryEmbedder(CountingEmbedder(), entries=8)
    vector = cached.embed_query("q")
    expected = vector.copy()
    vector *= 0
    np.testing.assert_array_equal(cached.embed_query("q"), expected)


def test_lru_is_bounded_and_evicts_the_least_recently_used() -> None:
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=2)
    cached.embed_query("a")
    cached.embed_query("b")
    cached.embed_query("a")  # a is now the most recent
    cached.embed_query("c")  # evicts b
    assert len(cached._lru) == 2
    inner.query_calls.clear()
    cached.embed_query("a")
    cached.embed_query("c")
    assert inner.query_calls == []
    cached.embed_query("b")
    assert inner.query_calls == ["b"]


def test_zero_entries_switches_the_lru_off() -> None:
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=0)
    cached.embed_query("q")
    cached.embed_query("q")
    assert inner.query_calls == ["q", "q"] and len(cached._lru) == 0


def test_redis_shares_vectors_between_processes(server: fakeredis.FakeServer) -> None:
    # Two worker processes: separate embedders, separate LRUs, one Redis.
    first_inner, second_inner = CountingEmbedder(), CountingEmbedder()
    first = CachedQueryEmbedder(first_inner, entries=8, redis=_client(server), ttl_s=60)
    second = CachedQueryEmbedder(second_inner, entries=8, redis=_client(server), ttl_s=60)
    vector = first.embed_query("shared query")
    from_redis = second.embed_query("shared query")
    assert first_inner.query_calls == ["shared query"] and second_inner.query_calls == []
    np.testing.assert_array_equal(from_redis, vector)
    assert from_redis.dtype == np.float32
    second.embed_query("shared query")  # now in the second process's LRU
    assert (second.stats.redis_hits, second.stats.lru_hits, second.stats.misses) == (1, 1, 0)


def test_redis_value_is_raw_float32_with_the_ttl(server: fakeredis.FakeServer) -> None:
    client = _client(server)
    cached = CachedQueryEmbedder(CountingEmbedder(), entries=8, redis=client, ttl_s=3600)
    vector = cached.embed_query("q")
    key = cached.redis_key("q")
    assert key.startswith("shardfuse:qemb:")
    assert client.get(key) == vector.astype("<f4").tobytes()
    assert 3590 <= client.ttl(key) <= 3600


def test_zero_ttl_switches_redis_off(server: fakeredis.FakeServer) -> None:
    client = _client(server)
    cached = CachedQueryEmbedder(CountingEmbedder(), entries=8, redis=client, ttl_s=0)
    cached.embed_query("q")
    assert client.keys("*") == []
    assert CachedQueryEmbedder(CountingEmbedder(), entries=8, redis=client, ttl_s=60, redis_entries=0).embed_query(
        "q").shape == (DIM,)
    assert client.keys("*") == []  # nor does a bound of no entries


def test_embedders_with_other_names_or_sizes_do_not_collide(server: fakeredis.FakeServer) -> None:
    a_inner, b_inner = CountingEmbedder(name="model-a"), CountingEmbedder(name="model-b")
    a = CachedQueryEmbedder(a_inner, entries=8, redis=_client(server), ttl_s=60)
    b = CachedQueryEmbedder(b_inner, entries=8, redis=_client(server), ttl_s=60)
    wide = CachedQueryEmbedder(
        CountingEmbedder(dimensions=32, name="model-a"), entries=8, redis=_client(server), ttl_s=60
    )
    a.embed_query("q")
    b.embed_query("q")
    assert wide.embed_query("q").shape == (32,)
    assert a_inner.query_calls == ["q"] and b_inner.query_calls == ["q"]
    assert len({a.redis_key("q"), b.redis_key("q"), wide.redis_key("q")}) == 3
    assert len(_client(server).keys("shardfuse:qemb:*")) == 3


def test_redis_value_of_the_wrong_size_is_recomputed(server: fakeredis.FakeServer) -> None:
    client = _client(server)
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=8, redis=client, ttl_s=60)
    client.set(cached.redis_key("q"), b"\x00" * 12)
    assert cached.embed_query("q").shape == (DIM,)
    assert inner.query_calls == ["q"]


def test_redis_outage_costs_only_the_cache(caplog: pytest.LogCaptureFixture) -> None:
    broken = BrokenRedis()
    now = [100.0]
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=8, redis=broken, ttl_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="shardfuse.pipeline.embed.query_cache"):
        vector = cached.embed_query("q")
    np.testing.assert_array_equal(vector, HashingEmbedder(DIM).embed_query("q"))
    assert broken.calls == 1  # the read failed, so the write was not even tried
    assert "Redis read failed" in caplog.text and "unreachable (ConnectionError" in caplog.text
    cached.embed_query("other")  # within the back-off: Redis is not asked again
    assert broken.calls == 1 and inner.query_calls == ["q", "other"]
    now[0] += 6
    cached.embed_query("third")  # after it: tried again (and still down)
    assert broken.calls == 2 and cached.stats.redis_errors == 2


def test_from_settings_reads_the_embedder_section(server: fakeredis.FakeServer) -> None:
    settings = EmbedderSettings(query_cache_entries=3, query_cache_ttl_s=120)
    client = _client(server)
    cached = CachedQueryEmbedder.from_settings(CountingEmbedder(), settings, redis=client)
    assert cached._lru.capacity == 3
    cached.embed_query("q")
    assert 110 <= client.ttl(cached.redis_key("q")) <= 120


def test_concurrent_queries_are_safe() -> None:
    inner = CountingEmbedder()
    cached = CachedQueryEmbedder(inner, entries=16)
    texts = [f"query {i % 24}" for i in range(400)]
    results: dict[str, list[np.ndarray]] = {}
    lock = threading.Lock()

    def run(chunk: list[str]) -> None:
        for text in chunk:
            vector = cached.embed_query(text)
            with lock:
                results.setdefault(text, []).append(vector)

    threads = [threading.Thread(target=run, args=(texts[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cached._lru) <= 16
    reference = HashingEmbedder(DIM)
    for text, vectors in results.items():
        for vector in vectors:
            np.testing.assert_array_equal(vector, reference.embed_query(text))
