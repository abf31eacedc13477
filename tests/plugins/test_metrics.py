"""metrics: counters and histograms from every hook, in the target's one /metrics.

The plugin's families are read as the admin endpoint builds /metrics: through the target's
``Stats`` (the proxy's families first, then each plugin's), so a family of the plugin that the
proxy also exports would show up here as a duplicate."""

from __future__ import annotations

import collections
import logging

from prometheus_client.parser import text_string_to_metric_families

from proxy import plugintest as pt
from proxy.target import Target


def exposition(h: pt.Harness) -> str:
    """/metrics as the admin endpoint serves it for a target running ``h``'s chain."""
    return Target(h.config, h.hooks).stats.render().decode()


def samples(h: pt.Harness) -> dict[tuple[str, tuple], float]:
    """/metrics parsed: {(sample name, sorted labels without target): value}; every family once."""
    families = list(text_string_to_metric_families(exposition(h)))
    twice = [name for name, n in collections.Counter(f.name for f in families).items() if n > 1]
    assert not twice, f"families exported twice: {twice}"
    out = {}
    for family in families:
        for s in family.samples:
            if s.name.startswith("replay_proxy_"):
                assert s.labels.pop("target") == "orders"
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_statements_errors_latency_and_bytes():
    h = pt.harness("metrics", target="orders")
    await h.roundtrip("INSERT INTO t VALUES (1)", pt.result(affected_rows=1, bytes=11, latency=0.002))
    await h.roundtrip("insert into t values (2)", pt.error(1062, "Duplicate entry", bytes=40, latency=0.003))
    await h.roundtrip("COMMIT", pt.result(latency=0.2))
    await h.roundtrip(pt.execute(), pt.result(bytes=100))
    m = samples(h)
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "insert"))] == 2
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "commit"))] == 1
    assert m["replay_proxy_statements_total", (("command", "COM_STMT_EXECUTE"), ("kind", ""))] == 1
    assert m["replay_proxy_errors_total", (("code", "1062"),)] == 1
    assert m["replay_proxy_bytes_total", (("direction", "response"),)] == 11 + 40 + 11 + 100  # COMMIT: default 11
    assert m["replay_proxy_bytes_total", (("direction", "request"),)] > 0
    insert = (("command", "COM_QUERY"), ("kind", "insert"))
    assert m["replay_proxy_statement_latency_seconds_count", insert] == 2
    assert abs(m["replay_proxy_statement_latency_seconds_sum", insert] - 0.005) < 1e-9
    commit_le = (("command", "COM_QUERY"), ("kind", "commit"), ("le", "0.1"))
    assert m["replay_proxy_statement_latency_seconds_bucket", commit_le] == 0  # 0.2 s is above 0.1


async def test_backend_losses_replays_and_oversized():
    h = pt.harness("metrics", target="orders")
    await h.backend_lost()
    await h.backend_recovered("resume", replayed=3, waited=1.5)
    await h.backend_recovered("resume", replayed=0, waited=0.01)
    await h.backend_recovered("fail-retryable", waited=30)
    await h.oversized(70_000_000, 67_108_864)
    m = samples(h)
    assert m["replay_proxy_backend_lost_total", ()] == 1
    assert m["replay_proxy_replays_total", ()] == 1
    assert m["replay_proxy_oversized_packets_total", ()] == 1


async def test_the_plugin_exports_only_what_the_proxy_does_not():
    """Sessions, recoveries, replayed statements, held time and process_* are the proxy's: the
    plugin has none of them (a scrape with a family twice is refused by Prometheus, and sum()
    would count recoveries twice)."""
    h = pt.harness("metrics", target="orders")
    names = {f.name for f in h.plugin.collect()}
    assert names == {
        "replay_proxy_statements", "replay_proxy_statement_latency_seconds", "replay_proxy_errors",
        "replay_proxy_plugin_answers", "replay_proxy_bytes", "replay_proxy_backend_lost", "replay_proxy_replays",
        "replay_proxy_oversized_packets",
    }  # fmt: skip
    core = {f.name for f in Target(pt.harness("firewall", deny=["DROP"]).config).stats.collect()}
    assert not names & core
    assert {"replay_proxy_sessions_open", "replay_proxy_recoveries", "replay_proxy_held_seconds",
            "replay_proxy_replayed_statements", "process_cpu_seconds"} <= core  # fmt: skip
    assert not hasattr(h.plugin, "http_routes")  # /metrics is the proxy's


async def test_plugin_answers_are_counted_when_metrics_comes_after_them():
    h = pt.chain(["firewall", "metrics"], {"firewall": {"deny": ["DROP"]}}, target="orders")
    assert pt.is_reject(await h.roundtrip("DROP TABLE t"), 1142)
    await h.roundtrip("SELECT 1", pt.result(rows=1))
    m = samples(h)
    assert m["replay_proxy_errors_total", (("code", "1142"),)] == 1
    assert m["replay_proxy_plugin_answers_total", (("plugin", "firewall"),)] == 1
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "ddl"))] == 1
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "select"))] == 1


async def test_by_command_only_and_custom_buckets():
    h = pt.harness("metrics", statement_kinds=False, latency_buckets=[0.01, 1], target="orders")
    await h.roundtrip("SELECT 1")
    await h.roundtrip("UPDATE t SET a = 1")
    m = samples(h)
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", ""))] == 2
    les = {dict(labels)["le"] for name, labels in m if name == "replay_proxy_statement_latency_seconds_bucket"}
    assert les == {"0.01", "1.0", "+Inf"}


async def test_process_metrics_option_is_obsolete(caplog):
    """process_* are the proxy's: the old option still loads, and false says it has no effect."""
    with caplog.at_level(logging.WARNING, logger="replay_proxy.plugins"):
        h = pt.harness("metrics", process_metrics=False, target="orders")
    assert "process_metrics = false has no effect: the proxy exports process_* itself" in caplog.text
    assert exposition(h).count("# TYPE process_cpu_seconds_total counter") == 1  # the proxy's, once
    caplog.clear()
    pt.harness("metrics", process_metrics=True, target="orders")
    assert "process_metrics" not in caplog.text


async def test_each_plugin_has_its_own_counters():
    a, b = pt.harness("metrics", target="orders"), pt.harness("metrics", target="orders")
    await a.roundtrip("SELECT 1")
    assert samples(a)["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "select"))] == 1
    assert ("replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "select"))) not in samples(b)


def test_bad_buckets():
    import pytest

    from proxy.config import ConfigError

    with pytest.raises(ConfigError, match=r"^\$\.plugins\.metrics\.latency_buckets: expected increasing positive"):
        pt.harness("metrics", latency_buckets=[1, 0.5])
