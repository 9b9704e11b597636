"""The chunkers are linear in their input on hostile text: for every family of tests/support/hostile_text.py
(open HTML tags, unclosed headings, heading runs, deep nesting, headers without bodies, ...), chunking four
times the text takes about four times as long, measured side by side in one run, never the sixteen times of
a quadratic scan. Time is this thread's CPU time, so another process busy on the same cores (the fault tests
run beside this suite in ``make test``) does not move the ratio. (The absolute figures, 1 MB in under a
second, are the benchmark's: tests/benchmarks/bench_hostile_chunking.py.)

Sizes are 32 KB and 128 KB, so the whole test takes seconds: every family that was quadratic already showed
it at these sizes (ratios 12 to 18 before the fix, or a RecursionError)."""

from __future__ import annotations

import gc
import time

import pytest

from shardfuse.pipeline.core.token_counting import TokenCounter
from shardfuse.pipeline.ingest.chunk_filter import FilterSettings, filter_chunks
from tests.support.hostile_text import FAMILIES, chunk_seconds

SMALL, LARGE = 32_000, 128_000
# Linear is 4, quadratic 16: this leaves room for noise on a shared machine and none for a quadratic scan.
MAX_RATIO = 8.0
RUNS = 3


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    counter = TokenCounter()
    counter.encode_with_offsets("warm up")
    return counter


def _ratio(measure: object) -> float:
    """The best timing at LARGE over the best at SMALL, taken alternately after one discarded SMALL run (lazy
    set-up, cold caches). This thread's CPU time moves little with load, so a pair under MAX_RATIO settles it;
    a ratio over it is measured again, up to RUNS pairs, before the test fails. A quadratic scan stays near 16
    in every pair (the last test below)."""
    assert callable(measure)
    gc.collect()
    measure(SMALL)
    small: list[float] = []
    large: list[float] = []
    for _ in range(RUNS):
        gc.collect()
        small.append(measure(SMALL))
        gc.collect()
        large.append(measure(LARGE))
        ratio = min(large) / max(min(small), 1e-4)
        if ratio < MAX_RATIO:
            break
    return ratio


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_chunking_hostile_text_is_linear(family: str, counter: TokenCounter) -> None:
    ratio = _ratio(lambda n: chunk_seconds(family, n, counter=counter, clock=time.thread_time))
    assert ratio < MAX_RATIO, f"{family} ({FAMILIES[family][0]}): 4x the text took {ratio:.1f}x the time"


def test_filtering_the_chunks_of_hostile_text_is_linear(counter: TokenCounter) -> None:
    # Chunks full of entity candidates and distinct shingles: the filter's costliest input.
    def chunks(n: int) -> list[str]:
        words = [f"Name{i} v{i}.{i % 97} snake_{i}_x camelCase{i}" for i in range(n // 40)]
        return [" ".join(words[i : i + 50]) for i in range(0, len(words), 50)]

    def seconds(n: int) -> float:
        texts = chunks(n)
        began = time.thread_time()
        filter_chunks(texts, counter=counter, settings=FilterSettings())
        return time.thread_time() - began

    assert _ratio(seconds) < MAX_RATIO


def _spin_seconds(iterations: int) -> float:
    began = time.thread_time()
    total = 0
    for i in range(iterations):
        total += i
    return time.thread_time() - began


def test_the_measure_tells_a_quadratic_scan_from_a_linear_one() -> None:
    # The ratio stops at the first pair under MAX_RATIO: a quadratic cost must still fail it.
    assert _ratio(lambda n: _spin_seconds(n * 4)) < MAX_RATIO
    assert _ratio(lambda n: _spin_seconds(n * n // 40_000)) > MAX_RATIO
