"""The shipped monitoring files are valid for the tools that read them: promtool checks the alert
rules, runs their unit tests (alerts_test.yml) and checks the scrape config; every Grafana
expression parses as PromQL. That they name only series the proxy exports is checked against a
real scrape in tests/integration/test_metrics_exposition.py."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
import yaml

from tests.lab import promql
from tests.lab.fixtures import require

PROMETHEUS_DIR = promql.REPO / "configs/deploy/prometheus"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    require(None if path else "promtool not found: apt-get install prometheus (scripts/setup test installs it)")
    return path


def run(promtool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=60)


def test_alert_rules_check(promtool):
    out = run(promtool, "check", "rules", "alerts.yml")
    assert out.returncode == 0 and "SUCCESS: 6 rules found" in out.stdout, out.stdout + out.stderr


def test_each_alert_fires_when_it_should_and_not_before(promtool):
    tested = {t["alertname"] for case in yaml.safe_load((PROMETHEUS_DIR / "alerts_test.yml").read_text())["tests"]
              for t in case["alert_rule_test"]}  # fmt: skip
    assert tested == set(promql.alert_expressions())  # every alert has its cases
    out = run(promtool, "test", "rules", "alerts_test.yml")
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_scrape_config_check(promtool):
    out = run(promtool, "check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    scrape = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())["scrape_configs"]
    assert [c["job_name"] for c in scrape] == ["replay-proxy"]  # the job ReplayProxyDown matches
    assert 'up{job="replay-proxy"}' in promql.alert_expressions()["ReplayProxyDown"]


def test_every_dashboard_expression_is_promql(promtool, tmp_path):
    expressions = promql.dashboard_expressions()
    assert len(expressions) >= 20
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expression_{i}", "expr": promql.as_prometheus_would_run_it(e)} for i, e in enumerate(expressions.values())
    ]}]}  # fmt: skip
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(tmp_path / "dashboard.yml")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and f"SUCCESS: {len(expressions)} rules found" in out.stdout, out.stdout + out.stderr


def test_dashboard_is_importable_json():
    dashboard = json.loads(promql.DASHBOARD.read_text())
    assert dashboard["uid"] == "replay-proxy" and dashboard["title"] == "replay-proxy"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    datasources = {json.dumps(t["datasource"]) for p in dashboard["panels"] for t in p.get("targets", [])}
    assert datasources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}  # the chosen data source
    titles = {p["title"] for p in dashboard["panels"]}
    assert {"Sessions", "Recoveries by outcome", "Held seconds", "Backend up", "Statement latency p99 by kind"} <= titles


def test_series_are_read_from_each_expression():
    """The reader the exposition test relies on: a name hidden in an aggregation, a binary
    operator's matching or a range is still found, and label lists are not taken for names."""
    expr = ('sum by (le, kind) (rate(a_bucket{target=~"$target", le="10.0"}[$__rate_interval])) / on(instance) '
            'group_left(target) b_total > bool 0 and c unless max(d{x!="y"}) offset 5m')  # fmt: skip
    assert promql.selectors(expr) == [
        promql.Selector("a_bucket", (("target", "=~", "$target"), ("le", "=", "10.0"))),
        promql.Selector("b_total"), promql.Selector("c"), promql.Selector("d", (("x", "!=", "y"),)),
    ]  # fmt: skip
    assert promql.grouping_labels(expr) == {"le", "kind", "instance", "target"}
    for where, expr in {**promql.alert_expressions(), **promql.dashboard_expressions()}.items():
        assert promql.selectors(expr), f"{where}: no series found in {expr!r}"
