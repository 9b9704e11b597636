"""Our BM25 leg against ``rank_bm25`` (``BM25Okapi``, what a plain implementation would pick), side by side.

Corpus: :func:`tests.benchmarks.scale.corpus` chunked by the pipeline's own chunker (``prepare_chunks`` with the
default settings, via :func:`tests.benchmarks.direct_load.prepare`), the first documents up to 100,000 chunks
(``SHARDFUSE_BENCH_CHUNKS`` for quick runs); each chunk's ``indexed_text`` is what both engines index. No stack:
our index is built by :func:`shardfuse.pipeline.index.lexical.build_shard_index` into a temporary directory as one
shard and
searched by :class:`shardfuse.pipeline.index.lexical.LexicalShardReader` (mmap), as a query worker searches one shard:
the zone's
term statistics, then the search with them (our sparse-column scorer over bm25s's score matrix, zone mask,
top-k). ``rank_bm25`` gets the same tokens (our tokenizer: the comparison is of the engines), the same ``k1``
and ``b``, and ranks with ``get_scores`` then a top-10 cut. Same 1,000 distinct queries
(:func:`tests.benchmarks.scale.queries`), k = 10, timed one at a time, tokenizing included on both sides.

Reported: p50/p99 per query, the speed ratio of the medians and of the totals (goal >= 50x) and top-10 overlap
(chunk ids; and SciFact source documents, since copies of one abstract tie or nearly tie). The scores differ by
design (Lucene IDF in bm25s, ATIRE IDF with an epsilon floor in rank_bm25), so overlap is not 100%. The
last line is JSON.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from rank_bm25 import BM25Okapi

from shardfuse.pipeline.config.settings import load_settings
from shardfuse.pipeline.index.lexical import LexicalShardReader, Tokenizer, build_shard_index
from tests.benchmarks import direct_load, scale

CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_CHUNKS", "100000"))
QUERIES = 1000
K = 10
ZONE = "bench"
GOAL_RATIO = 50.0
# rank_bm25 scans every document per query term (~0.4 s a query at 100,000 chunks): its side is timed on the
# first SHARDFUSE_BENCH_BASELINE_QUERIES queries (default 200, so `make bench` stays under 30 minutes); ratio
# and overlap compare that subset, side by side with ours on the same queries.
BASELINE_QUERIES = int(os.environ.get("SHARDFUSE_BENCH_BASELINE_QUERIES", "200"))
pytestmark = pytest.mark.timeout(3600)


def test_our_bm25_leg_against_rank_bm25() -> None:
    settings = load_settings()
    docs = scale.corpus(int(CHUNKS / 1.1) + 100)
    prepared = direct_load.prepare(docs, zone=ZONE, settings=settings, max_chunks=CHUNKS)
    texts = direct_load.chunk_texts(prepared)
    source = [p.event.path.split("/", 1)[1] for p in prepared for _ in p.chunks]  # SciFact doc of each chunk
    ids = [f"{i:08d}" for i in range(len(texts))]
    queries = scale.queries(QUERIES)
    tokenizer = Tokenizer(stem=settings.bm25.stemming)
    k1, b = settings.bm25.k1, settings.bm25.b

    with tempfile.TemporaryDirectory(prefix="bench-bm25-") as root:
        t = time.perf_counter()
        build_shard_index(Path(root), 0, chunk_ids=ids, zones=[ZONE] * len(ids), texts=texts, built_version=1,
                          k1=k1, b=b, tokenizer=tokenizer)
        ours_build_s = time.perf_counter() - t
        reader = LexicalShardReader(Path(root), 0, tokenizer=tokenizer)
        reader.refresh()

        def ours(query: str) -> list[int]:
            stats = reader.term_stats(query, zone=ZONE)
            return [int(h.chunk_id) for h in reader.search(query, zone=ZONE, k=K, stats=stats)]

        for query in queries[:20]:
            ours(query)  # warm: page in the mapped index
        ours_s, ours_top = scale.timed(ours, queries)

    t = time.perf_counter()
    plain = BM25Okapi([tokenizer(text) for text in texts], k1=k1, b=b)
    plain_build_s = time.perf_counter() - t

    def theirs(query: str) -> list[int]:
        scores = plain.get_scores(tokenizer(query))
        best = np.argpartition(scores, len(scores) - K)[len(scores) - K:]
        return [int(i) for i in sorted(best.tolist(), key=lambda i: (-scores[i], i)) if scores[i] > 0]

    theirs_s, theirs_top = scale.timed(theirs, queries[:BASELINE_QUERIES])
    compared = len(theirs_s)
    ours_all_ms = scale.summary_ms(ours_s)
    ours_s, ours_top = ours_s[:compared], ours_top[:compared]

    judged = [(a, b_) for a, b_ in zip(ours_top, theirs_top, strict=True) if a or b_]
    id_overlap = statistics.mean(len(set(a) & set(b_)) / K for a, b_ in judged)
    doc_overlap = statistics.mean(
        len({source[i] for i in a} & {source[i] for i in b_}) / max(1, len({source[i] for i in b_}))
        for a, b_ in judged)
    top1 = statistics.mean(1.0 if a[:1] == b_[:1] else 0.0 for a, b_ in judged)
    ours_ms, theirs_ms = scale.summary_ms(ours_s), scale.summary_ms(theirs_s)
    ratio_p50 = theirs_ms["p50_ms"] / ours_ms["p50_ms"]
    ratio_total = sum(theirs_s) / sum(ours_s)
    figures = {
        "chunks": len(texts), "queries": len(queries), "baseline_queries": compared, "k": K,
        "ours_all_queries_p50_ms": ours_all_ms["p50_ms"], "ours_all_queries_p99_ms": ours_all_ms["p99_ms"],
        "ours_p50_ms": ours_ms["p50_ms"], "ours_p99_ms": ours_ms["p99_ms"],
        "rank_bm25_p50_ms": theirs_ms["p50_ms"], "rank_bm25_p99_ms": theirs_ms["p99_ms"],
        "speed_ratio_p50": round(ratio_p50, 1), "speed_ratio_total": round(ratio_total, 1),
        "goal_ratio": GOAL_RATIO, "met": min(ratio_p50, ratio_total) >= GOAL_RATIO,
        "top10_id_overlap": round(id_overlap, 3), "top10_source_doc_overlap": round(doc_overlap, 3),
        "top1_agreement": round(top1, 3),
        "ours_build_s": round(ours_build_s, 1), "rank_bm25_build_s": round(plain_build_s, 1),
    }
    rows = [
        ["ours (bm25s + sparse-column scorer)", ours_ms["p50_ms"], ours_ms["p99_ms"], f"{ours_build_s:.1f}"],
        ["rank_bm25 BM25Okapi", theirs_ms["p50_ms"], theirs_ms["p99_ms"], f"{plain_build_s:.1f}"],
        ["speed ratio (p50 / total)", f"{ratio_p50:.1f}x", f"{ratio_total:.1f}x",
         f"goal >= {GOAL_RATIO:g}x: {'met' if figures['met'] else 'MISSED'}"],
        ["top-10 overlap (ids / source docs)", f"{id_overlap:.1%}", f"{doc_overlap:.1%}",
         f"top-1 agreement {top1:.1%}"],
    ]
    scale.report("bm25", ["engine", "p50 ms", "p99 ms", "build s"], rows, figures)
