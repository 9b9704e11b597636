"""Chunking speed: one megabyte of real Python (the standard library's modules) in 256-token windows with a
32-token overlap, against a 3 s goal (typically ~0.4 s). A table, then one JSON line."""

from __future__ import annotations

import statistics
import time

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunkers.token_windows import chunk_text
from tests.benchmarks.scale import report
from tests.unit.pipeline.ingest.test_token_windows import _stdlib_source

GOAL_S = 3.0


def test_one_megabyte_of_python() -> None:
    counter = TokenCounter()
    counter.encode_with_offsets("warm up")  # builds the token-length table once per counter
    text = _stdlib_source(1_000_000)
    seconds = []
    for _ in range(3):
        began = time.perf_counter()
        chunks = chunk_text(text, counter=counter, max_tokens=256, overlap_tokens=32)
        seconds.append(time.perf_counter() - began)
    median = statistics.median(seconds)
    report("chunking", ["run", "seconds", "chunks"], [[i + 1, s, len(chunks)] for i, s in enumerate(seconds)],
           {"megabytes": 1, "median_s": round(median, 3), "goal_s": GOAL_S, "chunks": len(chunks)})
