"""Metrics on the real embedded stack: each worker pool serves one ``/metrics`` for all its processes (the
prefork ones through prometheus_client's multiprocess directory), with exact counts of what the pipeline
did, kept when a pool process is killed; ``shardfuse status --json`` adds the pools up and ``shardfuse
exporter`` serves the live gauges. Counts are compared before and after known activity (the session's stack
is shared with other tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.endpoint_directory import EndpointDirectory
from shardfuse.pipeline.observability.metric_totals import MetricTotals, add_up, parse_scrape
from shardfuse.workers import monitor
from shardfuse.workers.names import Queue
from shardfuse.workers.stack import celery_processes
from tests.integration.conftest import Stack
from tests.integration.ports import free_port
from tests.support.paths import REPO

pytestmark = pytest.mark.integration


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as response:
        assert response.status == 200
        return str(response.read().decode())


def _pool_urls(stack: Stack) -> dict[Queue, str]:
    """Where each pool of the embedded stack serves its metrics."""
    urls = {}
    for queue in Queue:
        endpoint = celery_processes.worker_metrics(stack.settings, queue)
        assert endpoint is not None
        urls[queue] = f"http://{endpoint.url_host}:{endpoint.port}/metrics"
    return urls


def _pools(stack: Stack) -> dict[Queue, MetricTotals]:
    return {queue: parse_scrape(_read(url)) for queue, url in _pool_urls(stack).items()}


def _stages(pools: dict[Queue, MetricTotals]) -> dict[Queue, dict[str, float]]:
    """Per pool, the events it counted by stage."""
    return {queue: totals.breakdown(metrics.EVENTS, "stage") for queue, totals in pools.items()}


def _counts(stack: Stack) -> dict[str, float]:
    totals = add_up(_pools(stack).values())
    return {
        "prepared": totals.counter(metrics.EVENTS, stage="ingest", outcome="prepared"),
        "indexed": totals.counter(metrics.EVENTS, stage="embed", outcome="indexed"),
        "chunks": totals.counter(metrics.EMBEDDING_CHUNKS),
        "misses": totals.counter(metrics.EMBEDDING_CACHE_MISSES),
        "hybrid": totals.histogram(metrics.QUERY_DURATION, mode="hybrid").count,
        "keyword": totals.histogram(metrics.QUERY_DURATION, mode="keyword").count,
    }


def _publish(stack: Stack, zone: str, count: int) -> str:
    marker = uuid.uuid4().hex  # content no earlier test embedded: every chunk misses the cache
    with stack.publisher() as publisher:
        for i in range(count):
            publisher.write(zone=zone, path=f"notes/{i}.md", data=f"Note {i} about {marker} gauges.\n".encode())
    stack.wait()
    return marker


def _status(stack: Stack) -> dict[str, Any]:
    out = stack.cli("status", "--json").stdout
    assert out.count("\n") == 1, out  # one object on one line
    status: dict[str, Any] = json.loads(out)
    return status


def test_each_pool_serves_exact_counts_of_what_the_pipeline_did(stack: Stack) -> None:
    stack.wait()
    # Every pool announced where it serves, for `shardfuse status`.
    announced = EndpointDirectory(monitor.broker_client(stack.settings),
                                  stale_after_s=stack.settings.delivery.dead_after_s).endpoints()
    assert sorted(e.url for e in announced) == sorted(_pool_urls(stack).values())
    before, status_before = _counts(stack), _status(stack)["metrics"]
    stages_before = _stages(_pools(stack))

    zone = f"metrics-{uuid.uuid4().hex[:8]}"
    marker = _publish(stack, zone, 3)
    assert stack.search(f"{marker} gauges", zone)["results"]
    assert stack.search(marker, zone, mode="keyword")["results"]

    # A task counts before it is acknowledged and a search before it answers: nothing to wait for.
    expected = {**before, "prepared": before["prepared"] + 3, "indexed": before["indexed"] + 3,
                "chunks": before["chunks"] + 3, "misses": before["misses"] + 3,
                "hybrid": before["hybrid"] + 1, "keyword": before["keyword"] + 1}
    assert _counts(stack) == expected
    time.sleep(1.0)
    assert _counts(stack) == expected  # and nothing more arrives: each event counted once

    # Each pool counted its own stage's part of this work only, so adding the pools up counts nothing twice.
    # (Deltas: the numbers before this test are whatever earlier tests of the session did.)
    pools = _pools(stack)
    grown = {queue: {stage for stage, value in counts.items() if value > stages_before[queue].get(stage, 0)}
             for queue, counts in _stages(pools).items()}
    seen = f"before {stages_before}, after {_stages(pools)}"
    assert grown[Queue.INGEST] == {"ingest"} and grown[Queue.EMBED] == {"embed"}, seen
    assert grown[Queue.QUERY] == set() and grown[Queue.MAINTENANCE] == set(), seen
    # The ingest pool times nothing but the deletes it commits (freshness); searches are the query pool's.
    assert {name for name, _ in pools[Queue.INGEST].histograms} <= {"shardfuse_freshness_seconds"}
    assert all(dict(labels) == {"op": "delete"} for _, labels in pools[Queue.INGEST].histograms)

    status = _status(stack)
    assert all("error" not in row for row in status["metrics_endpoints"]) and len(status["metrics_endpoints"]) == 4
    summary = status["metrics"]
    assert summary["events_indexed"] == status_before["events_indexed"] + 3 == expected["indexed"]
    assert summary["chunks_embedded"] == status_before["chunks_embedded"] + 3
    assert summary["embedding_cache"]["misses"] == status_before["embedding_cache"]["misses"] + 3
    assert summary["queries"]["count"] == status_before["queries"]["count"] + 2
    assert summary["queries"]["p50_s"] is not None and summary["queries"]["p99_s"] >= summary["queries"]["p50_s"]
    assert all(row["lag_versions"] == 0 and row["behind_s"] == 0 for row in status["bm25"])  # waited: current


def _children(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children()}


def test_a_killed_prefork_process_keeps_its_counts(stack: Stack) -> None:
    stack.wait()
    main = stack.state.components[celery_processes.worker_component(Queue.INGEST)].pid
    zone = f"metrics-kill-{uuid.uuid4().hex[:8]}"
    _publish(stack, zone, 2)
    counted = _counts(stack)["prepared"]
    assert counted >= 2

    old = _children(main)
    assert len(old) == stack.settings.workers.ingest_concurrency
    for pid in old:  # idle: they hold no message
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(new := _children(main) - old) < len(old):  # Celery forks replacements
        assert time.monotonic() < deadline, "the pool did not replace its killed processes"
        time.sleep(0.2)

    assert _counts(stack)["prepared"] == counted  # the dead processes' counts are still served
    _publish(stack, zone, 1)  # counted by a new process, added to what the dead ones counted
    assert _counts(stack)["prepared"] == counted + 1
    assert new


@pytest.fixture
def exporter(stack: Stack) -> Iterator[str]:
    """``shardfuse exporter`` on a free loopback port; its /metrics URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardfuse.workers.cli.main", "exporter", "--address", "127.0.0.1", "--port", str(port)],
        env=stack.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=10):
                    break
            except (urllib.error.URLError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()  # still running: its output ends only when it does
                    raise AssertionError(f"the exporter did not serve {url}: {proc.communicate(timeout=10)}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0, proc.communicate()  # SIGTERM stops it cleanly


def test_the_exporter_serves_the_deployments_gauges(stack: Stack, exporter: str) -> None:
    stack.wait()
    families = {family.name: family for family in text_string_to_metric_families(_read(exporter))}
    up = {s.labels["component"]: s.value for s in families["shardfuse_up"].samples}
    assert up == {"redis": 1, "postgres": 1}
    waiting = {s.labels["queue"]: s.value for s in families["shardfuse_queue_waiting_messages"].samples}
    assert waiting == {queue.value: 0 for queue in Queue}
    assert {s.labels["shard"] for s in families["shardfuse_bm25_lag_versions"].samples} == {"0", "1"}
    assert {family.type for family in families.values()} == {"gauge"}  # the counters are the pools'
