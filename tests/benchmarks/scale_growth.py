"""How the index grows: 10,000, 100,000 and 1,000,000 chunks in 4 shards (``make bench-scale``; not part of
``make bench``, which collects ``bench_*.py`` only).

One stack (hashing embedder, 4 shards, query worker with 2 threads) is grown to each size in turn
(``SHARDFUSE_SCALE_SIZES``, default ``10000,100000,1000000``) by :mod:`tests.benchmarks.scale_loader`: the
corpus streamed through the pipeline's own stages (ingest's chunking and contextualizing, the stack's
embedder, ``ShardStore.apply`` with the HNSW index deferred), then the HNSW indexes built and each shard's
BM25 generation merged by the maintenance worker's own code. The maintenance pool is stopped for that bulk
load and started again after it, as an operator loading a corpus would: running, its watchdog would find the
shards behind after every batch and merge them over and over while the load goes on. At each size,
:mod:`tests.benchmarks.scale_measures` measures query latency in-process and through the RPC task, freshness
through the running pipeline, each pool's memory and the disk per chunk.

Output: one JSON line per size as it is measured, a table, and last one JSON line of every figure. The
figures are merged by size into ``docs/figures/scale.json`` (``SHARDFUSE_SCALE_RESULTS`` to write elsewhere),
which ``tests/benchmarks/scale_plot.py`` draws. Goals at 1,000,000 chunks (issue 23): hybrid in-process p50 <=
25 ms, p99 <= 60 ms; freshness (both legs) p50 <= 1 s. Printed beside the figures, not asserted.

Run: ``make bench-scale`` or ``SHARDFUSE_SCALE_SIZES=10000,100000 .venv/bin/python -m pytest
tests/benchmarks/scale_growth.py -s -p no:cacheprovider``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from shardfuse.workers.names import Queue
from shardfuse.workers.stack import up
from shardfuse.workers.stack.celery_processes import worker_component
from shardfuse.workers.stack.processes import stop_process_groups
from tests.benchmarks import scale, scale_loader, scale_measures
from tests.benchmarks.freshness_writes import settle
from tests.benchmarks.scale_results import results_path, sizes_from_environment, write_results
from tests.integration.conftest import Stack

SHARDS = 4
QUERIES = 500
WARM_QUERIES = 100
QUERY_THREADS = 2
WRITES = int(os.environ.get("SHARDFUSE_SCALE_WRITES", "40"))
ZONE = "bench"
GOAL_SIZE = 1_000_000
GOALS = {"inprocess_p50_ms": 25.0, "inprocess_p99_ms": 60.0, "freshness_p50_ms": 1000.0}
# A million chunks take hours on two shared cores; pytest-timeout's 600 s default would cut every size short.
pytestmark = pytest.mark.timeout(12 * 3600)


def test_scale_growth() -> None:
    sizes = sizes_from_environment()
    texts = scale.queries(QUERIES + WARM_QUERIES)
    timed, warm = texts[:QUERIES], texts[QUERIES:]
    run = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out = results_path()
    entries: list[dict[str, Any]] = []
    began = time.perf_counter()
    with scale.bench_stack(shards=SHARDS, SHARDFUSE_WORKERS__QUERY_CONCURRENCY=str(QUERY_THREADS)) as stack:
        pids = {name: component.pid for name, component in stack.state.components.items()}
        growth = scale_loader.Growth(zone=ZONE)
        for size in sizes:
            entry = _measure_size(stack, pids, growth, size, timed=timed, warm=warm)
            entries.append({"run": run, **entry})
            print(json.dumps({"bench": "scale_size", **entries[-1]}, sort_keys=True), flush=True)
            write_results(out, entries[-1:])  # after each size: a run stopped later keeps what it measured
    figures = {"sizes": entries, "shards": SHARDS, "results_file": str(out), "goals": GOALS,
               "goal_size": GOAL_SIZE, "total_s": round(time.perf_counter() - began, 1),
               "met": _met(entries)}
    scale.report("scale", ["chunks", "in-process p50/p99 ms", "RPC p50/p99 ms", "fresh p50/p99 ms", "HNSW s",
                           "BM25 merge s", "disk B/chunk", "query pool MB", "step s"],
                 [_row(e) for e in entries], figures)


def _measure_size(stack: Stack, pids: dict[str, int], growth: scale_loader.Growth, size: int, *,
                  timed: list[str], warm: list[str]) -> dict[str, Any]:
    started = time.perf_counter()
    with _maintenance_pool_stopped(stack, pids):
        load = scale_loader.grow(stack.settings, growth, size)
    loaded_s = time.perf_counter() - started
    print(f"\n{growth.chunks:,} chunks of {growth.documents:,} documents: written in {load['write_s']} s, HNSW "
          f"{load['hnsw_build_s']} s, BM25 merges {load['bm25_merge_s']} s", flush=True)
    settle_s = settle(stack, timeout=1800)
    queries = scale_measures.query_latencies(stack, ZONE, timed, warm=warm)
    fresh = scale_measures.freshness(stack, label=f"n{size}", first_word=size, writes=WRITES)
    memory = scale_measures.pool_memories(pids)
    disk = scale_measures.disk_usage(stack)
    return {"chunks_target": size, "chunks": growth.chunks, "documents": growth.documents, "shards": SHARDS,
            "load": load, "settle_s": round(settle_s, 1), "query": queries, "freshness": fresh,
            "memory_mb": memory, "disk": disk, "load_and_index_s": round(loaded_s, 1),
            "step_s": round(time.perf_counter() - started, 1)}


@contextlib.contextmanager
def _maintenance_pool_stopped(stack: Stack, pids: dict[str, int]) -> Iterator[None]:
    """The maintenance pool stopped (warm shutdown) for a bulk load, then started again; ``pids`` follows it."""
    name = worker_component(Queue.MAINTENANCE)
    stop_process_groups([pids[name]], timeout=60)
    try:
        yield
    finally:
        state = up(stack.settings, progress=lambda line: None, only={name}, timeout=180)
        pids[name] = state.components[name].pid


def _met(entries: list[dict[str, Any]]) -> dict[str, bool]:
    at_goal = [e for e in entries if e["chunks_target"] >= GOAL_SIZE]
    if not at_goal:
        return {}
    e = at_goal[-1]
    return {"inprocess_p50_ms": e["query"]["inprocess_p50_ms"] <= GOALS["inprocess_p50_ms"],
            "inprocess_p99_ms": e["query"]["inprocess_p99_ms"] <= GOALS["inprocess_p99_ms"],
            "freshness_p50_ms": e["freshness"]["both_legs_p50_ms"] <= GOALS["freshness_p50_ms"]}


def _row(e: dict[str, Any]) -> list[Any]:
    q, f = e["query"], e["freshness"]
    return [e["chunks"], f"{q['inprocess_p50_ms']:.2f} / {q['inprocess_p99_ms']:.2f}",
            f"{q['rpc_p50_ms']:.2f} / {q['rpc_p99_ms']:.2f}",
            f"{f['both_legs_p50_ms']:.0f} / {f['both_legs_p99_ms']:.0f}", e["load"]["hnsw_build_s"],
            e["load"]["bm25_merge_s"], e["disk"]["disk_bytes_per_chunk"], e["memory_mb"]["query"]["rss_mb"],
            e["step_s"]]
