"""Bulk ingest end to end against the machine's physical limit, side by side in one run (``make bench``).

- **pipeline**: ``SHARDFUSE_BENCH_CHUNKS`` chunks (100,000 by default) of SciFact-made documents published
  as write events (``Publisher.write_many``: CAS writes overlapped, 16 events per message) into a stack of
  its own (``hashing`` embedder, 2 shards) and timed from the first publish until everything is searchable
  in both legs (``scale.wait_searchable``: ingest and embed queues drained, every shard's BM25 generation
  with its delta current, the HNSW index rebuilt if a bulk load deferred it), and until ``shardfuse wait``
  returns (which also waits out BM25 merges scheduled with a countdown: "settled");
- **the floor** (``ingest_floor.py``, the issue-23 goal's reference): every row the pipeline wrote for the
  zone — chunks, document rows, grep blocks, every zoned shard table — written again by bare binary
  ``COPY`` into tables of the same DDL without any index, then every index the pipeline's tables carry
  (HNSW, the grep blocks' GIN, the btree keys) built over them, shards in parallel as the cores allow;
  ``ratio_to_floor`` is the pipeline's chunks/s over the floor's, and the floor's parts are reported;
- **bare COPY** (the older references): the chunk rows alone, written into the same shard tables of a new
  database by one binary ``COPY`` per shard, both shards at once, with the HNSW index present
  (``ratio_to_bare_copy``, the issue-11 goal) — and the same COPY into tables without the index followed
  by its build;
- **small documents**: a tenth as many chunks again, as one SciFact abstract per document (~1.2 chunks a
  document), for the per-document cost (docs/s).

Documents: SciFact abstracts are ~250 tokens, far below the 512-token chunk budget, so one abstract per
document measures per-document overhead (CAS write, event, lease, version check, document row) more than
chunk throughput. The main run therefore joins ``SHARDFUSE_BENCH_ABSTRACTS`` (4 by default) consecutive
abstracts into one document (~1.2 KB each, ~5 KB a document, like a source file) and reports docs/s beside
chunks/s. The last line is JSON; ``ratio_to_floor`` aims at 0.5, ``ratio_to_bare_copy`` at 0.75.
"""

from __future__ import annotations

import os
import time

import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from tests.benchmarks.ingest_floor import ingest_floor
from tests.benchmarks.scale import (
    Doc,
    bare_copy,
    bench_stack,
    chunk_count,
    corpus,
    publish_many,
    report,
    wait_searchable,
)
from tests.integration.conftest import Stack

CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_CHUNKS", "100000"))
ABSTRACTS = int(os.environ.get("SHARDFUSE_BENCH_ABSTRACTS", "4"))
SHARDS = 2
GOAL = 0.75
FLOOR_GOAL = 0.5


def _grouped(n_docs: int, per_doc: int) -> list[Doc]:
    """``n_docs`` documents of ``per_doc`` distinct corpus abstracts each."""
    base = corpus(n_docs * per_doc)
    return [
        Doc(path=f"g{per_doc}/{i:06d}.txt", text="\n\n".join(d.text for d in base[i * per_doc:(i + 1) * per_doc]))
        for i in range(n_docs)
    ]


def docs_for(chunks: int, per_doc: int, settings: Settings) -> list[Doc]:
    """Enough documents for about ``chunks`` chunks, calibrated on a sample chunked as the workers do."""
    sample = _grouped(200, per_doc)
    counter = TokenCounter(settings.chunking.encoding)
    per = sum(len(prepare_chunks(d.text, path=d.path, doc_hash=f"sample{n}", settings=settings,
                                 counter=counter).chunks) for n, d in enumerate(sample)) / len(sample)
    return _grouped(max(1, round(chunks / per)), per_doc)


def _pipeline(stack: Stack, zone: str, docs: list[Doc]) -> tuple[float, float, float, int]:
    """(seconds to searchable, seconds to settled, seconds publishing, chunks)."""
    started = time.perf_counter()
    published = publish_many(stack, zone, docs)
    wait_searchable(stack)
    searchable = time.perf_counter() - started
    stack.wait(timeout=7200)
    settled, chunks = time.perf_counter() - started, chunk_count(stack, zone)
    print(f"\n{zone}: {len(docs)} docs, {chunks} chunks searchable in {searchable:.1f} s, settled in {settled:.1f} s "
          f"(publishing {published:.1f} s): {chunks / searchable:.1f} chunks/s, {len(docs) / searchable:.1f} docs/s",
          flush=True)
    return searchable, settled, published, chunks


@pytest.mark.timeout(4 * 3600)
def test_bulk_ingest_against_bare_copy() -> None:
    with bench_stack(shards=SHARDS) as stack:
        docs = docs_for(CHUNKS, ABSTRACTS, stack.settings)
        seconds, settled_s, publish_s, chunks = _pipeline(stack, "bulk", docs)
        small_docs = corpus(max(100, round(CHUNKS / 10 / 1.2)))
        small_s, _, small_publish_s, small_chunks = _pipeline(stack, "small", small_docs)
        copy_rows, copy_s = bare_copy(stack, source_zone="bulk", index_present=True)
        print(f"bare COPY with HNSW: {copy_rows} rows in {copy_s:.1f} s", flush=True)
        deferred_rows, deferred_s = bare_copy(stack, source_zone="bulk", index_present=False)
        print(f"bare COPY, then HNSW: {deferred_rows} rows in {deferred_s:.1f} s", flush=True)
        floor = ingest_floor(stack, source_zone="bulk")
        print(f"floor: {floor.rows} rows in {floor.seconds:.1f} s; parts (s, summed over shards): {floor.parts()}",
              flush=True)

    assert chunks >= 0.8 * CHUNKS and copy_rows == chunks and deferred_rows == chunks and floor.chunks == chunks
    assert floor.rows.get("documents") == len(docs) and floor.rows.get("grep_blocks", 0) > 0, floor.rows
    pipeline_rate, copy_rate, floor_rate = chunks / seconds, copy_rows / copy_s, floor.chunks / floor.seconds
    rows = [
        ("pipeline", f"{len(docs)} docs of {ABSTRACTS} abstracts", chunks, seconds, pipeline_rate, len(docs) / seconds),
        ("  of which publishing", "CAS + events", chunks, publish_s, chunks / publish_s, len(docs) / publish_s),
        ("  until shardfuse wait", "+ scheduled BM25 merges", chunks, settled_s, chunks / settled_s,
         len(docs) / settled_s),
        ("pipeline, small docs", f"{len(small_docs)} docs of 1 abstract", small_chunks, small_s,
         small_chunks / small_s, len(small_docs) / small_s),
        ("bare COPY, HNSW present", f"{SHARDS} COPYs in parallel", copy_rows, copy_s, copy_rate, float("nan")),
        ("bare COPY, then HNSW build", f"{SHARDS} COPYs + builds", deferred_rows, deferred_s,
         deferred_rows / deferred_s, float("nan")),
        ("floor: COPY all tables, then all indexes", f"{SHARDS} shards", floor.chunks, floor.seconds, floor_rate,
         len(docs) / floor.seconds),
    ]
    report(
        "ingest",
        ["run", "what", "chunks", "seconds", "chunks/s", "docs/s"],
        rows,
        {
            "chunks": chunks,
            "documents": len(docs),
            "abstracts_per_document": ABSTRACTS,
            "shards": SHARDS,
            "pipeline_seconds": round(seconds, 2),
            "publish_seconds": round(publish_s, 2),
            "settled_seconds": round(settled_s, 2),
            "settled_chunks_per_s": round(chunks / settled_s, 1),
            "pipeline_chunks_per_s": round(pipeline_rate, 1),
            "pipeline_docs_per_s": round(len(docs) / seconds, 1),
            "small_docs_chunks": small_chunks,
            "small_docs_per_s": round(len(small_docs) / small_s, 1),
            "small_docs_chunks_per_s": round(small_chunks / small_s, 1),
            "small_docs_publish_seconds": round(small_publish_s, 2),
            "bare_copy_chunks_per_s": round(copy_rate, 1),
            "bare_copy_then_index_chunks_per_s": round(deferred_rows / deferred_s, 1),
            "ratio_to_bare_copy": round(pipeline_rate / copy_rate, 3),
            "goal_ratio": GOAL,
            "floor_chunks_per_s": round(floor_rate, 1),
            "floor_seconds": round(floor.seconds, 2),
            "floor_rows": floor.rows,
            "floor_copy_seconds": [round(s, 2) for s in floor.copy_s],
            "floor_parts_seconds": floor.parts(),
            "ratio_to_floor": round(pipeline_rate / floor_rate, 3),
            "goal_ratio_to_floor": FLOOR_GOAL,
        },
    )
