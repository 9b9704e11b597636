"""What the scale benchmark measures on a loaded stack: query latency (in-process and through the RPC task,
side by side), write-to-searchable freshness on the query worker, each worker pool's memory, and disk.

* Queries: hybrid, k = 10, ``cache=False`` (no result cache, no query-embedding cache), after warm-up, as
  :mod:`tests.benchmarks.bench_query` runs them; step ``i`` runs query ``i`` in-process (the query worker's
  ``SearchService``, built here by a ``WorkerRuntime``) and then query ``i + n/2`` through ``shardfuse.search``,
  so both ways see the same queries under the same load.
* Freshness: single-document writes published one at a time through the running pipeline (ingest, embed,
  the maintenance pool's BM25 delta); per write, the seconds from the publish call until its chunk is
  committed in its shard (the vector leg) and until the query worker's keyword leg returns it through the
  RPC task (the query node follows the published index on its own): both legs is the later of the two.
* Memory: each worker pool's processes (``/proc/<pid>/status``, the pool's main process and its children).
* Disk: ``pg_total_relation_size`` of every table of the shard schemas (chunks with their HNSW index, grep
  blocks, documents, the published BM25 generations and deltas …) plus the BM25 directory on disk.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg

from shardfuse.pipeline.core.sharding import shard_for
from shardfuse.query.request import parse_request
from shardfuse.workers.client import SearchClient
from shardfuse.workers.names import Queue
from shardfuse.workers.runtime import WorkerRuntime
from shardfuse.workers.stack.celery_processes import worker_component
from tests.benchmarks import scale
from tests.benchmarks.freshness_writes import unique_word
from tests.benchmarks.scale_results import paired_order, pool_memory, status_fields
from tests.integration.conftest import Stack

FRESH_ZONE = "fresh"
GIVE_UP_S = 60.0  # a write not searchable by then fails the benchmark
POLL_S = 0.01


def query_latencies(stack: Stack, zone: str, queries: Sequence[str], *, warm: Sequence[str]) -> dict[str, Any]:
    """p50/p99 (ms) of hybrid k=10 queries in-process and through the RPC task, run side by side."""
    settings = stack.settings
    runtime = WorkerRuntime(settings)
    client = SearchClient(settings)
    try:
        service = runtime.searcher

        def in_process(query: str) -> dict[str, Any]:
            arguments = {"query": query, "zone": zone, "k": 10, "mode": "hybrid", "cache": False}
            return service.search(parse_request(arguments, settings=settings.query))

        def rpc(query: str) -> dict[str, Any]:
            return client.search(query=query, zone=zone, k=10, mode="hybrid", cache=False)

        for query in warm:  # maps every shard, warms PostgreSQL's buffers and both processes' code paths
            in_process(query)
            rpc(query)
        local: list[float] = []
        remote: list[float] = []
        empty = 0
        for mine, theirs in paired_order(len(queries)):
            for way, seconds, query in ((in_process, local, queries[mine]), (rpc, remote, queries[theirs])):
                started = time.perf_counter()
                answer = way(query)
                seconds.append(time.perf_counter() - started)
                empty += not answer["results"]
    finally:
        runtime.close()
    assert empty == 0, f"{empty} answers found nothing"
    inproc, through = scale.summary_ms(local), scale.summary_ms(remote)
    return {"queries": len(queries), "inprocess_p50_ms": inproc["p50_ms"], "inprocess_p99_ms": inproc["p99_ms"],
            "rpc_p50_ms": through["p50_ms"], "rpc_p99_ms": through["p99_ms"]}


def freshness(stack: Stack, *, label: str, first_word: int, writes: int) -> dict[str, Any]:
    """Write-to-searchable p50/p99 (ms) of ``writes`` single-document writes: vector leg, keyword leg, both."""
    settings = stack.settings
    texts = scale.corpus(50)
    vector_s: list[float] = []
    keyword_s: list[float] = []
    with psycopg.connect(settings.postgres.dsn, autocommit=True) as conn:
        for i in range(writes):
            word, path = unique_word(first_word + i), f"fresh/{label}/{i}.txt"
            shard = shard_for(FRESH_ZONE, path, settings.shards)
            started = time.perf_counter()
            with stack.publisher() as publisher:
                publisher.write(zone=FRESH_ZONE, path=path,
                                data=f"{texts[i % len(texts)].text}\nFresh note {word}.\n".encode())
            vector, keyword = _until_searchable(stack, conn, shard=shard, path=path, word=word, started=started)
            vector_s.append(vector)
            keyword_s.append(keyword)
            time.sleep(0.2)  # one write at a time: the pipeline is idle between writes
    both = [max(v, k) for v, k in zip(vector_s, keyword_s, strict=True)]
    return {"writes": writes, "vector_ms": scale.summary_ms(vector_s), "keyword_ms": scale.summary_ms(keyword_s),
            "both_legs_p50_ms": scale.summary_ms(both)["p50_ms"], "both_legs_p99_ms": scale.summary_ms(both)["p99_ms"]}


def _until_searchable(stack: Stack, conn: psycopg.Connection[Any], *, shard: int, path: str, word: str,
                      started: float) -> tuple[float, float]:
    """Seconds from ``started`` until ``path`` is committed in its shard, and until the keyword leg finds it."""
    vector: float | None = None
    keyword: float | None = None
    chunk = f"SELECT 1 FROM shard_{shard}.chunks WHERE zone = %s AND path = %s LIMIT 1"
    while vector is None or keyword is None:
        now = time.perf_counter() - started
        if now > GIVE_UP_S:
            raise AssertionError(f"{path} not searchable after {GIVE_UP_S:g} s (vector {vector}, keyword {keyword})")
        if vector is None and conn.execute(chunk, (FRESH_ZONE, path)).fetchone() is not None:
            vector = time.perf_counter() - started
        if keyword is None:
            answer = stack.search(word, FRESH_ZONE, mode="keyword", k=3, cache=False)
            if any(result["path"] == path for result in answer["results"]):
                keyword = time.perf_counter() - started
        time.sleep(POLL_S)
    return vector, keyword


def pool_memories(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each worker pool's memory (``ingest``, ``embed``, ``maintenance``, ``query``), by the pool's main pid."""
    out = {}
    for queue in Queue:
        pid = pids.get(worker_component(queue))
        if pid is None:
            continue
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        out[queue.value] = pool_memory([status_fields(Path(f"/proc/{p.pid}/status").read_text()) for p in procs])
    return out


def disk_usage(stack: Stack) -> dict[str, Any]:
    """Bytes on disk of the shards (their tables by kind, in PostgreSQL) and of the BM25 directory, the chunks
    they hold, and bytes per chunk."""
    settings = stack.settings
    tables: dict[str, int] = {}
    chunks = 0
    for shard in range(settings.shards):
        with psycopg.connect(settings.shard_dsn(shard)) as conn:
            rows = conn.execute(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                (f"shard_{shard}",)).fetchall()
            counted = conn.execute(f"SELECT count(*) FROM shard_{shard}.chunks").fetchone()
        chunks += int(counted[0]) if counted else 0
        for name, size in rows:
            kind = name if name in ("chunks", "documents", "grep_blocks") else (
                "bm25_published" if name.startswith("lexical_") else "other")
            tables[kind] = tables.get(kind, 0) + int(size)
    bm25_dir = sum(p.stat().st_size for p in Path(settings.bm25_root).rglob("*") if p.is_file())
    total = sum(tables.values()) + bm25_dir
    per_chunk = {kind: round(size / max(chunks, 1)) for kind, size in sorted(tables.items())}
    return {"chunks_in_shards": chunks, "disk_bytes": total, "disk_bytes_per_chunk": round(total / max(chunks, 1)),
            "disk_bytes_per_chunk_by_kind": {**per_chunk, "bm25_directory": round(bm25_dir / max(chunks, 1))}}
