"""The Grafana dashboard (config/grafana/dashboards/shardfuse.json) against what shardfuse serves: every panel
has a query, every query parses as PromQL (``promtool check rules`` reads them as recording rules), every series
a query reads is one the pools or the exporter serve, the topics the issue asks for each have a panel, and the
provisioning files point at the dashboard and a Prometheus datasource. The live test
(tests/integration/test_prometheus_scrape.py) then evaluates each query on a real Prometheus."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.monitoring import (
    DASHBOARD,
    PROMTOOL,
    dashboard,
    data_panels,
    exporter_metric_names,
    metric_names,
    panel_queries,
    pool_metric_names,
)
from tests.support.paths import REPO

GRAFANA = REPO / "config" / "grafana"
# What a person looks for, and a series the panel must read for it.
TOPICS = {
    "queue depth": "shardfuse_queue_waiting_messages",
    "queue age": "shardfuse_queue_oldest_waiting_seconds",
    "throughput per stage": "shardfuse_events_total",
    "embed provider 429s": "shardfuse_provider_rate_limited_total",
    "embed provider errors": "shardfuse_embedding_requests_total",
    "BM25 lag": "shardfuse_bm25_lag_versions",
    "freshness": "shardfuse_freshness_seconds_bucket",
    "dead letters": "shardfuse_dead_letters",
    "query latency": "shardfuse_query_duration_seconds_bucket",
    "pools alive": "shardfuse_pools_alive",
}


def test_every_panel_has_a_query_and_uses_the_dashboards_datasource() -> None:
    board = dashboard()
    panels = data_panels(board)
    assert len(panels) >= len(TOPICS) - 2
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    for panel in panels:
        targets = panel.get("targets", [])
        assert targets and all(target.get("expr", "").strip() for target in targets), panel["title"]
        assert len({target["refId"] for target in targets}) == len(targets), panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource"]


def test_every_query_parses_as_promql(tmp_path: Path) -> None:
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool is not installed (make install installs Debian's prometheus)")
    queries = panel_queries(dashboard())
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": query.promql} for i, query in enumerate(queries)]}]}
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                             check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(queries)} rules found" in checked.stdout


def test_a_broken_query_is_refused_by_the_same_check(tmp_path: Path) -> None:
    if not Path(PROMTOOL).exists():
        pytest.skip("promtool is not installed (make install installs Debian's prometheus)")
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": "dashboard:broken", "expr": "sum by (queue) (rate(shardfuse_events_total[1m])"}]}]}))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                             check=False)
    assert checked.returncode != 0


def test_every_query_reads_series_shardfuse_serves() -> None:
    served = pool_metric_names() | exporter_metric_names() | {"up"}
    for query in panel_queries(dashboard()):
        names = metric_names(query.promql)
        assert names, f"{query.panel} {query.ref_id} reads no shardfuse series"
        assert names <= served, f"{query.panel} {query.ref_id} reads {names - served}, which nothing serves"


def test_each_topic_has_a_panel() -> None:
    read = {name for query in panel_queries(dashboard()) for name in metric_names(query.promql)}
    missing = {topic: series for topic, series in TOPICS.items() if series not in read}
    assert not missing


def test_the_provisioning_files_load_this_dashboard_from_prometheus() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "shardfuse.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["uid"] == dashboard()["templating"]["list"][0]["current"]["value"]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "shardfuse.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]
    assert DASHBOARD.parent == GRAFANA / "dashboards"
