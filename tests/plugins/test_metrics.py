"""metrics: counters and histograms from every hook, Prometheus text on /metrics."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from proxy import plugintest as pt


def samples(h: pt.Harness) -> dict[tuple[str, tuple], float]:
    """/metrics parsed: {(sample name, sorted labels without target): value}."""
    status, content_type, body = h.get("/metrics")
    assert status == 200 and content_type.startswith("text/plain; version=0.0.4")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
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


async def test_sessions_recoveries_replays_and_oversized():
    h = pt.harness("metrics", target="orders")
    first, second = h.new_session(), h.new_session()
    await h.open(first)
    await h.open(second)
    await h.close(first)
    await h.backend_lost()
    await h.backend_recovered("resume", replayed=3, waited=1.5)
    await h.backend_recovered("resume", replayed=0, waited=0.01)
    await h.backend_recovered("fail-retryable", waited=30)
    await h.oversized(70_000_000, 67_108_864)
    m = samples(h)
    assert m["replay_proxy_sessions", ()] == 1
    assert m["replay_proxy_backend_lost_total", ()] == 1
    assert m["replay_proxy_recoveries_total", (("plan", "resume"),)] == 2
    assert m["replay_proxy_recoveries_total", (("plan", "fail-retryable"),)] == 1
    assert m["replay_proxy_recoveries_total", (("plan", "fail-connection"),)] == 0  # present from the start
    assert m["replay_proxy_replays_total", ()] == 1
    assert m["replay_proxy_replayed_statements_total", ()] == 3
    assert m["replay_proxy_buffered_wait_seconds_count", ()] == 3
    assert m["replay_proxy_buffered_wait_seconds_bucket", (("le", "2.5"),)] == 2
    assert m["replay_proxy_oversized_packets_total", ()] == 1


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
    h = pt.harness("metrics", statement_kinds=False, latency_buckets=[0.01, 1], process_metrics=False, target="orders")
    await h.roundtrip("SELECT 1")
    await h.roundtrip("UPDATE t SET a = 1")
    m = samples(h)
    assert m["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", ""))] == 2
    les = {dict(labels)["le"] for name, labels in m if name == "replay_proxy_statement_latency_seconds_bucket"}
    assert les == {"0.01", "1.0", "+Inf"}
    assert b"process_cpu_seconds_total" not in h.get("/metrics")[2]


def test_each_plugin_has_its_own_registry():
    a, b = pt.harness("metrics", target="orders"), pt.harness("metrics", target="orders")
    pt.run(a.roundtrip, "SELECT 1")
    assert samples(a)["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "select"))] == 1
    assert ("replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "select"))) not in samples(b)


def test_bad_buckets():
    import pytest

    from proxy.config import ConfigError

    with pytest.raises(ConfigError, match=r"^\$\.plugins\.metrics\.latency_buckets: expected increasing positive"):
        pt.harness("metrics", latency_buckets=[1, 0.5])
