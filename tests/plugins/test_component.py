"""Plugins inside the real relay: client → proxy (with a chain) → scripted fake server, over trio
memory streams on the autojump clock; and /metrics served by the admin endpoint over TCP."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from proxy.admin import serve_admin
from proxy.config import Address, AdminConfig
from proxy.hooks import Hooks
from proxy.plugin_loader import load_chain
from tests.component.fakes import make_config
from tests.component.rig import Rig, make_rig  # noqa: F401 (a fixture)


@pytest.fixture
def plugin_rig(make_rig: Callable[..., Rig]) -> Callable[..., Rig]:
    """``plugin_rig(plugins, hooks=None)``: the proxy for the fake server, with the chain that
    ``plugins`` (a [plugins] table) describes (or ``hooks``)."""

    def make(plugins: dict | None = None, hooks: Hooks | None = None) -> Rig:
        config = make_config(plugins=plugins or {})
        return make_rig(config, hooks if hooks is not None else load_chain(config), peer="10.0.0.7:5000")

    return make


class Exploding:
    """Fails on statements mentioning "boom", in the command chain and when observing results."""

    def command_received(self, session, command):
        if "boom" in (command.sql or ""):
            raise RuntimeError("kaboom")
        return None

    def result_received(self, session, command, result):
        if "bang" in (command.sql or ""):
            raise ValueError("observer broke")


async def test_raising_plugin_fails_the_command_with_1105_and_the_session_continues(plugin_rig, autojump, caplog):
    rig = plugin_rig(hooks=Hooks([("exploding", Exploding())]))
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    result = await c.query("INSERT INTO t VALUES (2, 'boom')")
    assert not result.ok and result.code == 1105
    assert result.message.startswith("plugin 'exploding' failed: RuntimeError: kaboom (at plugins/test_component.py:")
    assert not any("boom" in q for q in rig.server.queries)  # never reached the server
    await c.must("SET bang = 1")  # an observer failing changes nothing for the client
    await c.must("INSERT INTO t VALUES (3, 'c')")
    await c.must("COMMIT")  # the transaction went on around the failed command
    assert rig.server.db.rows == {1: "a", 3: "c"}
    assert "plugin 'exploding' failed: RuntimeError: kaboom" in caplog.text
    assert "plugin exploding: result_received hook failed (ignored)" in caplog.text


async def test_firewall_rewrite_metrics_chain(plugin_rig, autojump):
    rig = plugin_rig(
        {
            "chain": ["firewall", "rewrite", "metrics"],
            "firewall": {"deny": ["DROP", "TRUNCATE"]},
            "rewrite": {"rules": [{"pattern": r"(?i)^INSERT INTO", "replace": "REPLACE INTO", "tables": ["t"]}]},
            "metrics": {"process_metrics": False},
        },
    )
    c = await rig.client()
    await c.must("BEGIN")
    result = await c.query("DROP TABLE t")
    assert result.code == 1142
    assert result.message == "DROP command denied to user 'app'@'10.0.0.7' by replay-proxy firewall (target fake, rule: deny)"
    await c.must("INSERT INTO t VALUES (1, 'a')")
    await c.must("INSERT INTO t VALUES (1, 'b')")  # a REPLACE: overwrites instead of a duplicate key
    await c.must("COMMIT")
    assert rig.server.db.rows == {1: "b"}
    assert "REPLACE INTO t VALUES (1, 'b')" in rig.server.queries
    assert not any(q.startswith("DROP") for q in rig.server.queries)

    body = rig.proxy.target.stats.render()  # /metrics: the proxy's families and the plugin's
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
    assert values["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "replace"), ("target", "fake"))] == 2
    assert values["replay_proxy_statements_total", (("command", "COM_QUERY"), ("kind", "ddl"), ("target", "fake"))] == 1
    assert values["replay_proxy_errors_total", (("code", "1142"), ("target", "fake"))] == 1
    assert values["replay_proxy_sessions_open", (("target", "fake"),)] == 1
    assert values["replay_proxy_bytes_total", (("direction", "response"), ("target", "fake"))] > 0


async def test_metrics_count_a_recovery(plugin_rig, autojump):
    rig = plugin_rig({"chain": ["metrics"], "metrics": {"process_metrics": False}})
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.live()[-1].close()  # the backend goes away while the client is idle in its transaction
    await trio.sleep(0.01)
    await c.must("COMMIT")
    body = rig.proxy.target.stats.render().decode()
    assert 'replay_proxy_recoveries_total{outcome="resumed",target="fake"} 1.0' in body
    assert 'replay_proxy_replayed_statements_total{target="fake"} 2.0' in body  # BEGIN + INSERT
    assert 'replay_proxy_backend_lost_total{target="fake"} 1.0' in body


async def test_admin_endpoint_serves_metrics(nursery, plugin_rig):
    rig = plugin_rig({"chain": ["metrics"]})
    config = attrs.evolve(rig.config, admin=AdminConfig(Address("127.0.0.1", 0)))
    host, port = await nursery.start(serve_admin, config, rig.hooks, rig.proxy)

    async def get(path: str) -> bytes:
        async with await trio.open_tcp_stream(host, port) as stream:
            await stream.send_all(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            data = b""
            while chunk := await stream.receive_some(65536):
                data += chunk
            return data

    response = await get("/metrics")
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200 OK") and b"Content-Type: text/plain; version=0.0.4" in head
    assert b"# TYPE replay_proxy_statements_total counter" in body and b"process_cpu_seconds_total" in body
    assert (await get("/health")).startswith(b"HTTP/1.0 200 OK")
