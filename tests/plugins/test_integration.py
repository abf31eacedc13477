"""End to end: the proxy process with a firewall → rewrite → metrics chain in front of a real
MariaDB, driven by PyMySQL; /metrics fetched over HTTP from the admin endpoint."""

from __future__ import annotations

import urllib.request

import pymysql
import pytest

from tests.lab.fixtures import APP_PASSWORD, APP_USER
from tests.lab.proxy import ProxyProcess

pytestmark = pytest.mark.integration

TABLE = "plugin_e2e_items"

# The lab's config writer has no inline tables: the rewrite rules are appended as TOML.
REWRITE_RULES = f"""
[[plugins.rewrite.rules]]
pattern = '(?i)^\\s*INSERT\\s+INTO\\b'
replace = 'REPLACE INTO'
unless = '(?i)\\bON\\s+DUPLICATE\\s+KEY\\s+UPDATE\\b'
tables = ["{TABLE}"]
"""


@pytest.fixture
def chain_proxy(mariadb, tmp_path):
    mariadb.create_user(APP_USER, APP_PASSWORD)
    mariadb.create_database("test")
    mariadb.query(f"CREATE OR REPLACE TABLE test.{TABLE} (id INT PRIMARY KEY, v VARCHAR(20))")
    proc = ProxyProcess(
        tmp_path,
        mariadb.port,
        plugins={"chain": ["firewall", "rewrite", "metrics"], "firewall": {"deny": ["DROP", "TRUNCATE"]}},
    )
    with proc.config_path.open("a") as f:
        f.write(REWRITE_RULES)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        mariadb.query(f"DROP TABLE IF EXISTS test.{TABLE}")


def metrics(proc: ProxyProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{proc.admin_port}/metrics", timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_firewall_rewrite_metrics_chain(chain_proxy, mariadb):
    conn = pymysql.connect(
        host="127.0.0.1", port=chain_proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
        autocommit=True, connect_timeout=10, read_timeout=30,
    )  # fmt: skip
    try:
        with conn.cursor() as cur:
            with pytest.raises(pymysql.MySQLError) as info:
                cur.execute(f"DROP TABLE {TABLE}")
            code, message = info.value.args
            assert code == 1142
            assert message.startswith("DROP command denied to user 'app'@'127.0.0.1' by replay-proxy firewall (target test")
            with pytest.raises(pymysql.MySQLError) as info:
                cur.execute(f"/*!40000 TRUNCATE */ TABLE {TABLE}")
            assert info.value.args[0] == 1142

            # The session is still usable, and the INSERTs land as REPLACEs: no duplicate key.
            cur.execute(f"INSERT INTO {TABLE} VALUES (1, 'first')")
            cur.execute(f"INSERT INTO {TABLE} VALUES (1, 'second')")
            assert cur.rowcount == 2  # REPLACE's count: one row deleted, one inserted
            cur.execute("BEGIN")
            cur.execute(f"INSERT INTO {TABLE} VALUES (2, 'in tx')")
            cur.execute("COMMIT")
            cur.execute(f"SELECT id, v FROM {TABLE} ORDER BY id")
            assert cur.fetchall() == ((1, "second"), (2, "in tx"))
    finally:
        conn.close()
    assert mariadb.query(f"SELECT id, v FROM test.{TABLE} ORDER BY id") == [(1, "second"), (2, "in tx")]

    text = metrics(chain_proxy)
    assert 'replay_proxy_statements_total{command="COM_QUERY",kind="replace",target="test"} 3.0' in text
    assert 'replay_proxy_errors_total{code="1142",target="test"} 2.0' in text
    assert 'replay_proxy_plugin_answers_total{plugin="firewall",target="test"} 2.0' in text
    assert 'replay_proxy_recoveries_total{outcome="resumed",target="test"} 0.0' in text
    assert "# TYPE replay_proxy_statement_latency_seconds histogram" in text
