"""Upgrading the running proxy (``proxy.handover``): SIGUSR2 or ``replay-proxy upgrade`` start
a new process of the code and config on disk, which adopts the listening sockets instead of
binding; then the live sessions move, each with its client and backend connections, and the
old one drains what could not move and exits. Real processes in front of MariaDB; the session
moves on MariaDB and on TiDB.

Shown here: no connection refused while clients connect in a tight loop through three
upgrades (each connection gets a greeting, from one process or the other); a new process that
cannot start (a secret missing from its environment, a busy port) leaves the old one serving
and the command prints why; the admin token guards the upgrade; under systemd the main PID
moves (``NOTIFY_SOCKET``); with ``--workers`` every worker hands over and the supervisor
re-executes itself.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pymysql
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server
from tests.lab.mariadb import free_port
from tests.lab.procs import alive, kill_at_exit, wait_for, wait_listening
from tests.lab.proxy import REPO, write_config
from tests.lab.upgrades import Upgraded

pytestmark = pytest.mark.integration


def query_one(port: int, sql: str = "SELECT 1"):
    conn = pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test", connect_timeout=20)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchone()[0]
    finally:
        conn.close()


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=REPO, capture_output=True, text=True, timeout=150,
                          env=env)  # fmt: skip


class Knocker(threading.Thread):
    """Connects to ``port`` in a tight loop and reads the greeting, until stopped."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.stopping = threading.Event()
        self.greeted = 0
        self.refused = 0
        self.other: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=20) as conn:
                    head = _recv_exactly(conn, 4)
                    body = _recv_exactly(conn, int.from_bytes(head[:3], "little"))
                    if body[:1] == b"\x0a":  # protocol version 10: a greeting
                        self.greeted += 1
                    else:
                        self.other.append(f"not a greeting: {body[:60]!r}")
            except ConnectionRefusedError:
                self.refused += 1
            except OSError as exc:
                self.other.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def test_sigusr2_hands_the_listeners_over_and_no_connection_is_refused(mariadb, tmp_path):
    prepare_server(mariadb)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", mariadb.port, log={"level": "info"}))
    knocker = Knocker(proxy.proxy.port)
    try:
        held = pymysql.connect(host="127.0.0.1", port=proxy.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test")
        knocker.start()
        wait_for(lambda: knocker.greeted > 20, what="the knocker to get going")
        pids = [proxy.pid]
        for _ in range(3):
            pids.append(proxy.signal_upgrade())
            greeted = knocker.greeted
            wait_for(lambda: knocker.greeted > greeted + 20, what="connections served by the new process")  # noqa: B023
        knocker.stop()
        assert len(set(pids)) == 4
        assert (knocker.refused, knocker.other) == (0, []), f"{knocker.greeted} greeted"
        assert query_one(proxy.proxy.port, "SELECT 41 + 1") == 42  # the last new process serves
        # the session open before the first upgrade moved with each upgrade, connections and all
        assert proxy.handed_over()[0][3] == 1
        with held.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        text = proxy.stop()
        assert len(re.findall(r"moved to pid \d+ with its client and backend connections", text)) == 3, text[-3000:]
        assert text.count("took over from pid") == 3
        assert f"took over from pid {pids[0]}: listeners adopted: " in text
        assert "bound anew: none" in text
        print(f"\n{knocker.greeted} connections greeted, 0 refused; hand-overs took {proxy.handovers} s")
    finally:
        knocker.stop()
        proxy.stop()


def test_sessions_move_with_their_connections_and_state(db, tmp_path):
    """The backend connection moves with the session: the server sees the same connection (its
    id, a temporary table, variables, LAST_INSERT_ID(), a prepared statement under the same id).
    A session in a transaction moves in it: what it wrote before the upgrade is rolled back, or
    committed, with what it writes after. One whose statement runs past
    listen.handover_timeout is drained, with the reason in the log."""
    prepare_server(db)
    db.query("DROP TABLE IF EXISTS test.moved")
    db.query("CREATE TABLE test.moved (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    proxy = Upgraded(start_proxy(tmp_path / "proxy", db.port, log={"level": "info"}, listen={"handover_timeout": "4s"}))
    port = proxy.proxy.port

    def connect():
        return pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test", autocommit=True)

    def look(conn) -> tuple:
        with conn.cursor() as cur:
            cur.execute("SELECT CONNECTION_ID(), @x, @@session.time_zone, @@session.sql_mode, LAST_INSERT_ID(), "
                        "(SELECT COUNT(*) FROM scratch)")  # fmt: skip
            return cur.fetchone()

    def run(conn, *statements) -> None:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)

    try:
        idle, rolled_back, committed, busy = connect(), connect(), connect(), connect()
        for conn in (idle, rolled_back):
            run(conn, "SET @x = 'kept', time_zone = '+05:30', sql_mode = 'ANSI_QUOTES'", "CREATE TEMPORARY TABLE scratch (a INT)",
                "INSERT INTO scratch VALUES (1), (2)", "INSERT INTO moved (v) VALUES (1)")  # fmt: skip
        run(rolled_back, "BEGIN", "INSERT INTO moved (v) VALUES (2)")
        run(committed, "BEGIN", "INSERT INTO moved (v) VALUES (3)")
        before = {name: look(conn) for name, conn in (("idle", idle), ("rolled_back", rolled_back))}
        prepared, statement = connector_prepared(port)
        prepared_connection = _connection_id(prepared)
        sleeping = threading.Thread(target=run, args=(busy, "SELECT SLEEP(7)"))  # past the 4 s: drained
        sleeping.start()
        time.sleep(0.5)
        os.kill(proxy.pid, signal.SIGUSR2)
        wait_for(lambda: len(proxy.handed_over()) == 1, what="the hand-over")
        wait_for(lambda: len(re.findall(r"moved to pid \d+ with its client", proxy.proxy.log_text())) == 4, what="4 sessions moved")
        for name, conn in (("idle", idle), ("rolled_back", rolled_back)):
            assert look(conn) == before[name], name  # the same backend connection, in the same state
        run(rolled_back, "INSERT INTO moved (v) VALUES (20)", "ROLLBACK")  # in the new process
        run(committed, "INSERT INTO moved (v) VALUES (30)", "COMMIT")
        statement.execute("SELECT ? + 1", (41,))  # the statement prepared before the upgrade, by its id
        assert statement.fetchall() == [(42,)]
        assert _connection_id(prepared) == prepared_connection
        sleeping.join(30)
        proxy._moved(proxy.handed_over()[-1])  # the old process has exited (the busy session drained)
        with idle.cursor() as cur:
            cur.execute("SELECT v FROM moved ORDER BY v")
            assert [v for (v,) in cur.fetchall()] == [1, 1, 3, 30]  # the transaction went on across the upgrade
        wait_for(lambda: "took over 4 session(s)" in proxy.proxy.log_text(), what="the new process's count of sessions")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{proxy.proxy.admin_port}/metrics", timeout=10).read().decode()
        counted = dict(re.findall(r'^replay_proxy_upgrade_sessions_total\{outcome="(\w+)",target="test"\} (\S+)$', metrics, re.MULTILINE))
        assert counted == {"moved": "4.0", "refused": "0.0", "drained": "1.0"}, metrics[-3000:]
        text = proxy.stop()
        assert re.search(r"not moved to pid \d+ within 4s \(listen.handover_timeout\): a command is in flight; it drains here", text)
        assert "(moved from pid" in text
        prepared.close()
    finally:
        proxy.stop()


def test_a_moved_transaction_is_replayed_from_its_journal_after_a_later_loss(mariadb_factory, tmp_path):
    """The journal moves with the transaction: the server restarts after the upgrade, the
    transaction dies on it, and the new process replays it from the journal the old one kept;
    the COMMIT after lands every row once."""
    server = mariadb_factory()
    prepare_server(server)
    server.query("CREATE TABLE test.journaled (id INT PRIMARY KEY, v INT)")
    proxy = Upgraded(start_proxy(tmp_path / "proxy", server.port, log={"level": "info"}))
    try:
        conn = pymysql.connect(host="127.0.0.1", port=proxy.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
                               autocommit=True)  # fmt: skip
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO journaled VALUES (1, 10), (2, 20)")
        proxy.signal_upgrade()
        server.restart(signal.SIGTERM)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO journaled VALUES (3, 30)")  # on a new connection, after the replay
            cur.execute("COMMIT")
        assert server.query("SELECT id, v FROM test.journaled ORDER BY id") == [(1, 10), (2, 20), (3, 30)]
        text = proxy.stop()
        assert re.search(r"recovered on .* replayed 2 statement", text), text[-3000:]
    finally:
        proxy.stop()


def test_a_session_whose_backend_connection_closed_for_idling_moves_without_it(mariadb, tmp_path):
    """The server closed an idle session's connection (its wait_timeout): it moves all the same,
    with its state and without a backend connection, and the new process opens one at its next
    command, with the session's variables, as the old process would have."""
    prepare_server(mariadb)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", mariadb.port, log={"level": "info"}, listen={"handover_timeout": "5s"}))
    try:
        conn = pymysql.connect(host="127.0.0.1", port=proxy.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test")
        with conn.cursor() as cur:
            cur.execute("SET SESSION wait_timeout = 2, @x = 'kept'")
            cur.execute("SELECT CONNECTION_ID()")
            (first,) = cur.fetchone()
        wait_for(lambda: "closed after" in proxy.proxy.log_text(), what="the server closing the idle connection", timeout=20)
        proxy.signal_upgrade()
        text = proxy.proxy.log_text()
        assert re.search(r"moved to pid \d+ with its client connection \(its backend connection was closed for idling", text), text[-3000:]
        assert "upgrade: 1 session(s) moved to pid" in text
        with conn.cursor() as cur:
            cur.execute("SELECT @x, @@session.wait_timeout, CONNECTION_ID()")
            x, wait, now = cur.fetchone()
        assert (x, int(wait)) == ("kept", 2) and now != first  # a new connection, opened by the new process
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{proxy.proxy.admin_port}/metrics", timeout=10).read().decode()
        assert re.search(r'^replay_proxy_upgrade_sessions_total\{outcome="moved",target="test"\} 1\.0$', metrics, re.MULTILINE), metrics[
            -3000:
        ]
        conn.close()
    finally:
        proxy.stop()


def test_a_session_the_new_config_does_not_know_stays_and_drains(mariadb, tmp_path):
    """The new process refuses a session whose user its config no longer has: the old process
    keeps it (its backend task back on) and drains it; the other session moves."""
    prepare_server(mariadb)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", mariadb.port, log={"level": "info"}, listen={"handover_timeout": "3s"}))
    try:
        app = pymysql.connect(host="127.0.0.1", port=proxy.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test")
        root = pymysql.connect(host="127.0.0.1", port=proxy.proxy.port, user="root", password="", database="test")
        config = proxy.proxy.config_path
        config.write_text(config.read_text().replace('name = "root"', 'name = "someone_else"'))
        proxy.signal_upgrade()
        with app.cursor() as cur:
            cur.execute("SELECT 1")
            assert cur.fetchone() == (1,)
        text = proxy.proxy.log_text()
        assert re.search(r"refused the session \(user 'root' is not in this config\): it stays here and drains", text), text[-3000:]
        assert "upgrade: 1 session(s) moved to pid" in text
        with pytest.raises(pymysql.err.OperationalError):  # drained by the old process, which has exited
            with root.cursor() as cur:
                cur.execute("SELECT 1")
    finally:
        proxy.stop()


def test_a_replicator_workload_sees_nothing_of_three_upgrades(db, goclient, tmp_path):
    """DM's driver (go-sql-driver, tests/goclient), 8 pinned connections committing
    non-idempotent transactions (INSERT + counter) back to back, through three upgrades: no
    error, every row once, and every session moved (none drained, none reconnected)."""
    from tests.lab.goclient import run_goclient

    prepare_server(db)
    tables = {"table": "up_rows", "counters_table": "up_counters"}
    run_goclient("setup", port=db.port, conns=8, **tables)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", db.port, log={"level": "info"}))
    expect = tmp_path / "workload.json"
    result: dict = {}

    def load() -> None:
        result.update(run_goclient("workload", port=proxy.proxy.port, conns=8, duration=45, batch=5, sql="insert", out=expect,
                                   timeout=150, check=False, **tables))  # fmt: skip

    worker = threading.Thread(target=load, daemon=True)
    try:
        worker.start()
        time.sleep(3)
        for n in range(3):
            assert worker.is_alive(), f"the workload ended before upgrade {n + 1} (hand-overs so far: {proxy.handovers} s)"
            proxy.signal_upgrade()
            time.sleep(2)
        assert worker.is_alive(), "the workload ended during the upgrades: the last one may have had no sessions to move"
        worker.join(150)
        text = proxy.stop()
    finally:
        proxy.stop()
    assert result.get("ok") and result["error_count"] == 0, result
    assert result["committed_txns"] > 100, result
    verified = run_goclient("verify", port=db.port, expect=expect, **tables)
    assert verified["ok"] and verified["checked_rows"] == result["committed_rows"], verified
    moved = re.findall(r"upgrade: (\d+) session\(s\) moved to pid \d+, (\d+) left to drain", text)
    assert moved == [("8", "0")] * 3, moved
    assert "reconnect" not in text and "recovery" not in text, text[-3000:]
    print(f"\n{result['committed_txns']} transactions, 0 errors, through 3 upgrades; hand-overs took {proxy.handovers} s")


def connector_prepared(port: int):
    """A session with a server-side prepared statement open (mysql-connector's prepared cursor):
    (connection, cursor)."""
    import mysql.connector

    conn = mysql.connector.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test",
                                   autocommit=True, use_pure=True)  # fmt: skip
    cur = conn.cursor(prepared=True)
    cur.execute("SELECT ? + 1", (1,))
    assert cur.fetchall() == [(2,)]
    return conn, cur


def _connection_id(conn) -> int:
    """Over the text protocol: the prepared cursor would replace its statement with this one."""
    cur = conn.cursor()
    cur.execute("SELECT CONNECTION_ID()")
    return cur.fetchall()[0][0]


def test_upgrade_command_reports_a_failed_start_and_the_old_process_serves_on(mariadb, tmp_path):
    prepare_server(mariadb)
    os.environ["REPLAY_PROXY_TEST_UPGRADE_TOKEN"] = "up-token"
    try:
        proxy = Upgraded(start_proxy(tmp_path / "proxy", mariadb.port, admin={"token_env": "REPLAY_PROXY_TEST_UPGRADE_TOKEN"}))
    finally:
        del os.environ["REPLAY_PROXY_TEST_UPGRADE_TOKEN"]
    path = str(proxy.proxy.config_path)
    original = proxy.proxy.config_path.read_text()
    try:
        # The admin token guards the upgrade: the command reads it from the file's token_env.
        refused = run_cli("upgrade", "--config", path, env=dict(os.environ, REPLAY_PROXY_TEST_UPGRADE_TOKEN="wrong"))
        assert refused.returncode == 1 and "refused the request (401)" in refused.stderr, refused.stderr
        token_env = dict(os.environ, REPLAY_PROXY_TEST_UPGRADE_TOKEN="up-token")

        # A secret the proxy's environment lacks: only the new process can tell (the command
        # reads no passwords), so it fails, says why, and the old process serves on.
        proxy.proxy.config_path.write_text(original.replace('password = "apppw"', 'password_env = "REPLAY_PROXY_TEST_UNSET"'))
        failed = run_cli("upgrade", "--config", path, env=token_env)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert f"upgrade of target test failed; pid {proxy.pid} keeps serving: " in failed.stderr
        assert "REPLAY_PROXY_TEST_UNSET is not set" in failed.stderr
        assert f"upgrade failed, pid {proxy.pid} keeps serving" in proxy.proxy.log_text()
        assert alive(proxy.pid) and query_one(proxy.proxy.port) == 1

        # Port trouble: the new config moves the listener to a port something else holds.
        with socket.create_server(("127.0.0.1", 0)) as squatter:
            busy = squatter.getsockname()[1]
            proxy.proxy.config_path.write_text(original.replace(f"127.0.0.1:{proxy.proxy.port}", f"127.0.0.1:{busy}"))
            failed = run_cli("upgrade", "--config", path, env=token_env)
        assert failed.returncode == 1 and f"cannot listen on 127.0.0.1:{busy}" in failed.stderr, failed.stderr
        assert alive(proxy.pid) and query_one(proxy.proxy.port) == 1

        # The file fixed: the upgrade goes through.
        proxy.proxy.config_path.write_text(original)
        done = run_cli("upgrade", "--config", path, env=token_env)
        assert done.returncode == 0, done.stderr
        moved = re.search(r"pid (\d+) -> pid (\d+); listeners handed over: client 127.0.0.1:\d+, admin 127.0.0.1:\d+", done.stdout)
        assert moved and int(moved.group(1)) == proxy.pid, done.stdout
        assert proxy._moved(proxy.handed_over()[-1]) == int(moved.group(2))
        assert query_one(proxy.proxy.port) == 1
        # the admin endpoint came along, token and all
        again = run_cli("status", "--config", path, env=token_env)
        assert again.returncode == 0, again.stderr
        assert "did not answer" not in again.stderr
    finally:
        proxy.proxy.config_path.write_text(original)
        proxy.stop()


def test_under_systemd_the_main_pid_moves_to_the_new_process(mariadb, tmp_path, monkeypatch):
    prepare_server(mariadb)
    notify_path = str(tmp_path / "notify.sock")
    systemd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    systemd.bind(notify_path)
    systemd.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # the sender's pid, as systemd reads it
    systemd.settimeout(60)
    monkeypatch.setenv("NOTIFY_SOCKET", notify_path)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", mariadb.port))
    try:

        def notice() -> tuple[int, str]:
            data, ancillary, _, _ = systemd.recvmsg(4096, socket.CMSG_SPACE(12))
            (level, kind, creds), = ancillary  # fmt: skip
            assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS)
            return struct.unpack("iII", creds)[0], data.decode()

        old = proxy.pid
        assert notice() == (old, "READY=1")
        new = proxy.signal_upgrade()
        assert notice() == (old, f"MAINPID={new}")  # the main process names its heir first (NotifyAccess=main)
        assert notice() == (new, f"MAINPID={new}\nREADY=1")
    finally:
        systemd.close()
        proxy.stop()


def _healthz(admin: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/healthz", timeout=10) as response:
        return json.load(response)


def test_with_workers_every_worker_hands_over_and_the_supervisor_reexecutes_itself(mariadb, tmp_path):
    """``--workers 2``: SIGUSR2 to the supervisor, then ``replay-proxy upgrade``: each worker in
    turn hands its listener and sessions to a successor; the supervisor keeps its pid (systemd's
    main PID) and re-executes itself; no connection refused meanwhile; every session keeps its
    backend connection, variables, temporary table and open transaction. A config that does not
    start changes nothing. The successors (started by the workers they replaced) still die with
    a SIGKILLed supervisor."""
    prepare_server(mariadb)
    mariadb.query("DROP TABLE IF EXISTS test.w_moved")
    mariadb.query("CREATE TABLE test.w_moved (id INT PRIMARY KEY)")
    port, admin = free_port(), free_port()
    settings = {
        "name": "w", "listen": {"address": f"127.0.0.1:{port}", "workers": 2}, "log": {"level": "info"},
        "backend": {"addresses": [f"127.0.0.1:{mariadb.port}"]},
        "users": [{"name": APP_USER, "password": APP_PASSWORD}], "admin": {"address": f"127.0.0.1:{admin}"},
    }  # fmt: skip
    config = write_config(tmp_path / "proxy.toml", settings)
    log_path = tmp_path / "proxy.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config)], cwd=REPO, stdout=log, stderr=log)
    kill_at_exit(proc)
    knocker = Knocker(port)
    workers: list[int] = []
    try:
        wait_listening(proc, admin, 60, "proxy", log_path.read_text)
        wait_for(lambda: log_path.read_text().count("target w: listening on") == 2, what="both workers listening")
        conns = [pymysql.connect(host="127.0.0.1", port=port, user=APP_USER, password=APP_PASSWORD, database="test")
                 for _ in range(8)]  # fmt: skip

        def look(conn) -> tuple:
            with conn.cursor() as cur:
                cur.execute("SELECT CONNECTION_ID(), @x, (SELECT COUNT(*) FROM scratch), @@in_transaction")
                return cur.fetchone()

        for i, conn in enumerate(conns):
            with conn.cursor() as cur:
                cur.execute(f"SET @x = 'kept {i}'")
                cur.execute("CREATE TEMPORARY TABLE scratch (a INT)")
                cur.execute("INSERT INTO scratch VALUES (1)")
                cur.execute("BEGIN")
                cur.execute(f"INSERT INTO w_moved VALUES ({i})")
        before = [look(conn) for conn in conns]
        assert {b[3] for b in before} == {1}
        knocker.start()
        wait_for(lambda: knocker.greeted > 20, what="the knocker to get going")
        first = _healthz(admin)["pids"]
        proc.send_signal(signal.SIGUSR2)
        wait_for(lambda: "re-executed with the code on disk" in log_path.read_text(), what="the supervisor's re-exec")
        second = _healthz(admin)["pids"]
        assert not set(first) & set(second), (first, second)
        wait_for(lambda: not _healthz(admin)["draining_pids"], what="the old workers to exit")
        assert [look(conn) for conn in conns] == before  # the same backend connections, in the same state
        answer = run_cli("upgrade", "--config", str(config))
        assert answer.returncode == 0, answer.stderr
        assert re.search(r"worker 0: pid \d+ -> pid \d+; \d+ session\(s\) left to drain", answer.stdout), answer.stdout
        wait_for(lambda: log_path.read_text().count("re-executed with the code on disk") == 2, what="the second re-exec")
        workers = _healthz(admin)["pids"]
        assert not set(workers) & set(second)
        wait_for(lambda: not _healthz(admin)["draining_pids"], what="the old workers to exit")
        assert [look(conn) for conn in conns] == before
        # A config the new code cannot start with (a secret the proxy's environment lacks: only
        # the new processes can tell) changes nothing, and says why.
        write_config(config, {**settings, "users": [{"name": APP_USER, "password_env": "REPLAY_PROXY_TEST_UNSET"}]})
        failed = run_cli("upgrade", "--config", str(config))
        assert failed.returncode == 1 and "does not start" in failed.stderr and "REPLAY_PROXY_TEST_UNSET" in failed.stderr, failed.stderr
        assert _healthz(admin)["pids"] == workers
        knocker.stop()
        assert (knocker.refused, knocker.other) == (0, []), f"{knocker.greeted} greeted"
        for i, conn in enumerate(conns):
            with conn.cursor() as cur:
                cur.execute(f"INSERT INTO w_moved VALUES ({100 + i})")
                cur.execute("COMMIT" if i % 2 == 0 else "ROLLBACK")
            conn.close()
        rows = sorted(r for (r,) in mariadb.query("SELECT id FROM test.w_moved"))
        assert rows == sorted(x for i in range(0, 8, 2) for x in (i, 100 + i))  # each transaction went on across both upgrades
        assert proc.poll() is None
        text = log_path.read_text()
        assert len(re.findall(r"moved to pid \d+ with its client and backend connections", text)) == 16, text[-4000:]
        proc.kill()  # the supervisor dies: its workers (each started by the one before) drain and exit
        proc.wait(10)
        wait_for(lambda: not any(alive(pid) for pid in workers), what="the workers to stop with their supervisor", timeout=30)
    finally:
        knocker.stop()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        for pid in workers:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in log_path.read_text()


def test_a_worker_ignores_sigusr2(tmp_path):
    """A worker of ``--workers N`` (its supervisor would restart it) must not die of SIGUSR2."""
    port = free_port()
    config = write_config(tmp_path / "proxy.toml", {
        "name": "w", "listen": {"address": f"127.0.0.1:{port}"}, "backend": {"addresses": ["127.0.0.1:9"]},
        "users": [{"name": APP_USER, "password": APP_PASSWORD}], "admin": {"enabled": False},
    })  # fmt: skip
    log_path = Path(tmp_path / "worker.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "proxy", "--config", str(config), "--worker", "0/1", "--worker-admin",
                                 str(free_port())], cwd=REPO, stdout=log, stderr=log)  # fmt: skip
    kill_at_exit(proc)
    try:
        wait_listening(proc, port, 60, "worker", log_path.read_text)
        proc.send_signal(signal.SIGUSR2)
        wait_for(lambda: "SIGUSR2 ignored: a worker is upgraded through its supervisor" in log_path.read_text(), what="the line")
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
