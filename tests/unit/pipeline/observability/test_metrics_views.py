"""What ``shardfuse exporter`` serves and ``shardfuse status`` shows of the metric totals and the live
gauges, after known activity recorded into fakeredis (pure unit tests of Redis-using code)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.metric_totals import read_totals
from shardfuse.pipeline.observability.metrics import MetricsRecorder
from shardfuse.workers import status as status_module
from shardfuse.workers.cli import operations
from shardfuse.workers.exporter import ShardfuseCollector, broker_families, totals_families

# Nothing listens here: connections are refused at once.
CLOSED = "127.0.0.1:1"


def _activity(client: fakeredis.FakeRedis) -> None:
    """Known activity, recorded as the workers and the publisher would."""
    recorder = MetricsRecorder()
    recorder.connect(lambda: client)
    recorder.inc(metrics.EVENTS_PUBLISHED, 5, op="write")
    recorder.inc(metrics.EVENTS_PUBLISHED, 1, op="delete")
    recorder.inc(metrics.EVENTS, 4, stage="ingest", outcome="prepared")
    recorder.inc(metrics.EVENTS, 1, stage="ingest", outcome="deleted")
    recorder.inc(metrics.EVENTS, 1, stage="ingest", outcome="dead_lettered")
    recorder.inc(metrics.EVENTS, 3, stage="embed", outcome="indexed")
    recorder.inc(metrics.EVENTS, 1, stage="embed", outcome="dead_lettered")
    recorder.inc(metrics.EVENTS, 2, stage="maintenance", outcome="dead_lettered")  # not events: not "failed"
    labels = {"provider": "hashing", "model": "hashing:v2:64"}
    recorder.inc(metrics.EMBEDDING_CHUNKS, 40, **labels)
    recorder.inc(metrics.EMBEDDING_CACHE_HITS, 24, **labels)
    recorder.inc(metrics.EMBEDDING_CACHE_MISSES, 8, **labels)
    recorder.inc(metrics.EMBEDDING_TEXTS, 8, **labels)
    recorder.inc(metrics.PROVIDER_RATE_LIMITED, 2, provider="openai")
    recorder.inc(metrics.PROVIDER_RETRIES, 3, provider="openai")
    for seconds in [0.02] * 50 + [0.2] * 49 + [3.0]:
        recorder.observe(metrics.QUERY_DURATION, seconds, mode="hybrid", outcome="ok")
    recorder.observe(metrics.QUERY_DURATION, 0.001, mode="other", outcome="invalid")
    assert recorder.flush() is True


def _settings(tmp_path: Path, **kwargs: Any) -> Settings:
    return Settings(data_dir=tmp_path, shards=2, postgres={"dsn": f"postgresql://postgres@{CLOSED}/x"}, **kwargs)


def test_status_summarises_the_totals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    client = fakeredis.FakeRedis()
    _activity(client)
    tracker = Bm25Freshness(client)
    tracker.mark_dirty(1, [("docs", "a.md")])
    tracker.mark_dirty(1, [("docs", "b.md")])
    monkeypatch.setattr(status_module.monitor, "broker_client", lambda settings: client)

    operations.run_status(argparse.Namespace(json=True), _settings(tmp_path))
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one object, one line
    status = json.loads(out)
    summary = status["metrics"]
    assert (summary["events_published"], summary["events_indexed"], summary["events_deleted"],
            summary["events_failed"]) == (6, 3, 1, 2)
    assert summary["events_by_stage"]["ingest"] == {"dead_lettered": 1, "deleted": 1, "prepared": 4}
    assert summary["chunks_embedded"] == 40 and summary["texts_embedded"] == 8
    assert summary["embedding_cache"] == {"hits": 24, "misses": 8, "hit_ratio": 0.75}
    assert (summary["provider_rate_limited"], summary["provider_retries"]) == (2, 3)
    queries = summary["queries"]
    assert queries["count"] == 101 and queries["by_outcome"] == {"invalid": 1, "ok": 100}
    # 101 observations: the 50.5th is in the (0.01, 0.025] bucket that holds 0.001's 1 + 0.02's 50.
    assert 0.01 < queries["p50_s"] <= 0.025 and 0.1 < queries["p99_s"] <= 0.25
    lag = {row["shard"]: (row["lag_versions"], row["behind_s"]) for row in status["bm25"]}
    assert lag[0] == (0, 0.0) and lag[1][0] == 2 and lag[1][1] >= 0
    assert {"dirty_version", "built_version", "current", "generation"} <= set(status["bm25"][1])  # kept
    assert "database_error" in status  # nothing listens: said, not raised

    text = status_module.format_status(status)
    assert "6 published, 3 indexed, 1 deleted, 0 skipped, 2 failed (dead-lettered)" in text
    assert "cache hit rate 75% (24 of 32 texts)" in text and "2 commit(s) behind" in text


def test_behind_seconds_count_from_the_first_commit_the_index_lacks() -> None:
    client = fakeredis.FakeRedis()
    now_s = int(client.time()[0])
    # Commits 1..3, made 300, 30 and 10 seconds ago (as the commit script records them).
    for version, age in ((1, 300), (2, 30), (3, 10)):
        client.zadd("shardfuse:bm25:0:dirty_at", {f"{version}:{now_s - age}:0": version})
    tracker = Bm25Freshness(client)
    assert 300 <= tracker.behind_s(0, built_version=0) < 400
    assert 30 <= tracker.behind_s(0, built_version=1) < 300
    assert tracker.behind_s(0, built_version=3) == 0.0


def _scrape(collector: Any) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict[str, Any], sample_name: str, **labels: str) -> float:
    family = families[sample_name.removesuffix("_total").removesuffix("_bucket").removesuffix("_count")]
    found = [s.value for s in family.samples if s.name == sample_name and all(s.labels.get(k) == v
                                                                               for k, v in labels.items())]
    assert len(found) == 1, (sample_name, labels, family.samples)
    return float(found[0])


class _Collector:
    """The exporter's Redis part over fakeredis."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis) -> None:
        self._settings, self._client = settings, client

    def collect(self) -> Any:
        yield from totals_families(read_totals(self._client))
        yield from broker_families(self._settings, self._client)


def test_the_exporter_serves_counters_histograms_and_live_gauges(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    _activity(client)
    client.lpush("ingest", json.dumps({"body": "", "headers": {}, "properties": {}}))
    Bm25Freshness(client).mark_dirty(0, [("docs", "a.md")])
    families = _scrape(_Collector(_settings(tmp_path), client))

    assert _value(families, "shardfuse_events_published_total", op="write") == 5
    assert _value(families, "shardfuse_events_total", stage="embed", outcome="indexed") == 3
    assert _value(families, "shardfuse_embedding_cache_hit_ratio", model="hashing:v2:64") == 0.75
    assert _value(families, "shardfuse_provider_rate_limited_total", provider="openai") == 2
    hist = families["shardfuse_query_duration_seconds"]
    assert hist.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in hist.samples
               if s.name.endswith("_bucket") and s.labels["outcome"] == "ok"}
    assert buckets["0.025"] == 50 and buckets["0.25"] == 99 and buckets["+Inf"] == 100
    assert list(buckets.values()) == sorted(buckets.values())  # cumulative
    assert _value(families, "shardfuse_query_duration_seconds_count", mode="hybrid", outcome="ok") == 100
    assert _value(families, "shardfuse_queue_waiting_messages", queue="ingest") == 1
    assert _value(families, "shardfuse_queue_waiting_messages", queue="embed") == 0
    assert _value(families, "shardfuse_bm25_lag_versions", shard="0") == 1
    assert _value(families, "shardfuse_bm25_lag_versions", shard="1") == 0
    assert _value(families, "shardfuse_bm25_generation", shard="0") == -1  # never built
    assert not math.isnan(_value(families, "shardfuse_bm25_behind_seconds", shard="0"))


def test_a_scrape_with_redis_and_postgres_down_says_so_instead_of_failing(tmp_path: Path) -> None:
    settings = _settings(tmp_path, broker={"url": f"redis://{CLOSED}/0"})
    families = _scrape(ShardfuseCollector(settings))
    assert _value(families, "shardfuse_up", component="redis") == 0
    assert _value(families, "shardfuse_up", component="postgres") == 0
    assert "shardfuse_events_total" not in families and "shardfuse_queue_waiting_messages" not in families
