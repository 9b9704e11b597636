"""Filtered and zone-scoped vector searches: pgvector 0.8's iterative HNSW scans on the embedded stack's own
server, and the exact-scan fallback on a pgvector 0.6 server (``pgserver``, the embedded server of earlier
releases).

The shard holds 10,000 chunks in zone ``z``; every 100th is marked ``{"p1": true}`` (1 %), and zone ``small``
holds a copy of those 100. A plain HNSW scan (iterative scans off, as on pgvector 0.6) sees ``ef_search``
candidates of the whole shard and filters after: about 1 % of them pass, so it comes back short.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store import ChunkFilter, DocStatus, DocumentChange, ShardStore, reads
from shardfuse.pipeline.index.store.connections import open_pool, server_features
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from tests.integration.conftest import Stack, scratch_store
from tests.support.pgvector_server import pgvector_06_server

pytestmark = pytest.mark.integration
DIM = 16
ROWS = 10_000
EF_SEARCH = 40
SCHEMA = sql.Identifier("shard_0")
NEAREST = "shardfuse.pipeline.index.store.nearest"
ONE_PERCENT = ChunkFilter(metadata={"p1": True})


def _vectors() -> np.ndarray:
    vectors = np.random.default_rng(22).standard_normal((ROWS, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _queries() -> np.ndarray:
    queries = np.random.default_rng(23).standard_normal((8, DIM)).astype(np.float32)
    return queries / np.linalg.norm(queries, axis=1, keepdims=True)


def _changes(positions: range | list[int], vectors: np.ndarray, *, zone: str) -> list[DocumentChange]:
    changes = []
    for i in positions:
        event = WriteEvent(op=Op.WRITE, zone=zone, path=f"d{i}", content_hash="sha256:" + "5" * 64, seq=1,
                           metadata={"p1": i % 100 == 0})
        changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(Chunk(0, f"c{i}", 0, 2, 1, 1, 1),),
                                      embeddings=vectors[i:i + 1], line_count=1))
    return changes


def _fill(store: ShardStore, vectors: np.ndarray) -> None:
    """The 10,000 chunks and the small zone, loaded without the index, then indexed (and analysed)."""
    assert store.defer_vector_index()
    for start in range(0, ROWS, 2000):
        store.apply(_changes(range(start, min(start + 2000, ROWS)), vectors, zone="z"))
    store.apply(_changes(list(range(0, ROWS, 100)), vectors, zone="small"))
    assert store.build_vector_index() is not None


def _true_top10(vectors: np.ndarray, query: np.ndarray, zone: str) -> list[str]:
    scores = np.full(ROWS, -np.inf, dtype=np.float32)
    scores[::100] = vectors[::100] @ query  # both cases hold exactly the 1 %
    return [chunk_id(zone, f"d{i}", 1, 0) for i in np.argsort(-scores, kind="stable")[:10]]


@pytest.fixture(scope="module")
def shard(stack: Stack) -> Iterator[tuple[ShardStore, np.ndarray]]:
    vectors = _vectors()
    with scratch_store(stack, "filtered", dimensions=DIM, index=BuildSettings(parallel_workers=1)) as store:
        _fill(store, vectors)
        yield store, vectors


@pytest.fixture
def index_only(shard: tuple[ShardStore, np.ndarray]) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the shard's database on which only the HNSW index can order rows (sorting disabled):
    what the planner picks for a shard too large to sort, whatever the filter."""
    store, _ = shard
    with psycopg.connect(str(store.pool.conninfo), autocommit=True) as conn:
        register_vector(conn)
        conn.execute("SET enable_sort = off")
        yield conn


def _plan(conn: psycopg.Connection[Any], query: np.ndarray, *, zone: str, where: ChunkFilter) -> str:
    conditions, params = where.sql()
    statement = sql.SQL(
        "EXPLAIN SELECT chunk_id FROM shard_0.chunks WHERE zone = %s{c} ORDER BY embedding <=> %s LIMIT 10"
    ).format(c=conditions)
    return " ".join(r[0] for r in conn.execute(statement, [zone, *params, query]))


def test_the_embedded_server_has_iterative_scans(shard: tuple[ShardStore, np.ndarray]) -> None:
    store, _ = shard
    with store.pool.connection() as conn:
        features = server_features(conn)
    assert features.iterative_scan and features.pgvector >= (0, 8), features


@pytest.mark.parametrize(("zone", "where"), [("z", ONE_PERCENT), ("small", ChunkFilter())], ids=["filter", "zone"])
def test_a_one_percent_search_returns_its_true_top10_from_the_hnsw_index_without_fallback(
    shard: tuple[ShardStore, np.ndarray], index_only: psycopg.Connection[Any], zone: str, where: ChunkFilter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, vectors = shard
    conditions, params = where.sql()
    plain = sql.SQL("SELECT chunk_id FROM shard_0.chunks WHERE zone = %s{c} ORDER BY embedding <=> %s LIMIT 10"
                    ).format(c=conditions)
    caplog.set_level(logging.INFO, logger=NEAREST)
    for query in _queries():
        assert "chunks_embedding_hnsw" in _plan(index_only, query, zone=zone, where=where)
        hits = reads.vector_search(index_only, SCHEMA, query, zone=zone, limit=10, ef_search=EF_SEARCH, where=where)
        assert [h.chunk_id for h in hits] == _true_top10(vectors, query, zone)
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)  # relaxed order, sorted again
        # Through the pool, with whatever plan the planner prefers: the same answer.
        pooled = store.vector_search(query, zone=zone, limit=10, ef_search=EF_SEARCH, where=where)
        assert [h.chunk_id for h in pooled] == [h.chunk_id for h in hits]
        # What the index alone gives without iterative scans (pgvector 0.6): too few rows.
        index_only.execute("SET hnsw.iterative_scan = off")
        try:
            assert len(index_only.execute(plain, [zone, *params, query]).fetchall()) < 10
        finally:
            index_only.execute("SET hnsw.iterative_scan = relaxed_order")
    assert [r.getMessage() for r in caplog.records if r.name == NEAREST] == []  # neither widened nor exact


def test_a_scan_stopped_by_max_scan_tuples_is_widened_not_made_exact(
    shard: tuple[ShardStore, np.ndarray], index_only: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    store, vectors = shard
    index_only.execute("SET hnsw.max_scan_tuples = 60")  # ~0.6 rows of the 1 % pass before the scan gives up
    caplog.set_level(logging.INFO, logger=NEAREST)
    query = _queries()[0]
    hits = reads.vector_search(index_only, SCHEMA, query, zone="z", limit=10, ef_search=EF_SEARCH, where=ONE_PERCENT)
    assert [h.chunk_id for h in hits] == _true_top10(vectors, query, "z")
    assert [r.levelno for r in caplog.records if r.name == NEAREST] == [logging.INFO]  # widened, no warning
    assert "widened" in caplog.records[-1].getMessage()
    assert index_only.execute("SHOW hnsw.max_scan_tuples").fetchone() == ("60",)  # the session's own again


def test_pgvector_0_6_answers_the_same_search_through_the_exact_fallback() -> None:
    vectors = _vectors()
    with pgvector_06_server("filtered06-") as server:
        name = f"filtered06_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        pool = open_pool(server.get_uri(database=name), max_size=2)
        try:
            store = ShardStore(pool, 0, dimensions=DIM, index=BuildSettings(parallel_workers=1))
            store.ensure_schema()
            _fill(store, vectors)
            with pool.connection() as conn:
                assert not server_features(conn).iterative_scan
            for query in _queries()[:3]:
                hits = store.vector_search(query, zone="z", limit=10, ef_search=EF_SEARCH, where=ONE_PERCENT)
                assert [h.chunk_id for h in hits] == _true_top10(vectors, query, "z")
        finally:
            pool.close()
