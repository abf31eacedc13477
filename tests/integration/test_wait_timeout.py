"""The server closes an idle session after its ``wait_timeout``, on MariaDB and on tidb-server:
through the proxy the client's next command finds its session as it left it (its variables,
its prepared statement), on a new backend connection, with no error; directly the client gets
the server's close. A ``wait_timeout`` the client set itself is restored too, so the proxy's
backend connection keeps being closed while the client stays idle: it reconnects lazily, at
the client's next command, not in a loop."""

from __future__ import annotations

import time

import pymysql
import pytest

from tests.lab import rawps
from tests.lab.proxy import ProxyProcess

pytestmark = [pytest.mark.integration]

WAIT = 3  # seconds of wait_timeout
IDLE = 3 * WAIT + 2


def connect(port: int, **kw) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test", autocommit=True, **kw)


@pytest.mark.parametrize("where", ["global", "session"])
def test_a_session_closed_by_wait_timeout_is_there_at_the_next_command(db_factory, tmp_path, where):
    server = db_factory()
    root = connect(server.port)
    if where == "global":
        with root.cursor() as cur:
            cur.execute(f"SET GLOBAL wait_timeout = {WAIT}")
    proxy = ProxyProcess(tmp_path / "proxy", server.port, log={"level": "info"}).start()
    try:
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            if where == "session":
                cur.execute(f"SET SESSION wait_timeout = {WAIT}")
            cur.execute("SET @kept = 'yes'")
            cur.execute("SELECT CONNECTION_ID()")
            first = cur.fetchone()[0]
        stmt = rawps.prepare(conn, "SELECT ? + 1")
        time.sleep(IDLE)
        with conn.cursor() as cur:
            cur.execute("SELECT @kept, @@session.wait_timeout, CONNECTION_ID()")
            kept, wait, after = cur.fetchone()
        rawps.execute(conn, stmt, [41])  # its statement id still works (an ERR raises)
        conn.close()
    finally:
        log = proxy.stop()
        if where == "global":
            with root.cursor() as cur:
                cur.execute("SET GLOBAL wait_timeout = 28800")
        root.close()
    reconnects = log.count("reconnected") + log.count("recovered on")
    print(f"{server.flavor}, wait_timeout {where}: session {first} -> {after}; recoveries logged: {reconnects}")
    assert kept == "yes" and int(wait) == WAIT and after != first
    # The backend connection was closed about IDLE / WAIT times while the client was idle: it
    # is replaced once, when the client came back, not each time.
    assert 1 <= reconnects <= 2, reconnects


def test_directly_the_client_gets_the_close(db_factory):
    """The contrast: the same idle session, connected directly, loses its connection."""
    server = db_factory()
    conn = connect(server.port)
    with conn.cursor() as cur:
        cur.execute(f"SET SESSION wait_timeout = {WAIT}")
    time.sleep(WAIT + 2)
    with pytest.raises(pymysql.err.OperationalError) as lost, conn.cursor() as cur:
        cur.execute("SELECT 1")
    assert lost.value.args[0] in (2006, 2013, 4031), lost.value.args
