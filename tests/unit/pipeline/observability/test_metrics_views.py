"""What ``shardfuse status`` shows of the pools' metrics (their /metrics endpoints, announced in Redis, read
over HTTP and added up) and what ``shardfuse exporter`` serves (live gauges of shared state), over fakeredis
and real HTTP servers (pure unit tests of Redis-using code)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from shardfuse.pipeline.config.settings import Settings
from shardfuse.pipeline.index.lexical.freshness import Bm25Freshness
from shardfuse.pipeline.observability import multiprocess
from shardfuse.pipeline.observability.endpoint_directory import ENDPOINTS_KEY, EndpointDirectory, PoolEndpoint
from shardfuse.pipeline.observability.metrics_server import MetricsServer
from shardfuse.workers import status as status_module
from shardfuse.workers.cli import operations
from shardfuse.workers.exporter import ShardfuseCollector, broker_families
from tests.support.counting_processes import Plan, count_in_children

# Nothing listens here: connections are refused at once.
CLOSED = "127.0.0.1:1"

EMBED = {"provider": "hashing", "model": "hashing:v2:64"}
# Known activity of an ingest pool and of an embed pool, as their tasks count it.
INGEST_POOL: Plan = [
    ("inc", "EVENTS", 4, {"stage": "ingest", "outcome": "prepared"}),
    ("inc", "EVENTS", 1, {"stage": "ingest", "outcome": "deleted"}),
    ("inc", "EVENTS", 1, {"stage": "ingest", "outcome": "dead_lettered"}),
    ("inc", "EVENTS", 2, {"stage": "maintenance", "outcome": "dead_lettered"}),  # not events: not "failed"
]
EMBED_POOL: Plan = [
    ("inc", "EVENTS", 3, {"stage": "embed", "outcome": "indexed"}),
    ("inc", "EVENTS", 1, {"stage": "embed", "outcome": "dead_lettered"}),
    ("inc", "EMBEDDING_CHUNKS", 40, EMBED),
    ("inc", "EMBEDDING_CACHE_HITS", 24, EMBED),
    ("inc", "EMBEDDING_CACHE_MISSES", 8, EMBED),
    ("inc", "EMBEDDING_TEXTS", 8, EMBED),
    ("inc", "PROVIDER_RATE_LIMITED", 2, {"provider": "openai"}),
    ("inc", "PROVIDER_RETRIES", 3, {"provider": "openai"}),
]
QUERY_POOL: Plan = [
    *[("observe", "QUERY_DURATION", 0.02, {"mode": "hybrid", "outcome": "ok"})] * 50,
    *[("observe", "QUERY_DURATION", 0.2, {"mode": "hybrid", "outcome": "ok"})] * 49,
    ("observe", "QUERY_DURATION", 3.0, {"mode": "hybrid", "outcome": "ok"}),
    ("observe", "QUERY_DURATION", 0.001, {"mode": "other", "outcome": "invalid"}),
]


def _settings(tmp_path: Path, **kwargs: Any) -> Settings:
    return Settings(data_dir=tmp_path, shards=2, postgres={"dsn": f"postgresql://postgres@{CLOSED}/x"}, **kwargs)


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[fakeredis.FakeRedis]:
    """Three pools serving /metrics on loopback, their counts made by forked processes, announced in a
    fakeredis as the workers announce them; and one announced pool that has gone (nothing listens)."""
    client = fakeredis.FakeRedis()
    directory = EndpointDirectory(client, stale_after_s=60)
    servers = []
    for name, plan, children in (("ingest", INGEST_POOL, 2), ("embed", EMBED_POOL, 1), ("query", QUERY_POOL, 1)):
        path = tmp_path / "metrics" / name
        multiprocess.clean_directory(path)
        count_in_children(path, plan, children=children)
        server = MetricsServer(multiprocess.pool_registry(path), address="127.0.0.1", port=0)
        servers.append(server)
        directory.announce(PoolEndpoint(node=f"{name}@host", url=server.url))
    directory.announce(PoolEndpoint(node="maintenance@gone", url=f"http://{CLOSED}/metrics"))
    try:
        yield client
    finally:
        for server in servers:
            server.stop()


def test_status_adds_up_every_pools_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str], pools: fakeredis.FakeRedis) -> None:
    tracker = Bm25Freshness(pools)
    tracker.mark_dirty(1, [("docs", "a.md")])
    tracker.mark_dirty(1, [("docs", "b.md")])
    monkeypatch.setattr(status_module.monitor, "broker_client", lambda settings: pools)

    operations.run_status(argparse.Namespace(json=True), _settings(tmp_path))
    out = capsys.readouterr().out
    assert out.count("\n") == 1  # one object, one line
    status = json.loads(out)
    summary = status["metrics"]
    # The ingest pool's two processes each counted its plan once.
    assert (summary["events_indexed"], summary["events_deleted"], summary["events_failed"]) == (3, 2, 2 + 1)
    assert summary["events_by_stage"]["ingest"] == {"dead_lettered": 2, "deleted": 2, "prepared": 8}
    assert summary["chunks_embedded"] == 40 and summary["texts_embedded"] == 8
    assert summary["embedding_cache"] == {"hits": 24, "misses": 8, "hit_ratio": 0.75}
    assert (summary["provider_rate_limited"], summary["provider_retries"]) == (2, 3)
    queries = summary["queries"]
    assert queries["count"] == 101 and queries["by_outcome"] == {"invalid": 1, "ok": 100}
    # 101 observations: the 50.5th is in the (0.01, 0.025] bucket that holds 0.001's 1 + 0.02's 50.
    assert 0.01 < queries["p50_s"] <= 0.025 and 0.1 < queries["p99_s"] <= 0.25
    endpoints = {row["node"]: row for row in status["metrics_endpoints"]}
    assert set(endpoints) == {"ingest@host", "embed@host", "query@host", "maintenance@gone"}
    assert "error" in endpoints["maintenance@gone"] and CLOSED in endpoints["maintenance@gone"]["error"]
    assert all("error" not in endpoints[node] for node in ("ingest@host", "embed@host", "query@host"))
    # Whether BM25 is current is asked of PostgreSQL (Redis can lose data): nothing listens, so no shard is.
    assert [(row["current"], CLOSED in row["error"]) for row in status["bm25"]] == [(False, True)] * 2
    assert "database_error" in status  # nothing listens: said, not raised

    text = status_module.format_status(status)
    assert "3 indexed, 2 deleted, 0 skipped, 3 failed (dead-lettered)" in text
    assert "cache hit rate 75% (24 of 32 texts)" in text and "rebuild pending" in text
    assert "metrics  3 pool endpoint(s) read" in text and "maintenance@gone at http://127.0.0.1:1/metrics" in text


def test_status_says_when_no_pool_serves_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = fakeredis.FakeRedis()
    monkeypatch.setattr(status_module.monitor, "broker_client", lambda settings: client)
    status = status_module.collect_status(_settings(tmp_path), state=None)
    assert status["metrics_endpoints"] == [] and status["metrics"]["events_indexed"] == 0
    assert "no worker pool serves /metrics" in status_module.format_status(status)


def test_announcements_go_stale_unless_renewed() -> None:
    client = fakeredis.FakeRedis()
    directory = EndpointDirectory(client, stale_after_s=20)
    live, gone = PoolEndpoint("ingest@a", "http://a:9809/metrics"), PoolEndpoint("ingest@b", "http://b:9809/metrics")
    directory.announce(live)
    now = float(client.time()[0])
    client.zadd(ENDPOINTS_KEY, {gone.member(): now - 30})  # last announced 30 s ago
    assert directory.endpoints() == [live]
    assert client.zcard(ENDPOINTS_KEY) == 1  # the stale one is removed by the reader
    directory.announce(live)  # renewing does not duplicate
    assert directory.endpoints() == [live]
    directory.withdraw(live)
    assert directory.endpoints() == []


def _scrape(collector: Any) -> dict[str, Any]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _value(families: dict[str, Any], sample_name: str, **labels: str) -> float:
    family = families[sample_name]
    found = [s.value for s in family.samples if s.name == sample_name and all(s.labels.get(k) == v
                                                                               for k, v in labels.items())]
    assert len(found) == 1, (sample_name, labels, family.samples)
    return float(found[0])


class _Collector:
    """The exporter's Redis part over fakeredis."""

    def __init__(self, settings: Settings, client: fakeredis.FakeRedis) -> None:
        self._settings, self._client = settings, client

    def collect(self) -> Any:
        yield from broker_families(self._settings, self._client)


def test_the_exporter_serves_live_gauges_and_no_counter(tmp_path: Path) -> None:
    client = fakeredis.FakeRedis()
    client.lpush("ingest", json.dumps({"body": "", "headers": {}, "properties": {}}))
    Bm25Freshness(client).mark_dirty(0, [("docs", "a.md")])
    families = _scrape(_Collector(_settings(tmp_path), client))

    assert _value(families, "shardfuse_queue_waiting_messages", queue="ingest") == 1
    assert _value(families, "shardfuse_queue_waiting_messages", queue="embed") == 0
    # BM25 freshness comes from PostgreSQL, which is not there: no shard counts as current.
    assert _value(families, "shardfuse_bm25_current", shard="0") == 0
    assert _value(families, "shardfuse_bm25_lag_versions", shard="1") == 0
    assert _value(families, "shardfuse_bm25_generation", shard="0") == -1  # never built
    assert not math.isnan(_value(families, "shardfuse_bm25_behind_seconds", shard="0"))
    # The pools serve the counters; the exporter repeating them would double every sum in Prometheus.
    assert {family.type for family in families.values()} == {"gauge"}


def test_a_scrape_with_redis_and_postgres_down_says_so_instead_of_failing(tmp_path: Path) -> None:
    settings = _settings(tmp_path, broker={"url": f"redis://{CLOSED}/0"})
    families = _scrape(ShardfuseCollector(settings))
    assert _value(families, "shardfuse_up", component="redis") == 0
    assert _value(families, "shardfuse_up", component="postgres") == 0
    assert "shardfuse_queue_waiting_messages" not in families
