"""The monitoring files the repository ships (config/grafana, config/prometheus), read as the tests need them:
the dashboard's panels and their queries, the alert rules' expressions, and the metric names shardfuse serves."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import Counter, Gauge, Histogram

from shardfuse.pipeline.observability import metrics
from tests.support.paths import REPO

DASHBOARD = REPO / "config" / "grafana" / "dashboards" / "shardfuse.json"
PROMETHEUS_DIR = REPO / "config" / "prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
# Grafana's own variables, as the queries would read with a 1 s scrape interval (the live test's).
GRAFANA_VARIABLES = {"$__rate_interval": "10s", "$__interval": "1s", "$__range": "5m"}
# A metric name of ours, or Prometheus's ``up`` (label names are never either: ``queue``, ``stage``, ``le``).
_NAME = re.compile(r"(?<![\w:])(shardfuse_\w+|up)(?![\w:])")


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref_id: str
    expr: str  # as Grafana stores it, with its variables

    @property
    def promql(self) -> str:
        """The query as Prometheus receives it from Grafana (its variables substituted)."""
        text = self.expr
        for variable, value in GRAFANA_VARIABLES.items():
            text = text.replace(variable, value)
        return text


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def data_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that draws data (rows are headings), nested rows' panels included."""
    found = []
    for panel in board["panels"]:
        if panel.get("type") == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def panel_queries(board: dict[str, Any]) -> list[PanelQuery]:
    return [PanelQuery(panel["title"], target.get("refId", ""), target.get("expr", ""))
            for panel in data_panels(board) for target in panel.get("targets", [])]


def alert_expressions(path: Path = PROMETHEUS_DIR / "alerts.yml") -> dict[str, str]:
    """Each rule of the file by its name (alert or record) to its expression."""
    groups = yaml.safe_load(path.read_text())["groups"]
    return {rule.get("alert") or rule["record"]: rule["expr"] for group in groups for rule in group["rules"]}


def metric_names(promql: str) -> set[str]:
    """The metric names an expression reads (``shardfuse_*`` and ``up``; not recording rules' ``a:b:c``)."""
    without_strings = re.sub(r'"[^"]*"', '""', promql)
    return set(_NAME.findall(without_strings))


def pool_metric_names() -> set[str]:
    """The series names the pools serve: every metric of :mod:`shardfuse.pipeline.observability.metrics`, with
    the suffixes the exposition gives each type."""
    names: set[str] = set()
    for value in vars(metrics).values():
        if isinstance(value, Histogram):
            base = value._name  # the family name, namespace included
            names |= {f"{base}_bucket", f"{base}_count", f"{base}_sum"}
        elif isinstance(value, Counter):
            names.add(f"{value._name}_total")
        elif isinstance(value, Gauge):
            names.add(value._name)
    return names


def exporter_metric_names() -> set[str]:
    """The gauges ``shardfuse exporter`` serves, as :mod:`shardfuse.workers.exporter` names them (its
    collector needs live Redis and PostgreSQL to produce them: the live test scrapes it)."""
    source = (REPO / "workers" / "exporter.py").read_text()
    return {f"shardfuse_{name}" for name in re.findall(r'_gauge\(\s*"(\w+)"', source)}
