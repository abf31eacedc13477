"""What only TiDB does, on a real tidb-server (unistore), directly and through the proxy.

- A graceful shutdown (pkg/server/server.go): /status answers 500 during
  ``graceful-wait-before-shutdown``; then a command arriving outside a transaction is read and
  dropped without an answer (DM's ``begin: invalid connection``), while a session inside a
  transaction may finish it (up to 15 s) and is closed after its COMMIT's answer.
- ``tidb_txn_mode='optimistic'``: a duplicate key surfaces at COMMIT (1062), a write conflict
  as 9007; through the proxy the client sees the same codes and keeps a usable session.
- ``tidb_*`` session variables are restored on the new connection after a restart.

Skipped, with one line, when no tidb-server binary is at hand (tests/lab/tidb.py).
"""

from __future__ import annotations

import threading
import time

import pymysql
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.fixtures import APP_PASSWORD, APP_USER
from tests.lab.procs import wait_for

pytestmark = pytest.mark.integration


def connect(port: int, **kw) -> pymysql.Connection:
    kw.setdefault("read_timeout", 60)
    return pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test",
                           autocommit=True, connect_timeout=10, **kw)  # fmt: skip


def scalar(conn: pymysql.Connection, sql: str):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()[0]


def stop_in_background(server) -> threading.Thread:
    """SIGTERM the server and wait for it to exit, in a thread (a graceful stop takes seconds)."""
    thread = threading.Thread(target=server.stop, daemon=True)
    thread.start()
    return thread


def test_status_answers_500_during_graceful_wait_and_the_proxy_sees_it(tidb_factory, tmp_path):
    db = tidb_factory(graceful_wait=3)
    proxy = start_proxy(tmp_path / "proxy", db.port,
                        backend={"status_port": db.status_port, "health_interval": "0.2s"})  # fmt: skip
    try:
        client = connect(proxy.port)
        assert db.status() == 200
        stopping = stop_in_background(db)
        wait_for(lambda: db.status() == 500, "TiDB's /status to answer 500", timeout=3)
        wait_for(lambda: "is draining" in proxy.log_text(), "the proxy to mark the address draining", timeout=3)
        # Still serving during the graceful wait: the client's query runs on the same TiDB.
        assert scalar(client, "SELECT 1") == 1
        # One address: nowhere to move to (a new connection would reach the same draining TiDB).
        assert "no other address is usable" in proxy.log_text() and "moved from" not in proxy.log_text()
        stopping.join(60)
        db.start()
        assert scalar(client, "SELECT 2") == 2  # reconnected behind the client's back
        client.close()
    finally:
        proxy.stop()


def test_a_command_in_shutdown_mode_is_dropped_directly_and_recovered_through_the_proxy(tidb_factory, tmp_path):
    """A transaction keeps TiDB draining (up to 15 s); an idle session's START TRANSACTION sent
    then is read and dropped: directly an error, through the proxy held until TiDB is back."""
    db = tidb_factory()
    proxy = start_proxy(tmp_path / "proxy", db.port, recovery={"buffer_window": "40s"})
    try:
        setup = connect(db.port)
        with setup.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS drained (id INT PRIMARY KEY, who VARCHAR(16))")
            cur.execute("DELETE FROM drained")
        setup.close()
        direct_idle, proxied_idle = connect(db.port), connect(proxy.port)
        holder = connect(db.port)  # inside a transaction: TiDB waits for it
        with holder.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO drained VALUES (1, 'holder')")
        stopping = stop_in_background(db)
        wait_for(lambda: _refuses_connections(db.port), "TiDB to close its listener", timeout=10)

        with pytest.raises(pymysql.err.OperationalError) as direct_error:
            with direct_idle.cursor() as cur:
                cur.execute("START TRANSACTION")
        assert direct_error.value.args[0] in (2013, 2006), direct_error.value

        result: dict[str, object] = {}

        def proxied_transaction() -> None:
            try:
                with proxied_idle.cursor() as cur:
                    cur.execute("START TRANSACTION")
                    cur.execute("INSERT INTO drained VALUES (2, 'proxied')")
                    cur.execute("COMMIT")
                result["ok"] = True
            except Exception as exc:  # reported below
                result["error"] = exc

        client = threading.Thread(target=proxied_transaction, daemon=True)
        client.start()
        time.sleep(0.5)
        with holder.cursor() as cur:
            cur.execute("COMMIT")  # the draining TiDB lets it finish
        stopping.join(60)
        db.start()
        client.join(45)
        assert result == {"ok": True}, result
        check = connect(db.port)
        assert sorted(_rows(check, "SELECT id, who FROM drained")) == [(1, "holder"), (2, "proxied")]
        check.close()
    finally:
        proxy.stop()


def _refuses_connections(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return False
    except OSError:
        return True


def _rows(conn: pymysql.Connection, sql: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(r) for r in cur.fetchall()]


@pytest.mark.parametrize("through_proxy", [False, True], ids=["direct", "proxy"])
def test_optimistic_errors_arrive_at_commit_and_leave_the_session_usable(tidb, proxy_factory, through_proxy):
    port = proxy_factory(tidb.port).port if through_proxy else tidb.port
    a, b = connect(port), connect(port)
    with a.cursor() as cur:
        cur.execute("CREATE TABLE IF NOT EXISTS optimistic (id INT PRIMARY KEY, v INT)")
        cur.execute("DELETE FROM optimistic")
        cur.execute("INSERT INTO optimistic VALUES (1, 0)")
    for conn in (a, b):
        with conn.cursor() as cur:
            cur.execute("SET tidb_txn_mode = 'optimistic'")
    # A duplicate key: optimistic mode checks it lazily, the INSERT succeeds, the COMMIT fails.
    with b.cursor() as cb:
        cb.execute("BEGIN")
        cb.execute("INSERT INTO optimistic VALUES (1, 2)")
        with pytest.raises(pymysql.err.IntegrityError) as dup:
            cb.execute("COMMIT")
        assert dup.value.args[0] == 1062
        cb.execute("INSERT INTO optimistic VALUES (2, 1)")
    # A write conflict: 9007 at COMMIT (DM retries it).
    with a.cursor() as ca, b.cursor() as cb:
        ca.execute("BEGIN")
        cb.execute("BEGIN")
        ca.execute("UPDATE optimistic SET v = 10 WHERE id = 1")
        cb.execute("UPDATE optimistic SET v = 20 WHERE id = 1")
        ca.execute("COMMIT")
        with pytest.raises(pymysql.err.MySQLError) as conflict:
            cb.execute("COMMIT")
        assert conflict.value.args[0] == 9007, conflict.value
    # Both sessions go on, outside any transaction.
    assert _rows(b, "SELECT id, v FROM optimistic ORDER BY id") == [(1, 10), (2, 1)]
    assert scalar(b, "SELECT @@tidb_txn_mode") == "optimistic"
    a.close()
    b.close()


def test_tidb_session_variables_are_restored_after_a_restart(tidb_factory, tmp_path):
    db = tidb_factory()
    proxy = start_proxy(tmp_path / "proxy", db.port)
    try:
        client = connect(proxy.port)
        values = {
            "tidb_txn_mode": "optimistic",
            "tidb_isolation_read_engines": "tikv,tidb",
            "tidb_distsql_scan_concurrency": "7",
            "tidb_constraint_check_in_place": "1",
            "time_zone": "+05:00",
        }
        with client.cursor() as cur:
            cur.execute("SET " + ", ".join(f"{k} = '{v}'" for k, v in values.items()))
        before = scalar(client, "SELECT CONNECTION_ID()")
        db.restart()
        after = {k: str(scalar(client, f"SELECT @@{k}")) for k in values}
        assert after == values
        assert scalar(client, "SELECT CONNECTION_ID()") != before  # a new TiDB connection
        client.close()
    finally:
        proxy.stop()


def test_dms_ddl_status_queries_keep_the_session_restorable(tidb_factory, tmp_path):
    # DM asks these after a DDL lost its connection (dm/syncer/util.go getDDLStatusFromTiDB);
    # read as unknown they made the session unrestorable, and the next restart paused the task.
    db = tidb_factory()
    proxy = start_proxy(tmp_path / "proxy", db.port)
    try:
        client = connect(proxy.port)
        with client.cursor() as cur:
            cur.execute("CREATE TABLE admin_reads (id INT PRIMARY KEY)")
            cur.execute("SET @worker = 7, tidb_txn_mode = 'optimistic'")
            cur.execute("BEGIN")
            cur.execute("INSERT INTO admin_reads VALUES (1)")
            for sql in ("ADMIN SHOW DDL JOBS 10", "ADMIN SHOW DDL JOB QUERIES LIMIT 10 OFFSET 0", "ADMIN CHECK TABLE admin_reads"):
                cur.execute(sql)
                cur.fetchall()
                assert client.server_status & 1, f"{sql} ended the transaction"
            cur.execute("ROLLBACK")
        before = scalar(client, "SELECT CONNECTION_ID()")
        db.restart()
        assert scalar(client, "SELECT @worker") == 7
        assert scalar(client, "SELECT @@tidb_txn_mode") == "optimistic"
        assert scalar(client, "SELECT COUNT(*) FROM admin_reads") == 0
        assert scalar(client, "SELECT CONNECTION_ID()") != before
        client.close()
    finally:
        proxy.stop()
