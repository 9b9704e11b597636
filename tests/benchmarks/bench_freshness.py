"""Write-to-searchable latency with BM25 delta segments, and what a delta update costs as the shard grows.

With N chunks in one shard (``SHARDFUSE_BENCH_CHUNKS``, default 100,000; loaded straight into the shard
tables, HNSW built after the load, then the BM25 generation built by the merge and published to the shard's
schema as the maintenance worker publishes it), single-document writes are published one at a time through
the running pipeline; for each, the time from the publish call until its chunk is in the vector leg
(committed in PostgreSQL) and until the keyword leg returns it (a ``LexicalShardReader`` on the maintenance
node's own directory; bench_freshness_nodes.py measures a query node's copy). The same is measured at N/10
chunks, and the delta update itself (``ShardIndexer.update`` of one written document, in process, against
the same tables) at both sizes, next to the full rebuild it replaces.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer, read_manifest
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.index.lexical.updates import ShardIndexer
from shardfuse.pipeline.index.store.change_log import CHANGE_XID
from shardfuse.pipeline.index.store.pools import ShardPools
from shardfuse.pipeline.index.store.shard_store import ShardStore
from tests.benchmarks.freshness_writes import (
    ZONE,
    load_direct,
    published_indexer,
    settle,
    unique_word,
    write_latencies,
)
from tests.benchmarks.scale import bench_stack, corpus, report, summary_ms

pytestmark = pytest.mark.timeout(3600)

CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_CHUNKS", "100000"))
WRITES = int(os.environ.get("SHARDFUSE_BENCH_WRITES", "40"))
DELTA_UPDATES = 20


def _rewritten(store: ShardStore, path: str) -> None:
    """What a rewrite of ``path`` with the same content leaves for the BM25 update: its row changed."""
    with store.pool.connection() as conn:
        conn.execute(f"UPDATE shard_0.documents SET change_xid = {CHANGE_XID} WHERE zone = %s AND path = %s",
                     (ZONE, path))


def _delta_costs(store: ShardStore, live_root: Path, tokenizer: Tokenizer, paths: list[str]) -> list[float]:
    """In process, on a copy of the live index (and Redis records of its own): DELTA_UPDATES delta updates
    of one written document each (the delta grows by one document per update, as between merges)."""
    freshness = Bm25Freshness(fakeredis.FakeRedis())
    with tempfile.TemporaryDirectory(prefix="bench-fresh-") as root:
        shutil.copytree(live_root / "shard_0", Path(root) / "shard_0")
        copied = read_manifest(Path(root), 0)
        assert copied is not None and not copied.delta and copied.tracks_postgres
        job = ShardIndexer(root=Path(root), shard=0, store=store, freshness=freshness, tokenizer=tokenizer)
        costs = []
        for path in paths[:DELTA_UPDATES]:
            _rewritten(store, path)
            freshness.mark_dirty(0, [(ZONE, path)])
            started = time.perf_counter()
            result = job.update()
            costs.append(time.perf_counter() - started)
            assert result["kind"] == "delta", result
    return costs


def test_write_to_searchable_with_delta_segments() -> None:
    small = max(1000, CHUNKS // 10)
    with bench_stack(shards=1) as stack, ShardPools(stack.settings, min_size=1, max_size=4) as pools:
        settings = stack.settings
        store = pools.stores()[0]
        store.ensure_schema()
        rows: list[list[Any]] = []
        figures: dict[str, Any] = {"chunks": CHUNKS, "writes": WRITES}
        loaded = 0
        for size in (small, CHUNKS):
            store.defer_vector_index()  # a bulk load: HNSW built once after it, not row by row
            load_s = load_direct(store, loaded, size, dimensions=settings.embedder.dimensions)
            loaded = size
            print(f"\n{size} chunks loaded in {load_s:.1f} s", flush=True)
            started = time.perf_counter()
            store.build_vector_index()
            hnsw_s = time.perf_counter() - started
            print(f"HNSW built in {hnsw_s:.1f} s", flush=True)
            # The running pipeline's index: a merge (the full rebuild) through its own freshness records,
            # published to the shard's schema as the maintenance worker publishes it.
            tokenizer = Tokenizer(stem=settings.bm25.stemming)
            live = published_indexer(settings, store)
            started = time.perf_counter()
            live.merge()
            full_s = time.perf_counter() - started
            print(f"BM25 full build in {full_s:.1f} s", flush=True)
            deltas = _delta_costs(store, settings.bm25_root, tokenizer, [d.path for d in corpus(size)[-DELTA_UPDATES:]])
            print(f"pipeline settled in {settle(stack):.1f} s", flush=True)
            reader = LexicalShardReader(settings.bm25_root, 0, tokenizer=tokenizer)
            reader.refresh()
            vector_s, keyword = write_latencies(stack, {"same": reader}, label=f"n{size}", words=size, writes=WRITES)
            keyword_s = keyword["same"]
            both = [max(v, k) for v, k in zip(vector_s, keyword_s, strict=True)]
            answer = stack.search(unique_word(size + WRITES - 1), ZONE)
            assert f"fresh/n{size}/{WRITES - 1}.txt" in str(answer), "the last write is not found end to end"
            tag = f"{size // 1000}k"
            figures[f"load_s_{tag}"] = round(load_s, 1)
            figures[f"hnsw_build_s_{tag}"] = round(hnsw_s, 1)
            figures[f"full_rebuild_s_{tag}"] = round(full_s, 2)
            figures[f"delta_update_ms_{tag}"] = summary_ms(deltas)
            figures[f"vector_ms_{tag}"] = summary_ms(vector_s)
            figures[f"keyword_ms_{tag}"] = summary_ms(keyword_s)
            figures[f"both_legs_ms_{tag}"] = summary_ms(both)
            rows.append([size, round(full_s * 1000), summary_ms(deltas)["p50_ms"], summary_ms(deltas)["p99_ms"],
                         summary_ms(vector_s)["p50_ms"], summary_ms(keyword_s)["p50_ms"],
                         summary_ms(both)["p50_ms"], summary_ms(both)["p99_ms"]])
        report("bm25_delta_freshness",
               ["chunks", "full rebuild ms", "delta p50 ms", "delta p99 ms", "vector p50 ms", "keyword p50 ms",
                "both legs p50 ms", "both legs p99 ms"], rows, figures)
