"""A real Prometheus (Debian's ``prometheus``) scraping the session's embedded stack: the four pools' ``/metrics``
and ``shardfuse exporter``, every second, with the repository's alert rules loaded. After a few documents are
published, deleted and searched, every query of the Grafana dashboard (config/grafana) is evaluated through
Prometheus's HTTP API: each must be valid PromQL and the core ones must return data. The rules must evaluate
without error, and freshness must count from the change's first publication, across the ingest and embed
messages. Prometheus runs on a free loopback port with a temporary storage directory and is stopped at the end.

The README's picture is taken here too: headless Chromium (Debian's ``chromium``, driven by Playwright) on
Prometheus's own UI graphing queue depth and freshness while a few hundred documents load;
``SHARDFUSE_SCREENSHOT=docs/images/prometheus.png`` keeps it (``make prometheus-screenshot``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardfuse.pipeline.admin.publisher import Publisher
from shardfuse.pipeline.core.events import WriteEvent
from shardfuse.pipeline.observability import metrics
from shardfuse.pipeline.observability.metric_totals import add_up, parse_scrape
from shardfuse.pipeline.storage.cas import LocalContentStore
from shardfuse.workers.app import create_app
from shardfuse.workers.freshness import ORIGIN_HEADER
from shardfuse.workers.names import Queue, Task
from shardfuse.workers.publishing import CeleryEventSink
from shardfuse.workers.stack import celery_processes
from tests.integration.conftest import Stack
from tests.integration.ports import free_port
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, keep_screenshot
from tests.support.monitoring import PROMETHEUS, PROMETHEUS_DIR, alert_expressions, dashboard, panel_queries
from tests.support.paths import REPO
from tests.support.polling import eventually

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path(PROMETHEUS).exists(),
                       reason="prometheus is not installed (make install installs Debian's prometheus)"),
]

SCRAPE_INTERVAL = "1s"
# Dashboard queries that may rightly find nothing on a healthy stack with the hashing embedder: provider 429s
# and retries (none happen), and items dead-lettered in the last seconds.
MAY_BE_EMPTY = {("Embedding provider errors and 429s", "A"), ("Embedding provider errors and 429s", "B"),
                ("Dead letters", "B")}
# The screenshot's load: waves of documents a few seconds apart, one message each.
LOAD_WAVES, LOAD_WAVE_DOCUMENTS = 8, 50


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def api(self, path: str, **params: str) -> Any:
        """``/api/v1/<path>``'s answer: its ``data``, or AssertionError with Prometheus's error."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=20) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400/422: the query is not valid
            body = json.loads(exc.read())
        assert body["status"] == "success", f"{path} {params}: {body.get('errorType')}: {body.get('error')}"
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] in ("vector", "scalar"), data
        return list(data["result"]) if data["resultType"] == "vector" else [{"value": data["result"]}]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def exporter_url(stack: Stack) -> Iterator[str]:
    """``shardfuse exporter`` on a free loopback port (its ``host:port``)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardfuse.workers.cli.main", "exporter", "--address", "127.0.0.1", "--port", str(port)],
        env=stack.env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        eventually(lambda: _ready(f"http://127.0.0.1:{port}/metrics") or proc.poll() is not None, timeout=60,
                   what="the exporter")
        assert proc.poll() is None, proc.communicate()
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def scrape_config(stack: Stack, exporter: str, rules: Path) -> dict[str, Any]:
    """config/prometheus/prometheus.yml's jobs, pointed at this stack's ports, scraping every second."""
    shipped = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    pools = []
    for queue in Queue:
        endpoint = celery_processes.worker_metrics(stack.settings, queue)
        assert endpoint is not None
        pools.append({"targets": [f"{endpoint.url_host}:{endpoint.port}"], "labels": {"pool": queue.value}})
    jobs = {"shardfuse-pools": pools, "shardfuse-exporter": [{"targets": [exporter]}]}
    assert {job["job_name"] for job in shipped["scrape_configs"]} == set(jobs)
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": name, "static_configs": targets} for name, targets in jobs.items()],
    }


@pytest.fixture(scope="module")
def prometheus(stack: Stack, exporter_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    folder = tmp_path_factory.mktemp("prometheus")
    rules = folder / "alerts.yml"
    shutil.copy(PROMETHEUS_DIR / "alerts.yml", rules)
    config = folder / "prometheus.yml"
    config.write_text(yaml.safe_dump(scrape_config(stack, exporter_url, rules)))
    port = free_port()
    with (folder / "prometheus.log").open("w") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    running = Prometheus(f"http://127.0.0.1:{port}")
    try:
        eventually(lambda: _ready(f"{running.url}/-/ready") or proc.poll() is not None, timeout=60,
                   what="Prometheus to be ready")
        assert proc.poll() is None, (folder / "prometheus.log").read_text()[-3000:]

        def all_up() -> bool:
            targets = running.api("targets")["activeTargets"]
            return len(targets) == len(Queue) + 1 and all(t["health"] == "up" for t in targets)

        eventually(all_up, timeout=60, what="every target to be scraped")
        yield running
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, (folder / "prometheus.log").read_text()[-3000:]  # SIGTERM: a clean stop


def _activity(stack: Stack, zone: str, count: int) -> None:
    with stack.publisher() as publisher:
        for i in range(count):
            publisher.write(zone=zone, path=f"notes/{i}.md", data=f"Scraped note {i} about {zone}.\n".encode())
    stack.wait()
    with stack.publisher() as publisher:  # a message of its own: in the same one, the delete would win alone
        publisher.delete(zone=zone, path="notes/0.md")
    stack.wait()
    assert stack.search("scraped note", zone, k=3)["results"]


def test_every_dashboard_query_evaluates_on_prometheus_and_the_core_ones_have_data(stack: Stack,
                                                                                  prometheus: Prometheus) -> None:
    _activity(stack, f"scrape-{uuid.uuid4().hex[:8]}", 6)
    queries = panel_queries(dashboard())
    required = [query for query in queries if (query.panel, query.ref_id) not in MAY_BE_EMPTY]

    def empty() -> list[str]:
        return [f"{q.panel} {q.ref_id}: {q.promql}" for q in required if not prometheus.query(q.promql)]

    # The [10s] rates need two scrapes of the new counts: wait for them (a bad query fails at once).
    eventually(lambda: not empty(), timeout=30, what="every core dashboard query to return data")
    for query in queries:
        prometheus.query(query.promql)  # valid PromQL, evaluated

    alive = {r["metric"]["queue"]: float(r["value"][1]) for r in prometheus.query("shardfuse_pools_alive")}
    assert alive == {queue.value: 1.0 for queue in Queue}
    assert prometheus.value('sum(shardfuse_freshness_seconds_count{op="write"})') >= 6
    assert prometheus.value('sum(shardfuse_freshness_seconds_count{op="delete"})') >= 1
    assert prometheus.value("max(shardfuse_queue_waiting_messages)") == 0  # drained


def test_the_alert_rules_evaluate_on_the_live_series(prometheus: Prometheus) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]
        return rules if all(rule["health"] != "unknown" for rule in rules) else None

    rules = eventually(evaluated, timeout=30, what="every rule to be evaluated")
    assert {rule["name"] for rule in rules} == set(alert_expressions())
    assert all(rule["health"] == "ok" for rule in rules), [(r["name"], r.get("lastError")) for r in rules]
    firing = {rule["name"] for rule in rules if rule["type"] == "alerting" and rule["state"] == "firing"}
    assert not firing & {"ShardfusePoolMissing", "ShardfuseTargetDown", "ShardfuseStoreUnreachable",
                         "ShardfuseQueueStuck"}


class _OldEventSink:
    """Sends each event as its own ingest message whose change was first published ``age_s`` ago (as a change
    that waited in a queue, then in a retry, would be)."""

    def __init__(self, stack: Stack, age_s: float) -> None:
        self._app = create_app(stack.settings)
        self._age_s = age_s

    def send(self, event: WriteEvent) -> None:
        self._app.send_task(Task.INGEST.value, kwargs={"event": event.model_dump(mode="json")},
                            headers={ORIGIN_HEADER: time.time() - self._age_s})


def _freshness(stack: Stack) -> tuple[float, float]:
    """Across the pools: write changes observed, and those within 60 s."""
    totals = add_up(parse_scrape(urllib.request.urlopen(
        f"http://{e.url_host}:{e.port}/metrics", timeout=20).read().decode())
        for e in (celery_processes.worker_metrics(stack.settings, q) for q in Queue) if e is not None)
    histogram = totals.histogram(metrics.FRESHNESS, op="write")
    return histogram.count, dict(histogram.buckets).get(60.0, 0.0)


def test_freshness_counts_from_the_first_publication_across_the_ingest_and_embed_messages(stack: Stack) -> None:
    count, fast = _freshness(stack)
    zone = f"origin-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(cas=LocalContentStore(stack.settings.cas_root), sink=_OldEventSink(stack, age_s=120))
    for i in range(3):
        publisher.write(zone=zone, path=f"late/{i}.txt", data=f"A change that waited {i} {zone}.".encode())
    stack.wait()
    after_count, after_fast = _freshness(stack)
    # The embed pool committed them; the age it saw is the change's (2 minutes), not the embed message's.
    assert after_count - count == 3
    assert after_fast == fast


def test_screenshot_of_prometheus_graphing_queue_depth_and_freshness_during_a_load(
        stack: Stack, prometheus: Prometheus, tmp_path: Path) -> None:
    from playwright import sync_api  # only this test drives a browser

    assert shutil.which(CHROMIUM), "Debian's chromium is installed by `make install` (Makefile)"
    zone = f"load-{uuid.uuid4().hex[:8]}"
    # A few hundred documents in waves, one message each, so the queues fill and drain on the graph.
    with CeleryEventSink.connect(stack.settings, events_per_message=1) as sink:
        publisher = Publisher(cas=LocalContentStore(stack.settings.cas_root), sink=sink)
        for wave in range(LOAD_WAVES):
            for i in range(LOAD_WAVE_DOCUMENTS):
                words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(80))
                publisher.write(zone=zone, path=f"wave{wave}/{i}.md", data=f"Wave {wave} note {i}: {words}".encode())
            time.sleep(3)
    stack.wait(timeout=300)
    time.sleep(3)
    depth = "sum by (queue) (shardfuse_queue_waiting_messages + shardfuse_queue_in_flight_messages)"
    assert prometheus.value(f"max_over_time(sum({depth})[2m:1s])") > 0, "the queues never filled: a flat graph"
    quantile = "histogram_quantile({q}, sum by (le) (rate(shardfuse_freshness_seconds_bucket[5s])))"
    freshness = " or ".join(f'label_replace({quantile.format(q=q)}, "quantile", "{name}", "", "")'
                            for q, name in ((0.5, "p50"), (0.99, "p99")))
    params: dict[str, str] = {}
    for i, expr in enumerate((depth, freshness)):
        params |= {f"g{i}.expr": expr, f"g{i}.tab": "0", f"g{i}.range_input": "1m"}
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            # Tall enough for both graphs: a full-page shot would paint the fixed menu bar mid-page.
            page = browser.new_page(viewport={"width": 1280, "height": 1580})
            response = page.goto(f"{prometheus.url}/classic/graph?{urllib.parse.urlencode(params)}")
            assert response is not None and response.status == 200
            page.wait_for_selector(".graph_area svg path", timeout=30_000)
            page.evaluate("document.activeElement && document.activeElement.blur()")  # no focus ring
            page.wait_for_timeout(1000)
            assert page.locator(".graph_area svg path").count() >= 2
            shot = tmp_path / "prometheus.png"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    keep_screenshot(shot, min_bytes=20_000)
