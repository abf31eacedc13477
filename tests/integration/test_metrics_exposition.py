"""What Prometheus reads from a real proxy's /metrics: valid exposition (promtool check metrics,
no family twice), with no plugin, with the metrics plugin, and with every shipped config that
defines a plugin chain; every series the shipped alert rules, dashboard and configs name is in
such a scrape; SIGHUP's outcome and a changed admin token take effect on the running proxy.

The proxies run in front of MariaDB only: what /metrics holds does not depend on the server."""

from __future__ import annotations

import collections
import re
import shutil
import signal
import subprocess
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pymysql
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.conftest import start_proxy
from tests.lab import promql
from tests.lab.fixtures import APP_PASSWORD, APP_USER, require
from tests.lab.procs import wait_for
from tests.lab.proxy import REPO, ProxyProcess

pytestmark = pytest.mark.integration

# Configs whose [plugins] chain is not empty: each is run as shipped, but for its addresses and users.
PLUGIN_CONFIGS = sorted(p.name for p in (REPO / "configs").glob("*.toml") if tomllib.loads(p.read_text()).get("plugins", {}).get("chain"))
# Series Prometheus writes itself for each scrape target (the proxy cannot export its own absence).
PROMETHEUS_OWN = {"up"}
# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}
# Metric names as the docs and configs mention them: a full name, or a replay_proxy_ one without
# its prefix (three-plugins.toml's errors_total{code="1142"}); with the {labels} that follow, as
# matchers or as a list of label names (plugins/README.md's statements_total{command,kind}).
MENTION = re.compile(r"\b(replay_proxy_[a-z0-9_]+|[a-z][a-z0-9_]*_total)\b(\{[^}]*\})?")


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    require(None if path else "promtool not found: apt-get install prometheus (scripts/setup test installs it)")
    return path


def get(port: int, path: str, token: str | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def scrape(proxy: ProxyProcess, token: str | None = None) -> str:
    status, content_type, body = get(proxy.admin_port, "/metrics", token)
    assert status == 200, body
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"  # the classic text format Prometheus reads
    return body.decode()


class Scrape(dict):
    """{series name: samples}; ``families``: {name on a # TYPE line: samples} (a histogram's
    family name, which PromQL cannot select but a doc may name)."""

    families: dict[str, list]


def valid_exposition(text: str, promtool: str) -> Scrape:
    """promtool's verdict (no error, no lint) and no family twice; the series."""
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stdout and not out.stderr, f"promtool check metrics: {out.stdout}{out.stderr}"
    families = list(text_string_to_metric_families(text))
    twice = [name for name, n in collections.Counter(f.name for f in families).items() if n > 1]
    assert not twice, f"families exported twice: {twice}"
    types = collections.Counter(line.split()[2] for line in text.splitlines() if line.startswith("# TYPE "))
    assert all(n == 1 for n in types.values()), types
    series = Scrape()
    series.families = {}
    for family in families:
        series.families[family.name + "_total" if family.type == "counter" else family.name] = family.samples
        for sample in family.samples:
            series.setdefault(sample.name, []).append(sample)
    return series


def connect(proxy: ProxyProcess) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
                           autocommit=True, connect_timeout=10, read_timeout=30)  # fmt: skip


def workload(proxy: ProxyProcess) -> None:
    """A transaction, a read, a statement the server refuses (1146) and one a firewall refuses
    (1142, where a firewall denies DROP), so the per-statement families have samples."""
    conn = connect(proxy)
    try:
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT 1")
            cur.execute("COMMIT")
            for refused in ("SELECT * FROM no_such_table_here", "DROP TABLE no_such_table_here"):
                with pytest.raises(pymysql.MySQLError):
                    cur.execute(refused)
    finally:
        conn.close()


def ready(proxy: ProxyProcess) -> None:
    """The first health check is done: backend_up has a value to show."""
    wait_for(lambda: get(proxy.admin_port, "/readyz")[0] == 200, "/readyz 200", timeout=20, interval=0.1)


def check_selectors(where: str, selectors, series: dict[str, list], grouping: set[str] = frozenset()) -> None:
    """Each selected series is in the scrape, with the labels its matchers name, and the literal
    values of its ``=`` matchers among its samples' values."""
    for sel in selectors:
        if sel.name in PROMETHEUS_OWN:
            continue
        assert sel.name in series, f"{where}: {sel.name} is not in a scrape of the proxy"
        labels = TARGET_LABELS | {k for s in series[sel.name] for k in s.labels}
        for label, op, value in sel.matchers:
            assert label in labels, f"{where}: {sel.name} has no label {label} (it has {sorted(labels)})"
            if op == "=" and "$" not in value and label not in TARGET_LABELS:  # op "": a label name only
                values = {s.labels.get(label) for s in series[sel.name]}
                assert value in values, f"{where}: {sel.name}{{{label}={value!r}}}: no such series (values: {sorted(values)})"
    known = TARGET_LABELS | {k for sel in selectors for s in series.get(sel.name, []) for k in s.labels}
    assert grouping <= known, f"{where}: groups by {sorted(grouping - known)}, which no series it reads has"


def mentions(text: str) -> list[promql.Selector]:
    """The metric names (and their {labels}) a config or doc mentions."""
    out = []
    for name, labels in MENTION.findall(text):
        if not name.startswith("replay_proxy_"):
            name = "replay_proxy_" + name
        if re.fullmatch(r"\{\s*\w+(\s*,\s*\w+)*\s*\}", labels):  # label names only
            out.append(promql.Selector(name, tuple((label.strip(), "", "") for label in labels[1:-1].split(","))))
        else:
            out.extend(promql.selectors(name + labels))
    return out


def run_shipped(path: Path, tmp_path: Path, backend_port: int) -> ProxyProcess:
    """A shipped config as it is, on this test's ports and users."""
    shipped = tomllib.loads(path.read_text())
    overrides = {k: v for k, v in shipped.items() if k not in ("listen", "backend", "users", "admin")}
    overrides["listen"] = {k: v for k, v in shipped.get("listen", {}).items() if k != "address"}
    overrides["backend"] = {k: v for k, v in shipped.get("backend", {}).items() if k != "addresses"}
    overrides["admin"] = {k: v for k, v in shipped.get("admin", {}).items() if k != "address"}
    return start_proxy(tmp_path, backend_port, **overrides)


# --- valid exposition -----------------------------------------------------------------------------


@pytest.mark.parametrize("chain", [[], ["metrics"]], ids=["no-plugin", "metrics-plugin"])
def test_exposition_is_valid(chain, mariadb, tmp_path, promtool):
    proxy = start_proxy(tmp_path, mariadb.port, plugins={"chain": chain}, backend={"health_interval": "0.3s"})
    try:
        valid_exposition(scrape(proxy), promtool)  # at start: nothing counted yet
        ready(proxy)
        open_session = connect(proxy)
        try:
            workload(proxy)
            wait_for(
                lambda: 'replay_proxy_sessions_open{target="test"} 1.0' in scrape(proxy),
                "the workload's session to end",
                timeout=20,
                interval=0.1,
            )
            series = valid_exposition(scrape(proxy), promtool)
        finally:
            open_session.close()
    finally:
        proxy.stop()
    (build,) = series["replay_proxy_build_info"]
    assert build.value == 1 and build.labels["target"] == "test" and build.labels["version"] not in ("", "unknown")
    backend = f"127.0.0.1:{mariadb.port}"
    assert [(s.labels["address"], s.value) for s in series["replay_proxy_backend_up"]] == [(backend, 1)]
    assert [(s.labels["address"], s.value) for s in series["replay_proxy_backend_connections"]] == [(backend, 1)]  # open_session's
    assert "process_cpu_seconds_total" in series
    plugin = {"replay_proxy_statement_latency_seconds_bucket", "replay_proxy_statements_total", "replay_proxy_errors_total"}
    assert plugin <= series.keys() if chain else not plugin & series.keys()


def test_the_supervisors_merged_exposition_is_valid(mariadb, tmp_path, promtool):
    """--workers 2: /metrics gathers each worker's, labelled worker="i", still one family per name."""
    proxy = start_proxy(tmp_path, mariadb.port, listen={"workers": 2}, plugins={"chain": ["metrics"]})
    try:
        wait_for(lambda: scrape(proxy).count("replay_proxy_build_info{") == 2, "both workers' metrics", timeout=20, interval=0.1)
        workload(proxy)
        series = valid_exposition(scrape(proxy), promtool)
    finally:
        proxy.stop()
    assert sorted(s.labels["worker"] for s in series["replay_proxy_build_info"]) == ["0", "1"]
    assert len(series["process_cpu_seconds_total"]) == 2


@pytest.mark.parametrize("name", PLUGIN_CONFIGS)
def test_shipped_plugin_configs_expose_valid_metrics_and_the_names_they_mention(name, mariadb, tmp_path, promtool):
    path = REPO / "configs" / name
    proxy = run_shipped(path, tmp_path, mariadb.port)
    try:
        workload(proxy)
        series = valid_exposition(scrape(proxy), promtool)
    finally:
        proxy.stop()
    check_selectors(f"configs/{name}", mentions(path.read_text()), {**series.families, **series})
    chain = tomllib.loads(path.read_text())["plugins"]["chain"]
    assert ("replay_proxy_statements_total" in series) == ("metrics" in chain)


def test_plugin_configs_are_found():
    assert {"plugins.toml", "three-plugins.toml"} <= set(PLUGIN_CONFIGS)


# --- what the monitoring files and docs name --------------------------------------------------------


@pytest.fixture(scope="module")
def metrics_scrape(mariadb, tmp_path_factory, promtool) -> Scrape:
    """One scrape of a proxy with the metrics plugin, after a workload and its first health check
    (a firewall before it answers the DROP, so plugin_answers_total has a series too)."""
    plugins = {"chain": ["firewall", "metrics"], "firewall": {"deny": ["DROP"]}}
    proxy = start_proxy(tmp_path_factory.mktemp("metrics-proxy"), mariadb.port, plugins=plugins, backend={"health_interval": "0.3s"})
    try:
        ready(proxy)
        workload(proxy)
        return valid_exposition(scrape(proxy), promtool)
    finally:
        proxy.stop()


def test_alert_rules_name_only_what_the_proxy_exports(metrics_scrape):
    alerts = promql.alert_expressions()
    assert len(alerts) == 6
    for alert, expr in alerts.items():
        check_selectors(f"alerts.yml {alert}", promql.selectors(expr), metrics_scrape, promql.grouping_labels(expr))


def test_dashboard_names_only_what_the_proxy_exports(metrics_scrape):
    for where, expr in promql.dashboard_expressions().items():
        grouping = promql.grouping_labels(expr)
        if ":label=" in where:
            grouping.add(where.rsplit("=", 1)[1])  # label_values(<expr>, <label>)
        check_selectors(f"replay-proxy.json {where}", promql.selectors(expr), metrics_scrape, grouping)


def test_names_the_other_configs_and_the_plugin_docs_mention_are_exported(metrics_scrape):
    files = [p for p in (REPO / "configs").rglob("*") if p.is_file() and p.name not in PLUGIN_CONFIGS]
    files = [p for p in files if p.parent.name not in ("prometheus", "grafana")]  # checked as PromQL above
    files.append(REPO / "plugins/README.md")
    named = {str(p.relative_to(REPO)): mentions(p.read_text()) for p in files}
    assert named["plugins/README.md"], "the plugin reference lists the metrics plugin's families"
    for where, selectors in named.items():
        check_selectors(where, selectors, {**metrics_scrape.families, **metrics_scrape})


# --- SIGHUP: its outcome, and the admin token of the config in force ----------------------------------


def test_sighup_outcomes_and_a_new_admin_token_take_effect(mariadb, tmp_path, promtool):
    proxy = start_proxy(tmp_path, mariadb.port, admin={"token": "first-token-a1"})
    try:
        assert get(proxy.admin_port, "/metrics")[0] == 401
        before = valid_exposition(scrape(proxy, "first-token-a1"), promtool)
        loaded_at = before["replay_proxy_config_last_reload_success_timestamp_seconds"][0].value
        assert {s.labels["outcome"]: s.value for s in before["replay_proxy_config_reloads_total"]} == {"ok": 0, "rejected": 0}
        assert "replay_proxy_backend_lost_total" not in before

        original = proxy.config_path.read_text()
        changed = original.replace('token = "first-token-a1"', 'token = "second-token-b2"')
        assert changed != original
        proxy.config_path.write_text(changed + '\n[plugins]\nchain = ["metrics"]\n')
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded" in proxy.log_text(), "the reload", timeout=20, interval=0.1)

        status, _, body = get(proxy.admin_port, "/metrics", "first-token-a1")
        assert status == 401, "the token the reload replaced still opens /metrics"
        assert get(proxy.admin_port, "/status", "first-token-a1")[0] == 401
        assert get(proxy.admin_port, "/status", "second-token-b2")[0] == 200
        assert get(proxy.admin_port, "/healthz")[0] == 200  # probes need no token
        after = valid_exposition(scrape(proxy, "second-token-b2"), promtool)
        assert {s.labels["outcome"]: s.value for s in after["replay_proxy_config_reloads_total"]} == {"ok": 1, "rejected": 0}
        assert after["replay_proxy_config_last_reload_success_timestamp_seconds"][0].value > loaded_at
        assert "replay_proxy_backend_lost_total" in after  # the reloaded chain's metrics plugin, in the same exposition

        proxy.config_path.write_text(
            changed.replace('token = "second-token-b2"', 'token = "third-token-c3"') + "\n[recovery]\nbufer_window = 3\n"
        )
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reload rejected" in proxy.log_text(), "the rejection", timeout=20, interval=0.1)
        assert get(proxy.admin_port, "/metrics", "third-token-c3")[0] == 401  # a rejected file changes nothing
        rejected = valid_exposition(scrape(proxy, "second-token-b2"), promtool)
        assert {s.labels["outcome"]: s.value for s in rejected["replay_proxy_config_reloads_total"]} == {"ok": 1, "rejected": 1}
        assert rejected["replay_proxy_config_last_reload_successful"][0].value == 0
        log = proxy.log_text()
    finally:
        proxy.stop()
    assert not any(token in log for token in ("first-token-a1", "second-token-b2", "third-token-c3"))  # never logged


def test_sighup_gives_the_supervisor_of_workers_the_new_admin_token(mariadb, tmp_path):
    """--workers 2: the supervisor serves the one admin endpoint, so it too reads the new token."""
    proxy = start_proxy(tmp_path, mariadb.port, listen={"workers": 2}, admin={"token": "first-token-a1"})
    try:
        wait_for(
            lambda: get(proxy.admin_port, "/status", "first-token-a1")[0] == 200,
            "the supervisor's admin endpoint",
            timeout=20,
            interval=0.1,
        )
        original = proxy.config_path.read_text()
        proxy.config_path.write_text(original.replace('token = "first-token-a1"', 'token = "second-token-b2"'))
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: get(proxy.admin_port, "/status", "second-token-b2")[0] == 200, "the new token", timeout=20, interval=0.1)
        assert get(proxy.admin_port, "/status", "first-token-a1")[0] == 401
        log = proxy.log_text()
    finally:
        proxy.stop()
    assert "first-token-a1" not in log and "second-token-b2" not in log
