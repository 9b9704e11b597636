"""The vector leg's recall with the default local model's vectors, at several ``ef_search`` (``make bench``).

``bench_query`` measures recall with the stack's hashing vectors (sparse, ~19 near-copies of each abstract):
a hard case for HNSW that says little about the dense vectors a deployment gets. This benchmark embeds
``SHARDFUSE_BENCH_RECALL_CHUNKS`` (100,000) distinct texts with the default local model (all-MiniLM-L6-v2,
384 dimensions, through the project's ``LocalEmbedder``): SciFact's sentences, pairs of adjacent sentences,
CoSQA's code snippets, SciFact's titles, then runs of three sentences, in that order until there are enough.
The sentences and pairs alone are 84,699 texts: below that (``SHARDFUSE_BENCH_RECALL_CHUNKS=80000``) the corpus
holds no code, CoSQA's questions have no close neighbour in it, and their recall is the hard case (session 20:
0.826 at ``ef_search`` 64 and 0.930 at 160 there, against 0.999 and 1.0 with the snippets in).
The vectors are embedded once and cached under ``.cache/bench/vector_recall/``, keyed by the model and a hash
of the texts (embedding 100,000 texts takes minutes on this machine).

Each text is one single-chunk document of zone ``bench``, placed by ``shard_for`` into one of 4 shards of a
throwaway pgvector 0.8 server (the embedded stack's binaries), written by ``ShardStore.apply`` (the shard
tables' own DDL: ``halfvec`` embeddings, as a new shard on pgvector 0.8 has) with the HNSW index deferred and
built after the load (m 16, ef_construction 64: the defaults). The queries are SciFact's and CoSQA's
(``SHARDFUSE_BENCH_RECALL_QUERIES``, 400, half of each), embedded as queries.

Every search is the query path's own call, ``ShardStore.vector_search``, with the limit a hybrid k = 10 query
asks each shard for (``LIMIT``: k × over-fetch 3, at least ``min_leg_depth`` 30). Per ``ef_search`` in
``EF_VALUES`` (blocks of queries interleaved, so each setting sees the same machine):

- shard recall@10: the share of each shard's exact 10 nearest (float32 cosine over the model's own vectors,
  so it also counts what half precision costs) among the top 10 of its HNSW search;
- leg recall@10: the same for the vector leg as a query sees it, the 4 shards' hits merged by score against the
  exact 10 nearest of the whole corpus; also for SciFact's queries and CoSQA's apart (natural-language questions
  about code, whose neighbours are the few code snippets: the hard case for the graph);
- p50 / p99 of one shard's search (ms).

The chosen setting is the lowest ``ef_search`` whose shard and leg recall are both at least ``TARGET``. Nothing
is asserted but that the searches use the HNSW index (at 10,000 chunks a shard or more: the planner sorts a
smaller shard exactly); the last line is JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from pgvector.psycopg import register_vector

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.documents import Chunk, chunk_id
from shardfuse.pipeline.core.events import Op, WriteEvent
from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.pipeline.index.store import DocStatus, DocumentChange, ShardStore
from shardfuse.pipeline.index.store.connections import open_pool
from shardfuse.pipeline.index.store.pools import build_settings
from shardfuse.query.evaluation import load_beir
from tests.benchmarks import scale
from tests.support.pgvector_server import pgvector_08_server

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "bench" / "vector_recall"
MODEL = "all-MiniLM-L6-v2"
CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_RECALL_CHUNKS", "100000"))
QUERIES = int(os.environ.get("SHARDFUSE_BENCH_RECALL_QUERIES", "400"))
SHARDS = 4
ZONE = "bench"
LIMIT = 30
EF_VALUES = (40, 64, 100, 128, 160, 200)
TARGET = 0.95
BLOCK = 25  # queries per ef_search block; the blocks of each setting alternate
EMBED_SLICE = 5000  # texts embedded (and cached) per file, so an interrupted first run keeps what it did
APPLY_BATCH = 1000
pytestmark = pytest.mark.timeout(7200)  # the first run embeds 100,000 texts


def _texts(n: int) -> list[str]:
    """``n`` distinct texts: SciFact sentences, sentence pairs, CoSQA snippets, SciFact titles, sentence triples."""
    for name in ("scifact", "cosqa"):
        if not (scale.DATA / name).is_dir():
            pytest.skip(f"{name} is not under {scale.DATA}")
    abstracts = []
    titles = []
    for doc in load_beir(scale.DATA / "scifact", split="test").corpus:
        abstracts.append([s.strip() for s in re.split(r"(?<=[.!?])\s+", doc.text) if len(s.split()) >= 6])
        titles.append(doc.title.strip())
    snippets = [json.loads(line)["text"] for line in (scale.DATA / "cosqa" / "corpus.jsonl").read_text().splitlines()]
    sources: list[list[str]] = [
        [s for sentences in abstracts for s in sentences],
        [" ".join(sentences[i:i + 2]) for sentences in abstracts for i in range(len(sentences) - 1)],
        [s.strip() for s in snippets],
        titles,
        [" ".join(sentences[i:i + 3]) for sentences in abstracts for i in range(len(sentences) - 2)],
    ]
    seen: dict[str, None] = {}
    for source in sources:
        for text in source:
            if text:
                seen.setdefault(text, None)
                if len(seen) == n:
                    return list(seen)
    pytest.skip(f"only {len(seen)} distinct texts")
    raise AssertionError  # unreachable


def _queries(n: int) -> tuple[list[str], list[str]]:
    """``n`` distinct queries, half SciFact's, half CoSQA's; and which of the two each is from."""
    out: dict[str, str] = {}
    for name, count in (("scifact", n // 2), ("cosqa", n - n // 2)):
        lines = (scale.DATA / name / "queries.jsonl").read_text(encoding="utf-8").splitlines()
        texts = [t for t in (str(json.loads(line).get("text") or "").strip() for line in lines) if t]
        for text in texts[:count]:
            out.setdefault(text, name)
    return list(out), list(out.values())


class _Model:
    """The local model, loaded only when a vector is not cached."""

    def __init__(self) -> None:
        self._embedder: Any = None

    def embed(self, texts: list[str], *, query: bool) -> np.ndarray:
        if self._embedder is None:
            try:
                from shardfuse.pipeline.embed.providers.local import LocalEmbedder

                self._embedder = LocalEmbedder(MODEL, runtime="onnx", cache_dir=REPO / ".cache" / "models")
            except Exception as exc:  # the optional `local` extra, or its model, is missing
                pytest.skip(f"the local embedder is not available: {exc}")
        if query:
            return np.stack([np.asarray(self._embedder.embed_query(t), dtype=np.float32) for t in texts])
        return np.asarray(self._embedder.embed_documents(texts), dtype=np.float32)


def _embedded(model: _Model, texts: list[str], *, query: bool) -> np.ndarray:
    """The model's vectors of ``texts``, from ``CACHE`` where an earlier run embedded them (per slice)."""
    parts = []
    for start in range(0, len(texts), EMBED_SLICE):
        part = texts[start:start + EMBED_SLICE]
        key = hashlib.sha256("\x00".join(part).encode()).hexdigest()[:16]
        path = CACHE / f"{MODEL}-{'q' if query else 'd'}-{len(part)}-{key}.npy"
        if not path.is_file():
            vectors = model.embed(part, query=query)
            CACHE.mkdir(parents=True, exist_ok=True)
            np.save(path.with_suffix(".tmp.npy"), vectors)
            path.with_suffix(".tmp.npy").replace(path)
        parts.append(np.load(path))
    return np.concatenate(parts)


def _path(i: int) -> str:
    return f"t{i:06d}.txt"


def _changes(positions: list[int], texts: list[str], vectors: np.ndarray) -> list[DocumentChange]:
    changes = []
    for i in positions:
        event = WriteEvent(op=Op.WRITE, zone=ZONE, path=_path(i), content_hash="sha256:" + "5" * 64, seq=1)
        chunk = Chunk(0, texts[i], 0, len(texts[i]), 1, 1, 1)
        changes.append(DocumentChange(event=event, status=DocStatus.INDEXED, chunks=(chunk,),
                                      embeddings=vectors[i:i + 1], line_count=1))
    return changes


def _load(uri: str, texts: list[str], vectors: np.ndarray, shard_of: np.ndarray) -> tuple[list[ShardStore], Any]:
    pool = open_pool(uri, max_size=SHARDS)
    index = build_settings(Settings().vector_index)
    stores = [ShardStore(pool, shard, dimensions=vectors.shape[1], index=index) for shard in range(SHARDS)]
    for store in stores:
        store.ensure_schema()
        assert store.defer_vector_index()
        positions = np.flatnonzero(shard_of == store.shard).tolist()
        for start in range(0, len(positions), APPLY_BATCH):
            outcomes = store.apply(_changes(positions[start:start + APPLY_BATCH], texts, vectors))
            assert all(o.applied for o in outcomes)
        assert store.build_vector_index() is not None  # also VACUUM (ANALYZE)s the shard
    return stores, pool


def _exact(vectors: np.ndarray, queries: np.ndarray, ids: np.ndarray) -> list[list[str]]:
    """Each query's exact 10 nearest of ``vectors`` (float32 cosine: the model's vectors are unit length)."""
    scores = queries @ vectors.T
    best = np.argpartition(-scores, 10, axis=1)[:, :10]
    return [list(ids[row[np.argsort(-scores[q, row], kind="stable")]]) for q, row in enumerate(best)]


def _blocks(n: int) -> Iterator[tuple[int, range]]:
    """(ef_search, queries) blocks: every setting runs each block of queries, in an order that alternates."""
    for b, start in enumerate(range(0, n, BLOCK)):
        order = EF_VALUES if b % 2 == 0 else EF_VALUES[::-1]
        for ef in order:
            yield ef, range(start, min(n, start + BLOCK))


def _measure(stores: list[ShardStore], queries: np.ndarray, shard_truth: list[list[list[str]]],
             leg_truth: list[list[str]], sources: list[str]) -> dict[int, dict[str, float]]:
    for store in stores:  # warm: pages read, statements prepared, at every setting
        for ef in EF_VALUES:
            for query in queries[:10]:
                store.vector_search(query, zone=ZONE, limit=LIMIT, ef_search=ef)
    found: dict[int, dict[str, list[float]]] = {ef: {"shard": [], "leg": [], "ms": []} for ef in EF_VALUES}
    for ef, block in _blocks(len(queries)):
        for q in block:
            merged = []
            for store in stores:
                started = time.perf_counter()
                hits = store.vector_search(queries[q], zone=ZONE, limit=LIMIT, ef_search=ef)
                found[ef]["ms"].append((time.perf_counter() - started) * 1000)
                expected = set(shard_truth[store.shard][q])
                found[ef]["shard"].append(len(expected & {h.chunk_id for h in hits[:10]}) / max(1, len(expected)))
                merged.extend(hits)
            merged.sort(key=lambda h: -h.score)
            found[ef]["leg"].append(len(set(leg_truth[q]) & {h.chunk_id for h in merged[:10]}) / 10)
    # Each setting's recalls are in query order (every setting runs every block, the blocks in order).
    by_source = {ef: {source: round(float(np.mean([r for r, s in zip(f["leg"], sources, strict=True) if s == source])),
                                    4) for source in sorted(set(sources))} for ef, f in found.items()}
    return {ef: {"shard_recall_at_10": round(float(np.mean(f["shard"])), 4),
                 "leg_recall_at_10": round(float(np.mean(f["leg"])), 4),
                 **{f"leg_recall_at_10_{source}": value for source, value in by_source[ef].items()},
                 "shard_search_p50_ms": round(statistics.median(f["ms"]), 3),
                 "shard_search_p99_ms": round(scale.percentile(f["ms"], 99), 3)} for ef, f in found.items()}


def _uses_hnsw(uri: str, query: np.ndarray) -> bool:
    with psycopg.connect(uri) as conn:
        register_vector(conn)
        plan = conn.execute("EXPLAIN SELECT chunk_id FROM shard_0.chunks WHERE zone = %s "
                            "ORDER BY embedding <=> %s::halfvec LIMIT %s", (ZONE, query, LIMIT)).fetchall()
    return "hnsw" in " ".join(r[0] for r in plan)


def test_vector_recall_with_the_local_model() -> None:
    texts = _texts(CHUNKS)
    query_texts, sources = _queries(QUERIES)
    model = _Model()
    started = time.perf_counter()
    vectors = _embedded(model, texts, query=False)
    queries = _embedded(model, query_texts, query=True)
    embed_s = time.perf_counter() - started
    ids = np.array([chunk_id(ZONE, _path(i), 1, 0) for i in range(len(texts))])
    shard_of = np.array([shard_for(ZONE, _path(i), SHARDS) for i in range(len(texts))])
    leg_truth = _exact(vectors, queries, ids)
    shard_truth = [_exact(vectors[shard_of == s], queries, ids[shard_of == s]) for s in range(SHARDS)]

    with pgvector_08_server("bench-recall-") as server:
        name = f"bench_recall_{uuid.uuid4().hex[:6]}"
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        uri = server.get_uri(database=name)
        started = time.perf_counter()
        stores, pool = _load(uri, texts, vectors, shard_of)
        load_s = time.perf_counter() - started
        try:
            uses_hnsw = _uses_hnsw(uri, queries[0])
            # A small shard is sorted exactly by the planner (then recall is 1.0 and says nothing of HNSW).
            assert uses_hnsw or len(texts) < 10_000 * SHARDS, "the shard search does not use the HNSW index"
            measured = _measure(stores, queries, shard_truth, leg_truth, sources)
        finally:
            pool.close()

    meeting = [ef for ef in EF_VALUES if min(measured[ef]["shard_recall_at_10"], measured[ef]["leg_recall_at_10"])
               >= TARGET]
    chosen = meeting[0] if meeting else None
    figures: dict[str, Any] = {
        "model": MODEL, "chunks": len(texts), "shards": SHARDS, "queries": len(queries), "limit": LIMIT,
        "storage": "halfvec", "plan_uses_hnsw": uses_hnsw, "target": TARGET, "lowest_ef_search_meeting_target": chosen,
        "configured_ef_search": Settings().query.hnsw_ef_search,
        "embed_s": round(embed_s, 1), "load_and_build_s": round(load_s, 1),
        "by_ef_search": {str(ef): values for ef, values in measured.items()},
    }
    rows = [[ef, f"{v['shard_recall_at_10']:.4f}", f"{v['leg_recall_at_10']:.4f}",
             f"{v['leg_recall_at_10_scifact']:.4f} / {v['leg_recall_at_10_cosqa']:.4f}",
             f"{v['shard_search_p50_ms']:.2f} / {v['shard_search_p99_ms']:.2f}",
             "yes" if ef == chosen else ""] for ef, v in measured.items()]
    scale.report("vector_recall", ["ef_search", "shard recall@10", "leg recall@10",
                                   "leg recall@10 SciFact / CoSQA queries", "shard search p50 / p99 ms",
                                   f"lowest >= {TARGET}"], rows, figures)
