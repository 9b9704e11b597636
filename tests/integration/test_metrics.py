"""Metrics on the real embedded stack: what the workers and the publisher count reaches Redis from every
worker process, ``shardfuse exporter`` serves it over HTTP in Prometheus's text format, and ``shardfuse
status --json`` shows the same totals. Counts are compared before and after known activity (the session's
stack is shared with other tests)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import Stack
from tests.integration.ports import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Workers flush their counts every 2 s: a few flushes' worth of patience.
SETTLE_S = 2.5


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
                    raise AssertionError(f"the exporter did not serve {url}: {proc.communicate()}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert proc.returncode == 0, proc.communicate()  # SIGTERM stops it cleanly


def _scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=20) as response:
        assert response.status == 200
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _sum(families: dict[str, Any], sample: str, **labels: str) -> float:
    family = families.get(sample.removesuffix("_total").removesuffix("_count"))
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def _counts(url: str) -> dict[str, float]:
    families = _scrape(url)
    return {
        "published": _sum(families, "shardfuse_events_published_total", op="write"),
        "prepared": _sum(families, "shardfuse_events_total", stage="ingest", outcome="prepared"),
        "indexed": _sum(families, "shardfuse_events_total", stage="embed", outcome="indexed"),
        "chunks": _sum(families, "shardfuse_embedding_chunks_total"),
        "hybrid": _sum(families, "shardfuse_query_duration_seconds_count", mode="hybrid"),
        "keyword": _sum(families, "shardfuse_query_duration_seconds_count", mode="keyword"),
        "redis_up": _sum(families, "shardfuse_up", component="redis"),
        "postgres_up": _sum(families, "shardfuse_up", component="postgres"),
    }


def _settled(read: Callable[[], dict[str, float]], *, timeout: float = 60) -> dict[str, float]:
    """``read()`` once two readings a few flushes apart agree (what workers counted has been flushed)."""
    deadline = time.monotonic() + timeout
    last = read()
    while True:
        time.sleep(SETTLE_S)
        now = read()
        if now == last:
            return now
        assert time.monotonic() < deadline, f"metrics kept changing: {last} -> {now}"
        last = now


def _status_metrics(stack: Stack) -> dict[str, Any]:
    out = stack.cli("status", "--json").stdout
    assert out.count("\n") == 1, out  # one object on one line
    status: dict[str, Any] = json.loads(out)
    return status


def test_the_exporter_and_status_count_what_the_pipeline_did(stack: Stack, exporter: str) -> None:
    stack.wait()
    before = _settled(lambda: _counts(exporter))
    assert before["redis_up"] == 1 and before["postgres_up"] == 1
    status_before = _status_metrics(stack)["metrics"]

    zone = f"metrics-{uuid.uuid4().hex[:8]}"
    marker = uuid.uuid4().hex  # content no earlier test embedded: every chunk misses the cache
    with stack.publisher() as publisher:
        for i in range(3):
            publisher.write(zone=zone, path=f"notes/{i}.md", data=f"Note {i} about {marker} gauges.\n".encode())
    stack.wait()
    assert stack.search(f"{marker} gauges", zone)["results"]
    assert stack.search(marker, zone, mode="keyword")["results"]

    expected = {**before, "published": before["published"] + 3, "prepared": before["prepared"] + 3,
                "indexed": before["indexed"] + 3, "chunks": before["chunks"] + 3,
                "hybrid": before["hybrid"] + 1, "keyword": before["keyword"] + 1}
    deadline = time.monotonic() + 60
    while (after := _counts(exporter)) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert after == expected
    time.sleep(SETTLE_S)
    assert _counts(exporter) == expected  # and nothing more arrives: each event counted once

    status = _status_metrics(stack)
    summary = status["metrics"]
    assert summary["events_published"] == status_before["events_published"] + 3
    assert summary["events_indexed"] == status_before["events_indexed"] + 3 == after["indexed"]
    assert summary["chunks_embedded"] == status_before["chunks_embedded"] + 3
    assert summary["queries"]["count"] == status_before["queries"]["count"] + 2
    assert summary["queries"]["p50_s"] is not None and summary["queries"]["p99_s"] >= summary["queries"]["p50_s"]
    misses = summary["embedding_cache"]["misses"] - status_before["embedding_cache"]["misses"]
    assert misses == 3
    assert all(row["lag_versions"] == 0 and row["behind_s"] == 0 for row in status["bm25"])  # waited: current
