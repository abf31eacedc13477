"""The proxy's own errors reach every real client as the errors they are: code, SQLSTATE and
message as the client library reports them (server-range codes only: libmariadb clients turn
a client-range code in an ERR packet into "2027 Malformed packet").

The proxy sits behind the fault shim, which drops the answer to one autocommit INSERT: the
server ran it, the proxy cannot know, so it answers 1158 and ends the session — what DM sees
when the proxy is not sure. On MariaDB and on TiDB (``db``). The backend-down case needs no
server at all.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from tests.integration.clients import CLIENTS, ClientUnavailable, run_ops
from tests.lab.faultshim import FaultShim
from tests.lab.fixtures import prepare_server, require
from tests.lab.goclient import run_goclient

pytestmark = pytest.mark.integration

LOST = "Lost connection to backend 127.0.0.1:<port> during query (replay-proxy: "


@pytest.fixture(scope="module")
def shim(db):
    prepare_server(db)
    db.query("CREATE TABLE IF NOT EXISTS test.proxy_err (id INT PRIMARY KEY)")
    with FaultShim(db.port) as shim:
        yield shim


@pytest.fixture(scope="module")
def shimmed_proxy(shim, db, tmp_path_factory):
    from tests.integration.conftest import running_proxy

    with running_proxy(tmp_path_factory.mktemp("proxy-errors"), shim.port) as proc:
        yield proc


def lost_answer(shim: FaultShim, db, row: int):
    db.query(f"DELETE FROM test.proxy_err WHERE id = {row}")
    return shim.drop_answer(match=f"INSERT INTO proxy_err VALUES ({row})")


def applied_once(db, row: int) -> bool:
    return db.query(f"SELECT COUNT(*) FROM test.proxy_err WHERE id = {row}") == [(1,)]


@pytest.mark.parametrize("client", CLIENTS)
def test_python_clients_see_1158(client, shim, shimmed_proxy, db):
    row = 10 + CLIENTS.index(client)
    rule = lost_answer(shim, db, row)
    ops = [("connect", "c", {}), ("sql", "c", f"INSERT INTO proxy_err VALUES ({row})"), ("sql", "c", "SELECT 1")]
    try:
        results = run_ops(client, shimmed_proxy.port, ops)
    except ClientUnavailable as exc:
        require(str(exc))
        raise
    assert shim.wait_applied(rule, 5)
    kind, code, sqlstate, message = results[1]
    assert (kind, code) == ("error", 1158), results
    assert sqlstate in (None, "08S01"), results  # PyMySQL and mysqlclient do not expose it
    port = str(shim.port)
    assert message.replace(port, "<port>").startswith(LOST), results
    assert results[2][0] == "error", results  # the session ended: the next statement finds it gone
    assert applied_once(db, row)


def test_mariadb_cli_sees_1158(shim, shimmed_proxy, db):
    require(None if shutil.which("mariadb") else "the mariadb CLI is not installed (Debian: mariadb-client)")
    row = 30
    rule = lost_answer(shim, db, row)
    proc = subprocess.run(
        ["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(shimmed_proxy.port), "-u", "app", "-papppw",
         "test", "-e", f"INSERT INTO proxy_err VALUES ({row})"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert shim.wait_applied(rule, 5)
    assert proc.returncode == 1
    assert (f"ERROR 1158 (08S01) at line 1: {LOST}".replace("<port>", str(shim.port))) in proc.stderr, proc.stderr
    assert applied_once(db, row)


def test_go_sql_driver_sees_1158(shim, shimmed_proxy, db):
    """DM's driver parses the ERR into a *mysql.MySQLError (what DM's retry logic reads)."""
    row = 31
    rule = lost_answer(shim, db, row)
    out = run_goclient("exec", port=shimmed_proxy.port, exec=[f"INSERT INTO proxy_err VALUES ({row})", "SELECT 1"],
                       session="none", timeout=120)  # fmt: skip
    assert shim.wait_applied(rule, 5)
    first, second = out["results"]
    assert (first.get("error_number"), first.get("sqlstate")) == (1158, "08S01"), out
    assert first["message"].startswith(LOST.replace("<port>", str(shim.port))), out
    assert second.get("error") and "error_number" not in second, out  # the session ended: a driver error
    assert applied_once(db, row)


@pytest.fixture(scope="module")
def proxy_backend_down(tmp_path_factory):
    """A proxy whose backend has never been up since it started (nothing listens there)."""
    from tests.lab.mariadb import free_port
    from tests.lab.proxy import ProxyProcess

    proc = ProxyProcess(tmp_path_factory.mktemp("proxy-down"), free_port(), recovery={"buffer_window": "2s"}).start()
    try:
        yield proc
    finally:
        proc.stop()


def mariadb_cli(port: int, password: str) -> tuple[subprocess.CompletedProcess, float]:
    require(None if shutil.which("mariadb") else "the mariadb CLI is not installed (Debian: mariadb-client)")
    started = time.monotonic()
    proc = subprocess.run(["mariadb", "--no-defaults", "-h", "127.0.0.1", "-P", str(port), "-u", "app", f"-p{password}",
                           "-e", "SELECT 1"], capture_output=True, text=True, timeout=60)  # fmt: skip
    return proc, time.monotonic() - started


def test_mariadb_cli_while_the_backend_is_down(proxy_backend_down):
    """The stock client (ssl on by default) gets plain answers: 1045 at once for a wrong
    password, 1105 after the buffer window for a right one, and no word of a TLS handshake
    (an ERR in place of the greeting was "Received error packet before completion of TLS
    handshake. The authenticity of the following error cannot be verified: 1105 ...")."""
    wrong, took = mariadb_cli(proxy_backend_down.port, "wrong")
    assert wrong.returncode == 1 and wrong.stderr.startswith("ERROR 1045 (28000): Access denied for user 'app'"), wrong.stderr
    assert took < 1.5
    right, took = mariadb_cli(proxy_backend_down.port, "apppw")
    assert right.returncode == 1, right.stderr
    assert right.stderr.startswith("ERROR 1105 (HY000): Can't connect to backend through replay-proxy (tried for 2s"), right.stderr
    assert "connect again once the backend is up" in right.stderr and "TLS" not in right.stderr, right.stderr
    assert 1.8 <= took < 5
