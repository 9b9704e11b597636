"""Shards of one database read together (query/shard_batches.py, pipeline/index/store/multi_shard.py): one
statement per batch answers what each shard's own search and fetch answer, on pgvector 0.8 (iterative scans) and
0.6 (the exact-scan fallback)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.store import ChunkFilter, DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool, reading_connection
from shardfuse.pipeline.index.store.schema import shard_schema
from shardfuse.query.shard_batches import StoreBatch, store_batches
from tests.support.pgvector_server import pgvector_06_server, pgvector_08_server

pytestmark = pytest.mark.integration
DIM = 16
EMBED = HashingEmbedder(DIM)
SERVERS = {"pgvector 0.8": pgvector_08_server, "pgvector 0.6": pgvector_06_server}


@contextlib.contextmanager
def _database(server: Any) -> Iterator[Any]:
    name = f"batches_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    pool = open_pool(server.get_uri(database=name), max_size=4)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="module", params=list(SERVERS))
def stores(request: pytest.FixtureRequest) -> Iterator[list[ShardStore]]:
    """Shards 0-2 in one database, shard 3 in another; zone ``big`` everywhere, a small zone ``small``."""
    with SERVERS[request.param]("batches-") as server, _database(server) as one, _database(server) as other:
        stores = [ShardStore(one, shard, dimensions=DIM) for shard in range(3)] + [ShardStore(other, 3, dimensions=DIM)]
        for store in stores:
            store.ensure_schema()
            n = store.shard
            store.apply([_write(f"s{n}/doc{i}.txt", [f"common words {i} of shard {n}", f"other text {i * n}"],
                                zone="big") for i in range(120)])
            store.apply([_write(f"s{n}/rare{i}.txt", [f"rare item {i}"], zone="small") for i in range(3)])
        yield stores


def _write(path: str, texts: list[str], *, zone: str) -> DocumentChange:
    event = WriteEvent(op=Op.WRITE, zone=zone, path=path, content_hash="sha256:" + "2" * 64, seq=1)
    chunks = tuple(Chunk(i, t, 0, len(t), i + 1, i + 1, 3) for i, t in enumerate(texts))
    return DocumentChange(event=event, status=DocStatus.INDEXED, chunks=chunks, embeddings=EMBED.embed_documents(texts),
                          line_count=len(texts))


def test_shards_are_batched_by_database(stores: list[ShardStore]) -> None:
    batches = store_batches(stores, ef_search=40, statements_per_database=2)
    assert sorted(b.shards for b in batches.fetch) == [(0, 1, 2), (3,)]
    assert sorted(b.shards for b in batches.vector) == [(0, 2), (1,), (3,)]
    per_shard = store_batches(stores, ef_search=40, statements_per_database=0)
    assert sorted(b.shards for b in per_shard.vector) == [(0,), (1,), (2,), (3,)]
    with pytest.raises(ValueError, match="one database"):
        StoreBatch([stores[0], stores[3]], ef_search=40)


@pytest.mark.parametrize(("zone", "where", "limit"), [
    ("big", None, 30),
    ("big", ChunkFilter(path_prefix="s1/doc1"), 30),  # a filter few chunks pass: short, then widened or exact
    ("small", None, 10),  # a zone with fewer chunks than the limit
    ("nowhere", None, 10),
])
def test_one_statement_finds_what_each_shards_own_search_finds(
    stores: list[ShardStore], zone: str, where: ChunkFilter | None, limit: int
) -> None:
    batch = StoreBatch(stores[:3], ef_search=40)
    for query in ("common words 7", "rare item", "other text 12"):
        embedding = EMBED.embed_query(query)
        found = batch.vector(embedding, zone=zone, limit=limit, where=where)
        assert list(found) == [0, 1, 2]
        for store in stores[:3]:
            alone = store.vector_search(embedding, zone=zone, limit=limit, ef_search=40, where=where)
            assert [(h.chunk_id, h.score) for h in found[store.shard]] == [(h.chunk_id, h.score) for h in alone]


def test_one_fetch_returns_each_shards_chunks_within_the_zone_asked(stores: list[ShardStore]) -> None:
    batch = StoreBatch(stores[:3], ef_search=40)
    asked = {
        (0, "big"): [chunk_id("big", "s0/doc1.txt", 1, 0), chunk_id("big", "s0/doc2.txt", 1, 1)],
        (2, "big"): [chunk_id("big", "s2/doc5.txt", 1, 0), chunk_id("big", "s2/gone.txt", 1, 0)],  # one never existed
        (1, "small"): [chunk_id("small", "s1/rare0.txt", 1, 0)],
        (1, "other"): [chunk_id("small", "s1/rare1.txt", 1, 0)],  # asked in a zone it is not in: never returned
    }
    records = batch.fetch(asked)
    expected = {}
    for (shard, zone), ids in asked.items():
        expected.update(stores[shard].fetch_chunks(ids, zone=zone))
    assert records == expected
    assert set(records) == {chunk_id("big", "s0/doc1.txt", 1, 0), chunk_id("big", "s0/doc2.txt", 1, 1),
                            chunk_id("big", "s2/doc5.txt", 1, 0), chunk_id("small", "s1/rare0.txt", 1, 0)}
    assert records[chunk_id("big", "s0/doc2.txt", 1, 1)].text == "other text 0"
    assert batch.fetch({}) == {}


def test_a_vector_search_statement_is_planned_once_not_at_every_search(stores: list[ShardStore]) -> None:
    """The nearest-chunks statement, once prepared, runs PostgreSQL's generic plan. With its ``LIMIT`` passed as a
    parameter, the server never chose the generic plan for an analysed table of this size or larger (it costs an
    unknown limit as a tenth of the rows), and planned every search again: ~0.1–0.2 ms of its CPU a shard."""
    pool = open_pool(stores[0].pool.conninfo, max_size=1)  # one connection: its prepared statements are the test's
    try:
        store = ShardStore(pool, 9, dimensions=DIM)  # a shard of this test's own, in the first database
        store.ensure_schema()
        store.apply([_write(f"big/doc{i}.txt", [f"words {i} of many {i % 13}"], zone="big") for i in range(2000)])
        with reading_connection(pool, what="the test") as conn:
            # The statistics autovacuum keeps: without them the server took the generic plan either way.
            conn.execute(sql.SQL("ANALYZE {}.chunks").format(sql.Identifier(shard_schema(9))))
        batch = StoreBatch([store], ef_search=40)
        # psycopg prepares a statement at its 5th run, and the server plans its first 5 prepared runs for their
        # values before it weighs the generic plan: 20 runs leave 10 for the generic plan.
        for i in range(20):
            query = EMBED.embed_query(f"words {i}")
            assert len(batch.vector(query, zone="big", limit=30, where=None)[9]) == 30
            assert len(store.vector_search(query, zone="big", limit=30, ef_search=40)) == 30
        with reading_connection(pool, what="the test") as conn:
            plans = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                                 "WHERE statement LIKE '%<=>%'").fetchall()
    finally:
        pool.close()
    assert len(plans) == 2, plans  # the batch's statement and the shard's own
    assert all(generic >= 10 for generic, _ in plans), plans
