"""A corpus grown in steps to each size of the scale benchmark, streamed through the pipeline's own stages.

:mod:`tests.benchmarks.direct_load` holds every document's prepared chunks and vectors until the load is
done, which a million chunks would turn into gigabytes. This loader runs the same stages (its
``_prepare_batch``: decoding, chunking and contextualizing as the ingest stage does, and ``_embedded``: the
stack's embedder over each chunk's ``indexed_text``) on small batches in worker processes, a few batches in
flight, and writes each batch with :meth:`ShardStore.apply` as it arrives, so memory stays flat whatever the
size. Each step then builds what a bulk load builds, timed:

* the HNSW index, dropped for the step (``defer_vector_index``) and built after it, one shard after another;
* ``VACUUM (ANALYZE)`` of the shards' tables: the state autovacuum would reach, so it does not run during
  the timed queries;
* each shard's BM25 generation by the maintenance worker's own merge (``shard_indexer(...).merge()``,
  published to the shard's database), one shard after another as the single maintenance process runs them,
  each in a fresh process whose peak resident set is the merge's memory.

The corpus is :func:`tests.benchmarks.scale.corpus`'s, generated lazily.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg import sql

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.lexical import Tokenizer
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.maintenance import shard_indexer
from shardfuse.pipeline.index.store import DocumentChange, ShardPools
from shardfuse.pipeline.index.store.schema import shard_schema
from tests.benchmarks import scale
from tests.benchmarks.direct_load import _embedded, _prepare_batch
from tests.benchmarks.scale_results import status_fields

BATCH_DOCS = 800  # documents per worker task: ~200 per shard with 4 shards, direct_load's APPLY_BATCH
IN_FLIGHT = 4  # worker tasks submitted ahead of the writes: enough to keep both workers busy, bounded


def iter_corpus(start: int = 0) -> Iterator[scale.Doc]:
    """:func:`tests.benchmarks.scale.corpus`'s documents from the ``start``-th on, without end, one at a time."""
    base = scale._scifact().corpus
    for i in count(start):
        copy, doc = divmod(i, len(base))
        source = base[doc]
        text = f"{source.title}\n\n{source.text}\n\nCopy {copy} of SciFact document {source.doc_id}.\n"
        yield scale.Doc(path=f"c{copy:03d}/{source.doc_id}.txt", text=text)


@dataclass
class Growth:
    """Where the load stands: documents of the corpus used, chunks and documents written."""

    zone: str
    next_doc: int = 0
    chunks: int = 0
    documents: int = 0


def grow(settings: Settings, growth: Growth, target_chunks: int, *, processes: int = 2) -> dict[str, Any]:
    """Write the corpus's next documents until the zone holds ``target_chunks`` chunks (the last document
    may be cut to fit), then build the HNSW indexes, vacuum, and merge every shard's BM25 index; the seconds
    of each phase and the merges' memory."""
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=processes) as workers, \
            ShardPools(settings, min_size=1, max_size=2) as pools:
        stores = pools.stores()
        for store in stores:
            store.ensure_schema()
            store.defer_vector_index()
        written_from = growth.chunks
        _write(workers, stores, settings, growth, target_chunks)
        write_s = time.perf_counter() - started
        hnsw = []
        for store in stores:
            built = time.perf_counter()
            store.build_vector_index()
            hnsw.append(time.perf_counter() - built)
    vacuum_s = _vacuum(settings)
    merges = [merge_in_fresh_process(settings, shard) for shard in range(settings.shards)]
    return {"chunks_written": growth.chunks - written_from, "write_s": round(write_s, 1),
            "write_chunks_per_s": round((growth.chunks - written_from) / max(write_s, 1e-9), 1),
            "hnsw_build_s": round(sum(hnsw), 1), "hnsw_build_s_per_shard": [round(s, 1) for s in hnsw],
            "vacuum_analyze_s": round(vacuum_s, 1),
            "bm25_merge_s": round(sum(m["seconds"] for m in merges), 1),
            "bm25_merge_s_per_shard": [round(m["seconds"], 1) for m in merges],
            "bm25_merge_peak_rss_mb": round(max(m["peak_rss_mb"] for m in merges), 1),
            "bm25_merge_process_base_rss_mb": round(max(m["base_rss_mb"] for m in merges), 1)}


def _write(workers: ProcessPoolExecutor, stores: list[Any], settings: Settings, growth: Growth,
           target_chunks: int) -> None:
    docs = iter_corpus(growth.next_doc)
    pending: list[Future[list[tuple[int, DocumentChange]]]] = []
    while growth.chunks < target_chunks:
        while len(pending) < IN_FLIGHT:
            batch = [next(docs) for _ in range(BATCH_DOCS)]
            pending.append(workers.submit(prepared_changes, batch, growth.zone, settings))
        placed = pending.pop(0).result()
        by_shard: dict[int, list[DocumentChange]] = defaultdict(list)
        for shard, change in placed:
            if growth.chunks >= target_chunks:
                break
            keep = min(len(change.chunks), target_chunks - growth.chunks)
            by_shard[shard].append(change if keep == len(change.chunks) else _cut(change, keep))
            growth.chunks += keep
            growth.documents += 1
        for shard, changes in sorted(by_shard.items()):
            outcomes = stores[shard].apply(changes)
            assert all(o.applied for o in outcomes), f"shard {shard} refused a change"
        growth.next_doc += BATCH_DOCS
    for future in pending:  # batches beyond the size: the next step submits them again
        future.cancel()


def prepared_changes(docs: list[scale.Doc], zone: str, settings: Settings) -> list[tuple[int, DocumentChange]]:
    """In a worker process: ``docs`` as the ingest and embed stages turn them into shard writes, in order."""
    prepared = _prepare_batch(docs, zone, settings)
    changes = _embedded(prepared, settings)
    return [(p.shard, change) for p, change in zip(prepared, changes, strict=True)]


def _cut(change: DocumentChange, keep: int) -> DocumentChange:
    """The document with its first ``keep`` chunks only (the last document of a size)."""
    assert change.embeddings is not None
    return replace(change, chunks=change.chunks[:keep], embeddings=change.embeddings[:keep])


def _vacuum(settings: Settings) -> float:
    started = time.perf_counter()
    for shard in range(settings.shards):
        with psycopg.connect(settings.shard_dsn(shard), autocommit=True) as conn:
            conn.execute(sql.SQL("VACUUM (ANALYZE) {s}.chunks, {s}.documents, {s}.grep_blocks").format(
                s=sql.Identifier(shard_schema(shard))))
    return time.perf_counter() - started


def merge_in_fresh_process(settings: Settings, shard: int) -> dict[str, float]:
    """The shard's BM25 merge, as ``shardfuse.bm25_rebuild`` runs it, in a new (spawned, so it holds nothing
    of this one's memory) process: its seconds, the process's resident set before it, and its peak."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_merge, settings, shard).result()


def _merge(settings: Settings, shard: int) -> dict[str, float]:
    with ShardPools(settings, min_size=1, max_size=2) as pools:
        store = pools.stores()[shard]
        client = redis.Redis.from_url(settings.broker.url)
        try:
            freshness = Bm25Freshness(client)
            freshness.mark_dirty(shard)  # what the embed task's commit records (it takes the schedule flag)
            # What the rebuild task starts with: the flag freed, so the next commit schedules its own update.
            # (Left taken, it would stay so for its 120 s TTL, and the shard's first writes after the load
            # would wait for the maintenance watchdog.)
            freshness.begin_rebuild(shard)
            indexer = shard_indexer(settings, shard, store=store, freshness=freshness,
                                    tokenizer=Tokenizer(stem=settings.bm25.stemming))
            base = _own_status()
            started = time.perf_counter()
            result = indexer.merge()
            seconds = time.perf_counter() - started
        finally:
            client.close()
    assert result["kind"] == "merge", result
    return {"seconds": seconds, "base_rss_mb": base.get("VmRSS", 0.0), "peak_rss_mb": _own_status()["VmHWM"]}


def _own_status() -> dict[str, float]:
    return status_fields(Path("/proc/self/status").read_text())
