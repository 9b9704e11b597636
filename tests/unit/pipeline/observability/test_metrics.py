"""Counters and histograms added up across threads and processes in Redis (shardfuse.pipeline.observability.metrics,
read back by
shardfuse.pipeline.observability.metric_totals), on fakeredis (pure unit tests of Redis-using code)."""

from __future__ import annotations

import json
import logging
import math
import os
import threading

import fakeredis
import pytest

from shardfuse.pipeline.core.errors import EmbeddingProviderError, RateLimitedError
from shardfuse.pipeline.embed.providers.hashing import HashingEmbedder
from shardfuse.pipeline.embed.retrying import call_with_retries
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store.embedding_cache import MemoryEmbeddingCache
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.metric_totals import Histogram, cumulative, read_totals
from shardfuse.pipeline.observability.metrics import MetricsRecorder


@pytest.fixture
def server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def _recorder(server: fakeredis.FakeServer, **kwargs: object) -> MetricsRecorder:
    recorder = MetricsRecorder(**kwargs)  # type: ignore[arg-type]
    recorder.connect(lambda: fakeredis.FakeRedis(server=server))
    return recorder


def test_increments_from_many_threads_add_up_exactly_while_the_flusher_runs(server: fakeredis.FakeServer) -> None:
    # A flush every millisecond: flushes take counts while the threads are still adding to them.
    recorder = _recorder(server, flush_interval_s=0.001)
    threads, per_thread = 8, 2000

    def work(n: int) -> None:
        for i in range(per_thread):
            recorder.inc("events", stage="embed", outcome="indexed")
            recorder.inc("tokens", 3, worker=str(n % 2))
            recorder.observe("latency_seconds", 0.02 if i % 2 else 2.0, mode="hybrid")

    pool = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    recorder.close()

    totals = read_totals(fakeredis.FakeRedis(server=server))
    assert totals.counter("events") == threads * per_thread
    assert totals.counter("events", stage="embed", outcome="indexed") == threads * per_thread
    assert totals.counter("tokens") == 3 * threads * per_thread
    assert totals.counter("tokens", worker="1") == 3 * threads * per_thread / 2
    latency = totals.histogram("latency_seconds", mode="hybrid")
    assert latency.count == threads * per_thread
    assert latency.sum == pytest.approx(threads * per_thread / 2 * (0.02 + 2.0))
    assert recorder.pending() == {"counters": {}, "buckets": {}, "sums": {}}


def test_a_failing_redis_keeps_the_increments_until_it_is_back(
    server: fakeredis.FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = _recorder(server, flush_interval_s=3600)  # flushed by hand only
    recorder.inc("published", 5, op="write")
    recorder.observe("query_seconds", 0.2)
    server.connected = False
    with caplog.at_level(logging.WARNING, logger="shardfuse.pipeline.observability.metrics"):
        assert recorder.flush() is False  # never raises
        recorder.inc("published", 3, op="write")  # counted during the outage
        assert recorder.flush() is False
    assert len([r for r in caplog.records if "cannot flush metrics" in r.getMessage()]) == 1  # logged once
    client = fakeredis.FakeRedis(server=server)
    server.connected = True
    assert read_totals(client).counter("published") == 0  # nothing reached Redis while it was away

    assert recorder.flush() is True
    totals = read_totals(client)
    assert totals.counter("published", op="write") == 8
    assert totals.histogram("query_seconds").count == 1
    assert recorder.flush() is True  # nothing left to send twice
    assert read_totals(client).counter("published") == 8


def test_histogram_buckets_are_cumulative_and_merge_across_series(server: fakeredis.FakeServer) -> None:
    recorder = _recorder(server, buckets=(0.005, 0.01, 0.5))
    for value in (0.001, 0.005, 0.006):  # 0.005 is in the le="0.005" bucket: bounds are inclusive
        recorder.observe("q_seconds", value, mode="keyword")
    for value in (0.3, 100.0):
        recorder.observe("q_seconds", value, mode="vector")
    recorder.close()

    totals = read_totals(fakeredis.FakeRedis(server=server), bounds=(0.005, 0.01, 0.5))
    keyword = totals.histogram("q_seconds", mode="keyword")
    # Every bucket, the empty ones too (a series' buckets never change from one scrape to the next).
    assert keyword.buckets == ((0.005, 2), (0.01, 3), (0.5, 3), (math.inf, 3))
    assert totals.histograms[("q_seconds", (("mode", "vector"),))].buckets == (
        (0.005, 0), (0.01, 0), (0.5, 1), (math.inf, 2))
    both = totals.histogram("q_seconds")
    assert both.buckets == ((0.005, 2), (0.01, 3), (0.5, 4), (math.inf, 5))
    assert both.sum == pytest.approx(0.001 + 0.005 + 0.006 + 0.3 + 100.0)
    # Stored per bucket, not cumulative: each observation adds to one field only.
    stored = fakeredis.FakeRedis(server=server).hgetall("shardfuse:metrics:buckets")
    assert sum(int(v) for v in stored.values()) == 5
    assert {json.loads(f)[2] for f in stored} == {"0.005", "0.01", "0.5", "+Inf"}


def test_quantiles_interpolate_inside_their_bucket_as_prometheus_does() -> None:
    hist = cumulative({0.1: 50, 0.2: 40, 1.0: 10})
    assert hist.count == 100
    assert hist.quantile(0.5) == pytest.approx(0.1)  # exactly the first bucket's 50
    assert hist.quantile(0.7) == pytest.approx(0.1 + 0.1 * (20 / 40))
    assert hist.quantile(0.99) == pytest.approx(0.2 + 0.8 * (9 / 10))
    assert cumulative({0.1: 1, math.inf: 9}).quantile(0.9) == pytest.approx(0.1)  # in +Inf: the top bound
    assert Histogram(()).quantile(0.5) is None
    with pytest.raises(ValueError):
        hist.quantile(1.0)


def test_a_recorder_not_connected_keeps_counting_in_memory() -> None:
    recorder = MetricsRecorder()
    recorder.inc("events", 2, stage="ingest")
    assert recorder.flush() is False
    assert recorder.pending()["counters"] == {("events", (("stage", "ingest"),)): 2}


def test_a_forked_child_starts_from_nothing_and_flushes_on_a_thread_of_its_own(server: fakeredis.FakeServer) -> None:
    recorder = _recorder(server, flush_interval_s=3600)
    recorder.inc("parent_only", 5)  # pending in the parent when it forks
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it inherited and whether counting starts its own flusher
        try:
            inherited = recorder.pending()["counters"]
            recorder.inc("child", 1)
            flusher = any(t.name == "metrics-flush" and t.is_alive() for t in threading.enumerate())
            report = {"inherited": len(inherited), "flusher": flusher,
                      "pending": {s[0]: v for s, v in recorder.pending()["counters"].items()}}
            os.write(write_end, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert report == {"inherited": 0, "flusher": True, "pending": {"child": 1}}
    # The parent still holds its own count, once.
    assert recorder.pending()["counters"] == {("parent_only", ()): 5}
    recorder.close()
    assert read_totals(fakeredis.FakeRedis(server=server)).counter("parent_only") == 5


@pytest.fixture
def process_recorder(monkeypatch: pytest.MonkeyPatch) -> MetricsRecorder:
    """A fresh, unconnected recorder as the process's own: what the instrumented code counts stays in it."""
    recorder = MetricsRecorder()
    monkeypatch.setattr(metrics, "_RECORDER", recorder)
    return recorder


def _counted(recorder: MetricsRecorder) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {series: value for series, value in recorder.pending()["counters"].items() if value}


def test_the_embedding_stage_counts_chunks_and_cache_hits(process_recorder: MetricsRecorder) -> None:
    stage = EmbeddingStage(embedder=HashingEmbedder(16), batch_size=8, cache=MemoryEmbeddingCache(dimensions=16))
    stage.embed({"a": "alpha", "b": "beta"}, chunks=3)  # two distinct texts of three chunks, both missing
    stage.embed({"a": "alpha", "b": "beta", "c": "gamma"}, chunks=3)  # two hits, one miss
    labels = (("model", "hashing:v2:16"), ("provider", "hashing"))
    assert _counted(process_recorder) == {
        (metrics.EMBEDDING_CHUNKS, labels): 6,
        (metrics.EMBEDDING_CACHE_HITS, labels): 2,
        (metrics.EMBEDDING_CACHE_MISSES, labels): 3,
        (metrics.EMBEDDING_TEXTS, labels): 3,
        (metrics.EMBEDDING_TOKENS, labels): 3,  # words, for a provider without a tokenizer
        (metrics.EMBEDDING_REQUESTS, (("model", "hashing:v2:16"), ("outcome", "ok"), ("provider", "hashing"))): 2,
    }


def test_provider_429s_and_retries_are_counted(process_recorder: MetricsRecorder) -> None:
    errors = [RateLimitedError("429", retry_after_s=None), RateLimitedError("429", retry_after_s=1.0),
              EmbeddingProviderError("503")]

    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "vectors"

    assert call_with_retries(call, max_retry_s=600, on_rate_limited=lambda _s: None, sleep=lambda _s: None,
                             provider="openai") == "vectors"
    assert _counted(process_recorder) == {(metrics.PROVIDER_RATE_LIMITED, (("provider", "openai"),)): 2,
                                          (metrics.PROVIDER_RETRIES, (("provider", "openai"),)): 3}
