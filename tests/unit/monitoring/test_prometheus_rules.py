"""The Prometheus files of config/prometheus, checked by Debian's own tools: the alert rules load
(``promtool check rules``), each alert fires on the series of alerts_test.yml and stays quiet on the look-alikes
there (``promtool test rules``), the scrape config is valid (``promtool check config``), and every series the
rules read is one shardfuse serves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.monitoring import (
    PROMETHEUS_DIR,
    PROMTOOL,
    alert_expressions,
    exporter_metric_names,
    metric_names,
    pool_metric_names,
)

pytestmark = pytest.mark.skipif(not Path(PROMTOOL).exists(),
                                reason="promtool is not installed (make install installs Debian's prometheus)")
ALERTS = ("ShardfuseQueueStuck", "ShardfuseDeadLettersGrowing", "ShardfuseFreshnessBudgetBurnFast",
          "ShardfuseFreshnessBudgetBurnSlow", "ShardfuseTargetDown", "ShardfusePoolMissing",
          "ShardfuseStoreUnreachable")


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_checks_the_alert_rules() -> None:
    checked = _promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_expressions())} rules found" in checked.stdout


def test_promtool_checks_the_scrape_config_and_the_rule_file_it_loads() -> None:
    checked = _promtool("check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    pools = {target["labels"]["pool"] for target in jobs["shardfuse-pools"]["static_configs"]}
    assert pools == {"ingest", "embed", "maintenance", "query"}
    assert "shardfuse-exporter" in jobs


def test_every_alert_fires_on_its_test_series_and_not_on_the_look_alikes() -> None:
    tested = _promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    cases = yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
    fired = {case["alertname"] for test in cases for case in test["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for test in cases for case in test["alert_rule_test"] if not case["exp_alerts"]}
    assert fired == set(ALERTS) == {name for name in alert_expressions() if ":" not in name}
    assert quiet, "no series that must not fire"


def test_promtool_test_rules_fails_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    """The rule tests can fail: with the stuck-queue alert made blind, its expected firing is reported."""
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(PROMETHEUS_DIR / name, tmp_path / name)
    rules = tmp_path / "alerts.yml"
    rules.write_text(rules.read_text().replace("(shardfuse_queue_oldest_waiting_seconds > 300)",
                                               "(shardfuse_queue_oldest_waiting_seconds > 1e9)"))
    tested = _promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "alertname: ShardfuseQueueStuck" in tested.stdout + tested.stderr


def test_the_rules_read_only_series_shardfuse_serves() -> None:
    served = pool_metric_names() | exporter_metric_names() | {"up"}
    for name, expr in alert_expressions().items():
        assert metric_names(expr) <= served, f"{name} reads {metric_names(expr) - served}, which nothing serves"
