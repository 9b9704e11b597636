"""The default local model through the pipeline against the bare model, side by side in one run (``make bench``).

- **bare model**: the chunks the pipeline makes of ``SHARDFUSE_BENCH_LOCAL_CHUNKS`` (2,500 by default) chunks'
  worth of SciFact abstracts (the pipeline's own chunker, with the local model's settings), embedded in this
  process by the embedder the workers build (``build_embedder``: same model, runtime, precision and threads),
  a flush's worth of texts per call (``4 × embedder.batch_size``, what the embed pool's batcher gathers at
  most); timed once before and once after the pipeline run, and the two averaged, so a load that comes and
  goes on the machine weighs on both sides alike;
- **pipeline**: the same documents published as write events into a stack of its own (local embedder, 2
  shards) and timed from the first publish until everything is searchable in both legs
  (``scale.wait_searchable``), after a warm-up document has made the workers load the model.

``ratio_to_bare_model`` (pipeline chunks/s over the bare model's) aims at 0.8: what the pipeline adds around
the model (chunking, queues, leases, writes, BM25 updates, the query pool's idle model) may cost a fifth.
The table also shows the CPU seconds each pool and PostgreSQL spent during the pipeline run: where it goes;
``cpu_ratio_to_bare_model`` (the bare model's CPU seconds per chunk over the whole stack's) is the same ratio
in CPU time, which the machine's other load does not move.
Set ``SHARDFUSE_BENCH_LOCAL_PRECISION=int8`` to measure the quantised model (both sides).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import psutil
import pytest

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.embed.providers import build_embedder, request_batch_size
from shardfuse.pipeline.embed.stage import unique_texts
from shardfuse.pipeline.ingest.preparation import prepare_chunks
from tests.benchmarks.scale import Doc, bench_stack, chunk_count, corpus, publish_many, report, wait_searchable
from tests.integration.conftest import Stack

CHUNKS = int(os.environ.get("SHARDFUSE_BENCH_LOCAL_CHUNKS", "2500"))
PRECISION = os.environ.get("SHARDFUSE_BENCH_LOCAL_PRECISION", "fp32")
SHARDS = 2
GOAL = 0.8
# The batcher flushes at most this many requests' worth of chunks (workers/runtime.py).
FLUSH_REQUESTS = 4


def _texts(docs: Sequence[Doc], settings: Settings) -> list[str]:
    """The distinct texts the embed stage sends for ``docs``: chunked as the ingest workers chunk them."""
    counter = TokenCounter(settings.chunking.encoding)
    pairs = []
    for n, doc in enumerate(docs):
        prepared = prepare_chunks(doc.text, path=doc.path, doc_hash=f"bench{n}", settings=settings, counter=counter)
        pairs.extend((c.embedding_key, c.indexed_text) for c in prepared.chunks)
    return list(unique_texts(pairs).values())


def _docs_for(chunks: int, settings: Settings) -> list[Doc]:
    """Enough SciFact documents for about ``chunks`` chunks (calibrated on the first 100)."""
    sample = corpus(100)
    per = len(_texts(sample, settings)) / len(sample)
    return corpus(max(1, round(chunks / per)))


def _bare(settings: Settings, texts: list[str]) -> tuple[float, float]:
    """Seconds and CPU seconds the workers' embedder takes for ``texts``, a flush's worth per call (after one
    warm-up call)."""
    embedder = build_embedder(settings.embedder, models_dir=settings.models_dir)
    flush = request_batch_size(settings.embedder, embedder) * FLUSH_REQUESTS
    embedder.embed_documents(texts[:8])
    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, len(texts), flush):
        embedder.embed_documents(texts[start:start + flush])
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"\nbare model ({embedder.name}): {len(texts)} texts in {seconds:.1f} s ({cpu:.1f} CPU s)", flush=True)
    return seconds, cpu


def _cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU seconds (user + system) each component of the stack has spent so far, its child processes included."""
    spent: dict[str, float] = {}
    for name, component in stack.state.components.items():
        total = 0.0
        try:
            root = psutil.Process(component.pid)
            for process in (root, *root.children(recursive=True)):
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
        spent[name] = total
    return spent


@pytest.mark.timeout(4 * 3600)
def test_pipeline_against_bare_model() -> None:
    overrides = {
        "SHARDFUSE_EMBEDDER__PROVIDER": "local",
        "SHARDFUSE_EMBEDDER__LOCAL_PRECISION": PRECISION,
    }
    with bench_stack(shards=SHARDS, **overrides) as stack:
        settings = stack.settings
        docs = _docs_for(CHUNKS, settings)
        texts = _texts(docs, settings)
        publish_many(stack, "warmup", [Doc(path="warmup.txt", text="The workers load the model first.\n")])
        wait_searchable(stack)

        bare_before, bare_cpu_before = _bare(settings, texts)
        cpu_before = _cpu_seconds(stack)
        started = time.perf_counter()
        publish_many(stack, "bench", docs)
        wait_searchable(stack)
        seconds = time.perf_counter() - started
        print(f"pipeline: {len(docs)} docs searchable in {seconds:.1f} s", flush=True)
        cpu = {name: spent - cpu_before.get(name, 0.0) for name, spent in _cpu_seconds(stack).items()}
        chunks = chunk_count(stack, "bench")
        bare_after, bare_cpu_after = _bare(settings, texts)

    assert chunks >= 0.9 * len(texts), f"only {chunks} of {len(texts)} chunks were indexed"
    bare_s = (bare_before + bare_after) / 2
    bare_rate, pipeline_rate = len(texts) / bare_s, chunks / seconds
    # The machine's other load changes how many cores each side gets; CPU seconds per chunk do not depend on it.
    bare_cpu = (bare_cpu_before + bare_cpu_after) / 2 / len(texts)
    pipeline_cpu = sum(cpu.values()) / chunks
    rows: list[tuple[str, str, float, float]] = [
        ("bare model", f"before: {len(texts) / bare_before:.1f}/s, after: {len(texts) / bare_after:.1f}/s",
         bare_s, bare_rate),
        ("pipeline", f"{len(docs)} docs, {chunks} chunks, publish → searchable", seconds, pipeline_rate),
        *((f"  CPU s: {name}", "during the pipeline run", round(spent, 1), spent / seconds)
          for name, spent in sorted(cpu.items(), key=lambda item: -item[1]) if spent >= 0.5),
    ]
    report(
        "local_model",
        ["run", "what", "seconds", "chunks/s (CPU rows: cores busy)"],
        rows,
        {
            "chunks": chunks,
            "texts": len(texts),
            "documents": len(docs),
            "precision": PRECISION,
            "shards": SHARDS,
            "bare_chunks_per_s": round(bare_rate, 2),
            "bare_before_chunks_per_s": round(len(texts) / bare_before, 2),
            "bare_after_chunks_per_s": round(len(texts) / bare_after, 2),
            "pipeline_chunks_per_s": round(pipeline_rate, 2),
            "pipeline_seconds": round(seconds, 1),
            "cpu_seconds": {name: round(spent, 1) for name, spent in cpu.items()},
            "ratio_to_bare_model": round(pipeline_rate / bare_rate, 3),
            "bare_cpu_s_per_chunk": round(bare_cpu, 4),
            "pipeline_cpu_s_per_chunk": round(pipeline_cpu, 4),
            "cpu_ratio_to_bare_model": round(bare_cpu / pipeline_cpu, 3),
            "goal_ratio": GOAL,
        },
    )
