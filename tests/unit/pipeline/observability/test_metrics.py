"""Counters and histograms through prometheus_client (shardfuse.pipeline.observability.metrics): exact sums
over the processes of a prefork pool (shardfuse.pipeline.observability.multiprocess), counts kept when a
process is killed, histogram buckets, fixed label sets, and what the instrumented code counts."""

from __future__ import annotations

import math
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest

from shardfuse.pipeline.core.errors import EmbeddingProviderError, RateLimitedError
from shardfuse.pipeline.core.http_api.retries import call_with_retries
from shardfuse.pipeline.embed.providers.hashing import HashingEmbedder
from shardfuse.pipeline.embed.stage import EmbeddingStage
from shardfuse.pipeline.index.store.embedding_cache import MemoryEmbeddingCache
from shardfuse.pipeline.observability import metrics, multiprocess
from shardfuse.pipeline.observability.metric_totals import MetricTotals, parse_scrape
from tests.support.counting_processes import count_in_children

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _scrape_directory(directory: Path) -> MetricTotals:
    """What the pool's main process serves for ``directory``: every process's files added up."""
    return parse_scrape(generate_latest(multiprocess.pool_registry(directory)).decode())


def test_counts_from_many_prefork_processes_and_threads_add_up_exactly(tmp_path: Path) -> None:
    plan = [
        ("inc", "EVENTS", 1, {"stage": "ingest", "outcome": "prepared"}),
        ("inc", "EMBEDDING_TOKENS", 3, {"provider": "hashing", "model": "m"}),
        ("observe", "QUERY_DURATION", 0.02, {"mode": "hybrid", "outcome": "ok"}),
        ("observe", "QUERY_DURATION", 2.0, {"mode": "hybrid", "outcome": "ok"}),
    ] * 250
    children, threads = 4, 3
    pids = count_in_children(tmp_path, plan, children=children, threads=threads)

    assert len({*pids}) == children
    assert len(list(tmp_path.glob("*.db"))) >= children  # one file per process and metric type
    totals = _scrape_directory(tmp_path)
    runs = children * threads * 250
    assert totals.counter(metrics.EVENTS, stage="ingest", outcome="prepared") == runs
    assert totals.counter(metrics.EVENTS) == runs  # no other series appeared
    assert totals.counter(metrics.EMBEDDING_TOKENS, model="m") == 3 * runs
    latency = totals.histogram(metrics.QUERY_DURATION, mode="hybrid")
    assert latency.count == 2 * runs
    assert latency.sum == pytest.approx(runs * (0.02 + 2.0))
    assert dict(latency.buckets)[0.025] == runs and dict(latency.buckets)[2.5] == 2 * runs


def test_a_killed_process_keeps_its_counts_until_the_pool_restarts(tmp_path: Path) -> None:
    plan = [("inc", "EVENTS", 5, {"stage": "embed", "outcome": "indexed"})]
    count_in_children(tmp_path, plan, children=3, kill=2)  # two of three die by SIGKILL, no hook runs

    assert _scrape_directory(tmp_path).counter(metrics.EVENTS, stage="embed", outcome="indexed") == 15
    # Marking a finished process dead drops live gauges only: counters stay.
    for pid_file in tmp_path.glob("counter_*.db"):
        multiprocess.mark_process_dead(int(pid_file.stem.split("_")[-1]), tmp_path)
    assert _scrape_directory(tmp_path).counter(metrics.EVENTS) == 15

    # The pool restarts: its main process empties the directory before it forks; counting starts again.
    assert multiprocess.clean_directory(tmp_path) >= 3
    assert _scrape_directory(tmp_path).counter(metrics.EVENTS) == 0
    count_in_children(tmp_path, plan, children=1)
    assert _scrape_directory(tmp_path).counter(metrics.EVENTS) == 5


def test_clean_directory_creates_a_missing_one_and_leaves_other_files(tmp_path: Path) -> None:
    directory = tmp_path / "run" / "metrics" / "ingest"
    assert multiprocess.clean_directory(directory) == 0
    (directory / "counter_123.db").write_bytes(b"")
    (directory / "notes.txt").write_text("not ours")
    assert multiprocess.clean_directory(directory) == 1
    assert [p.name for p in directory.iterdir()] == ["notes.txt"]


def test_without_a_directory_a_pool_serves_its_own_process() -> None:
    assert multiprocess.pool_registry(None) is REGISTRY
    assert multiprocess.multiprocess_dir({}) is None
    assert multiprocess.multiprocess_dir({"PROMETHEUS_MULTIPROC_DIR": "/x/y"}) == Path("/x/y")


def _families() -> MetricTotals:
    return parse_scrape(generate_latest(REGISTRY).decode())


def test_histogram_buckets_are_inclusive_cumulative_and_end_in_inf() -> None:
    mode = f"buckets-{uuid.uuid4().hex[:8]}"  # a series of this test alone
    for value in (0.001, 0.005, 0.006, 0.3, 100.0):  # 0.005 is in the le="0.005" bucket: bounds are inclusive
        metrics.observe(metrics.QUERY_DURATION, value, mode=mode, outcome="ok")

    hist = _families().histogram(metrics.QUERY_DURATION, mode=mode)
    buckets = dict(hist.buckets)
    assert list(buckets) == [*metrics.BUCKETS_S, math.inf]  # every bucket, the empty ones too
    assert (buckets[0.005], buckets[0.01], buckets[0.25], buckets[0.5], buckets[30.0], buckets[math.inf]) == (
        2, 3, 3, 4, 4, 5)
    assert [count for _, count in hist.buckets] == sorted(count for _, count in hist.buckets)
    assert hist.count == 5 and hist.sum == pytest.approx(100.312)


def test_metric_names_follow_prometheus_conventions() -> None:
    metrics.inc(metrics.EVENTS_PUBLISHED, 0, op="write")  # a series exists from its first count, even 0
    text = generate_latest(REGISTRY).decode()
    assert "# TYPE shardfuse_events_published_total counter" in text
    assert 'shardfuse_events_published_total{op="write"}' in text
    assert "# TYPE shardfuse_query_duration_seconds histogram" in text


@pytest.mark.skipif(not Path(PROMTOOL).exists(),
                    reason="promtool is not installed (make install installs Debian's prometheus)")
def test_promtool_accepts_a_pools_exposition(tmp_path: Path) -> None:
    count_in_children(tmp_path, [("inc", "EVENTS", 1, {"stage": "ingest", "outcome": "prepared"}),
                                 ("observe", "QUERY_DURATION", 0.2, {"mode": "keyword", "outcome": "ok"})], children=2)
    text = generate_latest(multiprocess.pool_registry(tmp_path))
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_metric_takes_exactly_its_labels() -> None:
    with pytest.raises(ValueError):
        metrics.inc(metrics.EVENTS, 1, stage="ingest")  # outcome missing
    with pytest.raises(ValueError):
        metrics.inc(metrics.PROVIDER_RETRIES, 1, provider="openai", model="x")  # a label it does not have
    with pytest.raises(ValueError):
        metrics.inc(metrics.EVENTS, -1, stage="ingest", outcome="prepared")  # counters only go up


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_embedding_stage_counts_chunks_and_cache_hits() -> None:
    labels = {"provider": "hashing", "model": "hashing:v2:16"}
    names = ["shardfuse_embedding_chunks_total", "shardfuse_embedding_cache_hits_total",
             "shardfuse_embedding_cache_misses_total", "shardfuse_embedding_texts_embedded_total",
             "shardfuse_embedding_tokens_total"]
    before = {name: _sample(name, **labels) for name in names}
    requests_before = _sample("shardfuse_embedding_requests_total", outcome="ok", **labels)

    stage = EmbeddingStage(embedder=HashingEmbedder(16), batch_size=8, cache=MemoryEmbeddingCache(dimensions=16))
    stage.embed({"a": "alpha", "b": "beta"}, chunks=3)  # two distinct texts of three chunks, both missing
    stage.embed({"a": "alpha", "b": "beta", "c": "gamma"}, chunks=3)  # two hits, one miss

    added = {name.removeprefix("shardfuse_embedding_").removesuffix("_total"): _sample(name, **labels) - before[name]
             for name in names}
    # tokens: words, for a provider without a tokenizer
    assert added == {"chunks": 6, "cache_hits": 2, "cache_misses": 3, "texts_embedded": 3, "tokens": 3}
    assert _sample("shardfuse_embedding_requests_total", outcome="ok", **labels) - requests_before == 2


def test_provider_429s_and_retries_are_counted() -> None:
    provider = f"test-{uuid.uuid4().hex[:8]}"
    errors = [RateLimitedError("429", retry_after_s=None), RateLimitedError("429", retry_after_s=1.0),
              EmbeddingProviderError("503")]

    def call() -> str:
        if errors:
            raise errors.pop(0)
        return "vectors"

    assert call_with_retries(call, max_retry_s=600, on_rate_limited=lambda _s: None, sleep=lambda _s: None,
                             provider=provider) == "vectors"
    assert _sample("shardfuse_provider_rate_limited_total", provider=provider) == 2
    assert _sample("shardfuse_provider_retries_total", provider=provider) == 3
