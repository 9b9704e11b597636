"""EmbeddingCache against real PostgreSQL + pgvector: round trips, misses, models side by side, and
concurrent writers of the same hashes."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.core.errors import StoreUnavailableError
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.store import EmbeddingCache, open_pool
from tests.integration.conftest import Stack
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def pool(stack: Stack) -> Iterator[ConnectionPool[Any]]:
    """A fresh database per test, with the shared schema created as a worker would."""
    base = stack.settings.postgres.dsn
    name = f"cache_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    pool = open_pool(base.rsplit("/", 1)[0] + f"/{name}", max_size=8)
    EmbeddingCache(pool, provider="p", model="m", dimensions=8).ensure_schema()
    yield pool
    pool.close()


def _vectors(dimensions: int, *texts: str) -> dict[str, np.ndarray]:
    embedder = HashingEmbedder(dimensions)
    return {f"sha256:{t}": v for t, v in zip(texts, embedder.embed_documents(texts), strict=True)}


def test_round_trip_and_misses(pool: ConnectionPool[Any]) -> None:
    cache = EmbeddingCache(pool, provider="hashing", model="v1", dimensions=16)
    stored = _vectors(16, "alpha beta", "gamma", "delta epsilon")
    assert cache.put_many(stored) == 3
    got = cache.get_many([*stored, "sha256:never", "sha256:gamma"])  # a repeated hash is looked up once
    assert set(got) == set(stored)
    for key, vector in got.items():
        assert vector.dtype == np.float32 and vector.shape == (16,)
        np.testing.assert_array_equal(vector, stored[key])
    assert (cache.stats.hits, cache.stats.misses, cache.stats.stored) == (3, 1, 3)
    assert cache.get_many([]) == {} and cache.put_many({}) == 0


def test_a_stored_vector_is_never_replaced(pool: ConnectionPool[Any]) -> None:
    cache = EmbeddingCache(pool, provider="hashing", model="v1", dimensions=4)
    first = np.array([1, 0, 0, 0], dtype=np.float32)
    assert cache.put_many({"h": first}) == 1
    assert cache.put_many({"h": np.array([0, 1, 0, 0], dtype=np.float32), "h2": first}) == 1
    np.testing.assert_array_equal(cache.get_many(["h"])["h"], first)


def test_models_and_sizes_coexist(pool: ConnectionPool[Any]) -> None:
    small = EmbeddingCache(pool, provider="openai", model="text-embedding-3-small", dimensions=8)
    large = EmbeddingCache(pool, provider="openai", model="text-embedding-3-small", dimensions=32)
    other = EmbeddingCache(pool, provider="voyage", model="voyage-code-3", dimensions=8)
    small.put_many(_vectors(8, "same text"))
    large.put_many(_vectors(32, "same text"))
    assert other.get_many(["sha256:same text"]) == {}
    assert small.get_many(["sha256:same text"])["sha256:same text"].shape == (8,)
    assert large.get_many(["sha256:same text"])["sha256:same text"].shape == (32,)


def test_a_vector_of_the_wrong_size_is_refused(pool: ConnectionPool[Any]) -> None:
    cache = EmbeddingCache(pool, provider="p", model="m", dimensions=8)
    with pytest.raises(ValueError, match=r"shape \(4,\), expected \(8,\)"):
        cache.put_many({"h": np.zeros(4, dtype=np.float32)})
    assert cache.get_many(["h"]) == {}


def test_concurrent_writers_of_the_same_hashes_do_not_fail(pool: ConnectionPool[Any]) -> None:
    rounds, per_round = 4, 1000
    vectors = _vectors(8, *(f"text {i}" for i in range(rounds * per_round)))
    keys = list(vectors)
    writers = 4
    barrier = threading.Barrier(writers)
    errors: list[BaseException] = []
    new_rows: list[int] = []
    caches = [EmbeddingCache(pool, provider="p", model="m", dimensions=8) for _ in range(writers)]

    def write(writer: int) -> None:
        try:
            for r in range(rounds):
                fresh = keys[r * per_round : (r + 1) * per_round]
                # The same new hashes in different orders, at the same moment: the case that deadlocks
                # when each writer inserts in its own order.
                order = [fresh, fresh[::-1], fresh[500:] + fresh[:500], fresh[::2] + fresh[1::2]][writer]
                barrier.wait()
                new_rows.append(caches[writer].put_many({k: vectors[k] for k in order}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert sum(new_rows) == len(keys)  # every hash stored exactly once, by whoever came first
    got = caches[0].get_many(keys)
    assert set(got) == set(keys)
    for key in keys:
        np.testing.assert_array_equal(got[key], vectors[key])


def test_an_unreachable_database_is_transient() -> None:
    dsn = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"  # nothing listens there
    unreachable: ConnectionPool[Any] = ConnectionPool(dsn, min_size=1, timeout=1, open=False)
    unreachable.open(wait=False)
    try:
        cache = EmbeddingCache(unreachable, provider="p", model="m", dimensions=8)
        with pytest.raises(StoreUnavailableError, match="embedding cache database unavailable"):
            cache.get_many(["h"])
        with pytest.raises(StoreUnavailableError):
            cache.put_many({"h": np.zeros(8, dtype=np.float32)})
    finally:
        unreachable.close()
