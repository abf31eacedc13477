"""Running it in production: probes and metrics on the admin endpoint, SIGHUP reload, planned
restarts announced by a status endpoint, failover between addresses, config hygiene.

Planned restarts are shown with two addresses that reach the same server (one directly, one
through the fault shim) and a scripted status endpoint standing in for TiDB's status port:
when it answers 500, the idle sessions move to the other address between transactions, and
the "restart" of the draining address (all its connections closed) then costs no held
request and no replay. The tests that reach a backend run on MariaDB and on TiDB (``db``).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pymysql
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.faultshim import FaultShim
from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server
from tests.lab.mariadb import free_port
from tests.lab.procs import wait_for
from tests.lab.proxy import REPO, write_config

pytestmark = pytest.mark.integration


class StatusEndpoint:
    """A scripted TiDB status port: GET /status answers ``code``."""

    def __init__(self) -> None:
        self.code = 200
        endpoint = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(endpoint.code)
                self.end_headers()
                self.wfile.write(b'{"connections": 0}')

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/status"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def connect(port: int, **kw) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test",
                           autocommit=True, **kw)  # fmt: skip


def status(proxy) -> dict:
    return json.loads(get(proxy.admin_port, "/status")[1])


def test_probes_metrics_and_status(db_factory, tmp_path):
    db = db_factory()
    proxy = start_proxy(tmp_path / "proxy", db.port, backend={"health_interval": "0.3s"})
    try:
        assert get(proxy.admin_port, "/healthz")[0] == 200
        wait_for(lambda: get(proxy.admin_port, "/readyz")[0] == 200, "/readyz 200", timeout=15, interval=0.1)
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT 1")
            body = status(proxy)
            assert [s["in_transaction"] for s in body["sessions"]] == [True] and body["sessions"][0]["user"] == APP_USER
            cur.execute("COMMIT")
        metrics = get(proxy.admin_port, "/metrics")[1].decode()
        assert 'replay_proxy_sessions_open{target="test"} 1.0' in metrics
        assert 'replay_proxy_backend_up{address="127.0.0.1:%d",target="test"} 1.0' % db.port in metrics
        table = subprocess.run([sys.executable, "-m", "proxy", "status", "--config", str(proxy.config_path)],
                               cwd=REPO, capture_output=True, text=True, timeout=30)  # fmt: skip
        assert table.returncode == 0 and "ready" in table.stdout and APP_USER in table.stdout, table.stderr
        db.stop()  # the backend goes away: not ready, still alive
        wait_for(lambda: get(proxy.admin_port, "/readyz")[0] == 503, "/readyz 503", timeout=15, interval=0.1)
        assert get(proxy.admin_port, "/healthz")[0] == 200
        db.start()
        wait_for(lambda: get(proxy.admin_port, "/readyz")[0] == 200, "/readyz 200 again", timeout=15, interval=0.1)
        conn.close()
    finally:
        proxy.stop()


def test_sighup_reloads_a_good_file_and_keeps_the_config_on_a_bad_one(db, tmp_path):
    prepare_server(db)
    proxy = start_proxy(tmp_path / "proxy", db.port)
    try:
        with pytest.raises(pymysql.err.OperationalError):
            pymysql.connect(host="127.0.0.1", port=proxy.port, user="root", password="wrong")
        original = proxy.config_path.read_text()
        # A good file: a user's proxy password changes.
        proxy.config_path.write_text(original.replace('password = "apppw"', 'password = "newpw"\nbackend_password = "apppw"'))
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reloaded" in proxy.log_text(), "reload", timeout=15, interval=0.1)
        pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password="newpw", database="test").close()
        # A bad file: rejected, the running config stays.
        proxy.config_path.write_text(original + "\n[recovery]\nbufer_window = 3\n")
        proxy.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "config reload rejected" in proxy.log_text(), "rejection", timeout=15, interval=0.1)
        assert "did you mean buffer_window" in proxy.log_text()
        pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password="newpw", database="test").close()
        assert proxy.proc.poll() is None
    finally:
        proxy.stop()


@contextlib.contextmanager
def planned_restart_lab(db, tmp_path) -> Iterator[tuple]:
    """The proxy in front of two addresses of ``db``: A through a fault shim, announcing a
    planned restart when the test sets its status endpoint's code to 500, and B directly.
    Yields (proxy, endpoint, shim, a, b)."""
    prepare_server(db)
    endpoint = StatusEndpoint()
    with FaultShim(db.port) as shim:
        a, b = f"127.0.0.1:{shim.port}", f"127.0.0.1:{db.port}"
        proxy = start_proxy(tmp_path / "proxy", [shim.port, db.port],
                            backend={"health_interval": "0.2s", "status_urls": {a: endpoint.url}})  # fmt: skip
        try:
            yield proxy, endpoint, shim, a, b
        finally:
            proxy.stop()
            endpoint.close()


def test_planned_restart_moves_idle_sessions_first(db, tmp_path):
    """Address A (through the shim) announces a restart on its status endpoint; its sessions
    move to B between transactions; then A closes every connection: nothing is held, nothing
    replayed, the client sees no error."""
    with planned_restart_lab(db, tmp_path) as (proxy, endpoint, shim, a, b):
        conns = [connect(proxy.port) for _ in range(4)]
        with conns[0].cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS planned (id INT PRIMARY KEY, v INT)")
            cur.execute("DELETE FROM planned")
        assert all(s["backend"] == a for s in status(proxy)["sessions"])
        held_before = get(proxy.admin_port, "/metrics")[1]
        tx = conns[1].cursor()
        tx.execute("BEGIN")
        tx.execute("INSERT INTO planned VALUES (1, 1)")  # a transaction open while A starts draining
        endpoint.code = 500
        wait_for(lambda: sum(s["backend"] == b for s in status(proxy)["sessions"]) == 3, "idle sessions moved", timeout=15, interval=0.1)
        tx.execute("INSERT INTO planned VALUES (2, 2)")
        tx.execute("COMMIT")  # ends the transaction: that session moves too
        wait_for(lambda: all(s["backend"] == b for s in status(proxy)["sessions"]), "all sessions moved", timeout=15, interval=0.1)
        shim.close_all()  # A restarts: nothing of ours is there any more
        for i, conn in enumerate(conns):
            with conn.cursor() as cur:
                cur.execute("INSERT INTO planned VALUES (%s, %s)", (10 + i, i))
        with conns[0].cursor() as cur:
            cur.execute("SELECT COUNT(*) FROM planned")
            assert cur.fetchone() == (6,)
        totals = status(proxy)["totals"]
        assert totals["recoveries"] == {"resumed": 0, "aborted_1213": 0, "aborted_1158": 0, "killed_1927": 0}
        assert totals["replayed_statements"] == 0
        assert b"replay_proxy_held_seconds_count" in held_before
        assert "moved from" in proxy.log_text()
        for conn in conns:
            conn.close()


def test_a_move_carries_last_insert_id_the_session_record_lost_track_of(db, tmp_path):
    """More INSERTs that give their AUTO_INCREMENT value than the session's record keeps (DM's
    own writes): the record cannot tell LAST_INSERT_ID() any more, so the move reads it on the
    old connection before it goes. The client sees the same value after the move, and the log
    has no "cannot be restored"."""
    with planned_restart_lab(db, tmp_path) as (proxy, endpoint, _shim, a, b):
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS given_ids (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
            cur.execute("DELETE FROM given_ids")
            cur.execute("INSERT INTO given_ids (id, v) VALUES (1000, 0)")
            cur.execute("INSERT INTO given_ids (v) VALUES (1)")  # generated: 1001
            for i in range(80):  # given: LAST_INSERT_ID() stays 1001
                cur.execute(f"INSERT INTO given_ids (id, v) VALUES ({2000 + i}, {i})")
            cur.execute("SELECT LAST_INSERT_ID()")
            assert cur.fetchone() == (1001,)
        assert status(proxy)["sessions"][0]["backend"] == a
        endpoint.code = 500
        wait_for(lambda: status(proxy)["sessions"][0]["backend"] == b, "the session moved", timeout=15, interval=0.1)
        with conn.cursor() as cur:
            cur.execute("SELECT LAST_INSERT_ID()")
            assert cur.fetchone() == (1001,)
        assert "moved from" in proxy.log_text()
        assert "cannot be restored" not in proxy.log_text()
        conn.close()


def test_failover_between_two_addresses_under_load(db, tmp_path):
    """The first address dies for good (its shim closed); every session recovers on the second,
    and an autocommit workload sees no error."""
    prepare_server(db)
    shim = FaultShim(db.port)
    shim.start()
    proxy = start_proxy(tmp_path / "proxy", [shim.port, db.port], backend={"health_interval": "0.3s"})
    errors: list[str] = []
    done = threading.Event()

    def work(n: int) -> None:
        conn = connect(proxy.port)
        i = 0
        while not done.is_set():
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT %s", (i,))
                    assert cur.fetchone() == (i,)
            except Exception as exc:  # noqa: BLE001
                errors.append(f"{n}: {exc!r}")
                return
            i += 1
        conn.close()

    try:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        time.sleep(1)
        shim.stop()  # address A is gone (connections closed, port closed)
        time.sleep(2)
        done.set()
        for t in threads:
            t.join(30)
        assert errors == []
        assert all(s["backend"] == f"127.0.0.1:{db.port}" for s in status(proxy)["sessions"]) or not status(proxy)["sessions"]
        assert "recovered on 127.0.0.1:%d" % db.port in proxy.log_text()
    finally:
        done.set()
        proxy.stop()


def test_two_targets_on_one_host_get_their_own_admin_ports_and_a_busy_port_is_one_line(tmp_path, mariadb):
    # MariaDB only: no SQL reaches the backend here (ports and start-up), so TiDB would add nothing
    configs = []
    for name in ("orders", "billing"):
        port = _free_with_admin()
        configs.append(write_config(tmp_path / f"{name}.toml", {
            "name": name, "listen": {"address": f"127.0.0.1:{port}"},
            "backend": {"addresses": [f"127.0.0.1:{mariadb.port}"]}, "users": [{"name": "app", "password": "apppw"}],
        }))  # fmt: skip
    procs = [subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(c)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for c in configs]  # fmt: skip
    try:
        time.sleep(3)
        # both run: admin on listen port + 10000 each
        assert [p.poll() for p in procs] == [None, None], [p.stdout.read().decode()[-2000:] for p in procs if p.poll() is not None]
        busy = subprocess.run([sys.executable, "-m", "proxy", "--config", str(configs[0])], cwd=REPO,
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert busy.returncode == 1
        errors = [line for line in busy.stderr.splitlines() if "ERROR" in line]
        assert len(errors) == 1 and "cannot listen on" in errors[0] and "orders" in errors[0], busy.stderr
        assert "Traceback" not in busy.stderr
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            p.wait(20)


def _free_with_admin() -> int:
    """A free port whose default admin port (+ 10000) is free too (CI saw a second proxy exit
    on an admin port another test's process held)."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair (port, port + 10000)")


def test_config_hygiene(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=REPO, capture_output=True, text=True, timeout=30)

    assert run("--version").stdout.startswith("replay-proxy ")
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('name = "caf\xe9"\n'.encode("latin-1"))
    out = run("--config", str(latin1), "--check")
    assert out.returncode == 2 and "not UTF-8" in out.stderr and "Traceback" not in out.stderr
    log_file = tmp_path / "queries.log"
    good = write_config(tmp_path / "good.toml", {
        "backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "x"}],
        "plugins": {"chain": ["query_log"], "query_log": {"path": str(log_file)}},
    })  # fmt: skip
    out = run("--config", str(good), "--check")
    assert out.returncode == 0 and not log_file.exists()  # --check builds no plugin
    for bad, message in [
        ({"users": [{"name": "app"}]}, "has no password"),
        ({"limits": {"max_allowed_packet": "2GiB"}}, "1KiB to 1GiB"),
        ({"recovery": {"backoff_initial": "5s"}}, "more than backoff_max"),
        ({"admin": {"address": "0.0.0.0:9999"}}, "admin.token"),
        ({"admin": {"token_env": "REPLAY_PROXY_NO_SUCH_VARIABLE"}}, "REPLAY_PROXY_NO_SUCH_VARIABLE is not set"),
        ({"backend": {"addresses": ["127.0.0.1:3306"], "helth_interval": 1}}, "did you mean health_interval"),
    ]:
        data = {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "x"}], **bad}
        out = run("--config", str(write_config(tmp_path / "bad.toml", data)), "--check")
        assert out.returncode == 2 and message in out.stderr, (bad, out.stderr)
    os.chmod(good, 0o644)


def test_admin_token_guards_everything_but_the_probes(mariadb, tmp_path):
    # MariaDB only: the admin endpoint's HTTP alone, whatever the backend
    prepare_server(mariadb)
    os.environ["REPLAY_PROXY_TEST_ADMIN_TOKEN"] = "s3cret-token"
    proxy = start_proxy(tmp_path / "proxy", mariadb.port, admin={"token_env": "REPLAY_PROXY_TEST_ADMIN_TOKEN"})
    try:
        assert get(proxy.admin_port, "/healthz")[0] == 200  # kubelet probes carry no token
        for path in ("/metrics", "/status"):
            assert get(proxy.admin_port, path)[0] == 401
            assert get(proxy.admin_port, path, token="wrong")[0] == 401
            assert get(proxy.admin_port, path, token="s3cret-token")[0] == 200
        assert "s3cret-token" not in proxy.log_text()
    finally:
        proxy.stop()
        del os.environ["REPLAY_PROXY_TEST_ADMIN_TOKEN"]


def test_idle_timeout_closes_idle_sessions_but_not_busy_ones(db, tmp_path):
    prepare_server(db)
    proxy = start_proxy(tmp_path / "proxy", db.port, listen={"idle_timeout": "1s"})
    try:
        busy = connect(proxy.port)
        with busy.cursor() as cur:
            cur.execute("SELECT SLEEP(2.5)")  # runs longer than the timeout: not idle
            assert cur.fetchone() == (0,)
        idle = connect(proxy.port)
        time.sleep(2)
        with pytest.raises(pymysql.err.OperationalError) as lost, idle.cursor() as cur:
            cur.execute("SELECT 1")
        assert lost.value.args[0] in (2006, 2013)  # the client sees its connection gone
        assert "idle for 1s (listen.idle_timeout)" in proxy.log_text()
        wait_for(lambda: status(proxy)["sessions"] == [], "sessions closed", timeout=15, interval=0.1)
    finally:
        proxy.stop()
