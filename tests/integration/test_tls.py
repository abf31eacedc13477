"""TLS on both sides with real clients and a real MariaDB that requires TLS
(``--ssl-ca/--ssl-cert/--ssl-key --require-secure-transport=ON``): what DM's
``target-database.security`` and TiDB Cloud expect.

The proxy verifies the server (``[backend.tls] mode = "verify-ca"``) and offers TLS to its
clients (``[listen.tls]``); PyMySQL, the mariadb CLI and go-sql-driver (tests/goclient
``-tls-ca``) connect through it over TLS, verifying the proxy's certificate.

``test_select_1_throughput_with_and_without_tls`` measures what frontend TLS costs
(run with ``-s`` to see the numbers).

MariaDB only: the lab starts no tidb-server with certificates (tests/lab/tidb.py has no TLS
set-up), and what is tested here is the proxy's TLS on both sides, not the server's. The
plain-TCP suites run on both servers.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
import trio

from tests.integration.conftest import _prepare, start_proxy
from tests.lab.certs import Certs, make_certs
from tests.lab.fixtures import require
from tests.lab.goclient import go_unavailable_reason, run_goclient
from tests.lab.mariadb import MariaDB, mariadb_unavailable_reason

pytestmark = pytest.mark.integration

INSECURE = "Connections using insecure transport are prohibited while --require_secure_transport=ON."


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture(scope="module")
def tls_db(certs: Certs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MariaDB]:
    """MariaDB requiring TLS on TCP (the lab's own connections use TLS or the unix socket)."""
    require(mariadb_unavailable_reason())
    server = MariaDB(tmp_path_factory.mktemp("mariadb-tls"), tls=certs.server, require_secure_transport=True)
    server.start()
    try:
        _prepare(server)
        yield server
    finally:
        server.stop()


def listen_tls(certs: Certs, require_tls: bool = False) -> dict[str, Any]:
    return {"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key), "require": require_tls}}


def backend_tls(db: MariaDB, ca, mode: str = "verify-ca", **extra: Any) -> dict[str, Any]:
    return {"addresses": [f"127.0.0.1:{db.port}"], "tls": {"mode": mode, "ca": str(ca), **extra}}


@pytest.fixture(scope="module")
def tls_proxy(tls_db: MariaDB, certs: Certs, tmp_path_factory: pytest.TempPathFactory):
    """Frontend TLS (not required) and backend verify-ca, in front of ``tls_db``."""
    proc = start_proxy(
        tmp_path_factory.mktemp("proxy-tls"),
        tls_db.port,
        listen=listen_tls(certs),
        backend=backend_tls(tls_db, certs.ca),
        recovery={"backoff_initial": "20ms"},
    )
    try:
        yield proc
    finally:
        proc.stop()


def connect(port: int, certs: Certs | None, **kwargs: Any) -> pymysql.connections.Connection:
    # PyMySQL 2 uses TLS whenever the server offers it unless told not to.
    ssl_opts = {"ssl": {"ca": str(certs.ca)}} if certs is not None else {"ssl_disabled": True}
    args = {
        "host": "127.0.0.1",
        "port": port,
        "user": "app",
        "password": "apppw",
        "database": "test",
        "connect_timeout": 10,
        "read_timeout": 60,
        "autocommit": True,
        **ssl_opts,
        **kwargs,
    }
    return pymysql.connect(**args)


def scalar(conn, sql: str):
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchone()


def test_pymysql_over_tls_on_both_sides(tls_proxy, certs):
    conn = connect(tls_proxy.port, certs)
    try:
        assert conn._sock.version() in ("TLSv1.2", "TLSv1.3")  # client ↔ proxy
        assert scalar(conn, "SELECT 1") == (1,)
        cipher = scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")  # proxy ↔ MariaDB
        assert cipher[1], cipher
        assert scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_version'")[1].startswith("TLSv1.")
        big = "x" * (3 << 20)  # many TLS records each way
        assert scalar(conn, f"SELECT LENGTH('{big}'), RIGHT(REPEAT('ab', 1000000), 3)") == (3 << 20, "bab")
    finally:
        conn.close()


def test_plain_client_allowed_unless_required(tls_proxy, tls_db, certs, proxy_factory):
    conn = connect(tls_proxy.port, None)  # listen.tls.require = false: plain is fine
    try:
        assert scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")[1]  # the backend leg is still TLS
    finally:
        conn.close()
    strict = proxy_factory(tls_db.port, listen=listen_tls(certs, require_tls=True), backend=backend_tls(tls_db, certs.ca))
    with pytest.raises(pymysql.err.OperationalError) as info:
        connect(strict.port, None)
    assert info.value.args == (3159, INSECURE)
    conn = connect(strict.port, certs)
    conn.close()


def test_mariadb_cli_over_tls(tls_proxy, certs):
    require(None if shutil.which("mariadb") else "the mariadb CLI is not installed (Debian: mariadb-client)")
    res = subprocess.run(
        [
            "mariadb",
            "--no-defaults",
            "-h",
            "127.0.0.1",
            "-P",
            str(tls_proxy.port),
            "-u",
            "app",
            "-papppw",
            "--ssl",
            f"--ssl-ca={certs.ca}",
            "--ssl-verify-server-cert",
            "--batch",
            "test",
            "-e",
            "SELECT 40 + 2 AS answer; SHOW SESSION STATUS LIKE 'Ssl_version'; \\s",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    out = res.stdout.decode()
    assert res.returncode == 0, res.stderr.decode()
    assert "answer\n42\n" in out
    assert "Ssl_version\tTLSv1." in out
    assert "Cipher in use is" in out  # \s: the CLI's own connection (to the proxy) is TLS


def test_go_sql_driver_over_tls(tls_proxy, certs):
    require(go_unavailable_reason())
    out = run_goclient("smoke", port=tls_proxy.port, tls_ca=str(certs.ca), big_size=2 << 20)
    assert out["ok"], out["checks"]
    # The same DSN without -tls-ca against a proxy that requires TLS is refused.


def test_go_sql_driver_refused_without_tls_when_required(tls_db, certs, proxy_factory):
    require(go_unavailable_reason())
    strict = proxy_factory(tls_db.port, listen=listen_tls(certs, require_tls=True), backend=backend_tls(tls_db, certs.ca))
    run = run_goclient("smoke", port=strict.port, check=False, full=True, timeout=60)
    assert run.returncode != 0
    assert "3159" in run.describe() and "insecure transport" in run.describe()
    ok = run_goclient("smoke", port=strict.port, tls_ca=str(certs.ca), long_data=False, big_size=1024)
    assert ok["ok"], ok["checks"]


def test_backend_with_the_wrong_ca_fails_clearly(tls_db, certs, proxy_factory):
    proc = proxy_factory(
        tls_db.port, listen=listen_tls(certs), backend=backend_tls(tls_db, certs.other_ca), recovery={"buffer_window": "5s"}
    )
    started = time.monotonic()
    with pytest.raises(pymysql.err.OperationalError) as info:
        connect(proc.port, certs)
    assert time.monotonic() - started < 4  # not retried: a configuration error
    code, message = info.value.args
    assert code == 1105
    assert "certificate verify failed" in message and "verify-ca" in message, message
    deadline = time.monotonic() + 5  # the proxy logs the refusal after answering
    while "certificate verify failed" not in proc.log_text():
        assert time.monotonic() < deadline, proc.log_text()[-2000:]
        time.sleep(0.05)


@pytest.mark.parametrize("server_name, ok", [(None, True), ("localhost", True), ("db.example.com", False)])
def test_verify_identity_checks_the_name(tls_db, certs, proxy_factory, server_name, ok):
    """The certificate names localhost and 127.0.0.1; the backend address is 127.0.0.1."""
    extra = {"server_name": server_name} if server_name else {}
    proc = proxy_factory(tls_db.port, backend=backend_tls(tls_db, certs.ca, mode="verify-identity", **extra))
    if ok:
        conn = connect(proc.port, None)
        assert scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")[1]
        conn.close()
    else:
        with pytest.raises(pymysql.err.OperationalError) as info:
            connect(proc.port, None)
        assert "mismatch" in info.value.args[1] and "db.example.com" in info.value.args[1]


def test_backend_tls_off_against_a_server_requiring_it(tls_db, proxy_factory):
    proc = proxy_factory(tls_db.port)
    with pytest.raises(pymysql.err.OperationalError) as info:
        connect(proc.port, None)
    # MariaDB 10.11 answers a plain login under require_secure_transport with a plain 1045.
    assert info.value.args[0] == 1045, info.value.args


def test_required_mode_without_verification(tls_db, certs, proxy_factory):
    proc = proxy_factory(tls_db.port, backend={"addresses": [f"127.0.0.1:{tls_db.port}"], "tls": {"mode": "required"}})
    conn = connect(proc.port, None)
    assert scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")[1]
    conn.close()


def test_health_checks_log_in_over_tls_too(tls_db, certs, proxy_factory):
    """A server that refuses plain logins must not look down to the health check."""
    from tests.integration.test_operations import get
    from tests.lab.procs import wait_for

    backend = {**backend_tls(tls_db, certs.ca), "health_interval": "0.3s"}
    proc = proxy_factory(tls_db.port, backend=backend)
    wait_for(lambda: get(proc.admin_port, "/readyz")[0] == 200, "/readyz 200", timeout=15, interval=0.1)
    time.sleep(1)  # a few more checks: still up, no failed login logged
    assert get(proc.admin_port, "/readyz")[0] == 200
    assert "is down" not in proc.log_text(), proc.log_text()


async def test_tls_session_survives_a_backend_restart(tls_db, certs, tls_proxy):
    """The proxy reconnects with TLS and replays the open transaction; the client's own TLS
    connection to the proxy never notices."""
    tls_db.query("CREATE TABLE IF NOT EXISTS test.tls_restart (id INT PRIMARY KEY, v VARCHAR(20))")
    tls_db.query("DELETE FROM test.tls_restart")

    def session() -> list[tuple]:
        conn = connect(tls_proxy.port, certs, autocommit=False)
        try:
            with conn.cursor() as cur:
                before = scalar(conn, "SELECT CONNECTION_ID()")[0]  # outside the transaction: not replayed
                cur.execute("BEGIN")
                cur.execute("INSERT INTO tls_restart VALUES (1, 'before')")
                tls_db.restart()  # SIGTERM, start again on the same port
                cur.execute("INSERT INTO tls_restart VALUES (2, 'after')")
                conn.commit()
                after = scalar(conn, "SELECT CONNECTION_ID()")[0]
                assert after != before  # a new backend connection...
                assert scalar(conn, "SHOW SESSION STATUS LIKE 'Ssl_cipher'")[1]  # ...over TLS again
                assert conn._sock.version().startswith("TLSv1.")
                cur.execute("SELECT id, v FROM tls_restart ORDER BY id")
                return list(cur.fetchall())
        finally:
            conn.close()

    rows = await trio.to_thread.run_sync(session)
    assert rows == [(1, "before"), (2, "after")]
    assert tls_db.query("SELECT id, v FROM test.tls_restart ORDER BY id") == [(1, "before"), (2, "after")]
    log = tls_proxy.log_text()
    assert "replayed" in log


def _select_1_rate(port: int, certs: Certs | None, seconds: float) -> float:
    conn = connect(port, certs)
    try:
        cur = conn.cursor()
        n = 0
        deadline = time.perf_counter() + seconds
        started = time.perf_counter()
        while True:
            for _ in range(100):
                cur.execute("SELECT 1")
                cur.fetchall()
            n += 100
            now = time.perf_counter()
            if now >= deadline:
                return n / (now - started)
    finally:
        conn.close()


def test_select_1_throughput_with_and_without_tls(tls_proxy, tls_db, certs, capsys):
    """Round trips per second of ``SELECT 1`` through the proxy, client ↔ proxy plain vs TLS
    (the backend leg is TLS in both), alternated to even out noise; plus MariaDB directly
    over TLS for scale."""
    seconds = 2.0
    plain, tls = [], []
    for _ in range(2):
        plain.append(_select_1_rate(tls_proxy.port, None, seconds))
        tls.append(_select_1_rate(tls_proxy.port, certs, seconds))
    direct = _select_1_rate(tls_db.port, certs, seconds)
    p, t = max(plain), max(tls)
    with capsys.disabled():
        print(
            f"\nSELECT 1 round trips/s through the proxy (backend leg TLS): client plain {p:.0f}, "
            f"client TLS {t:.0f} ({(1 - t / p) * 100:.0f}% fewer); MariaDB directly over TLS {direct:.0f}"
        )
    assert t > 0.3 * p  # a gross regression (a scheduler round trip per record) would show here
