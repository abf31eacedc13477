"""A worker's crash (``--workers 2``, SIGKILL) loses no client (``proxy.handover.keeper``,
``takeover``): the supervisor holds each client socket and the session's state, the worker
started in the dead one's place takes them over, and each session goes on from where its
record says it stood. Real processes, the fault shim between the proxy and the server (to hold
an answer while the worker dies), on MariaDB and on TiDB.

Every case checks what the client gets and the rows afterwards: an idle session keeps its
variables and prepared statements; one idle in a transaction gets 1213 at its next statement
(its transaction died with the backend connection), and the batch retried commits once; a read
in flight is answered; a statement in flight in a transaction gets 1213; a COMMIT in flight is
settled by its commit marker; an autocommit write in flight is a connection error (1158) unless
safe mode proves it idempotent; a session with a temporary table cannot be restored (1158).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request

import mysql.connector
import pymysql
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.faultshim import FaultShim
from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server
from tests.lab.procs import wait_for

pytestmark = pytest.mark.integration


class Rig:
    """The server, the shim in front of it, the proxy with two workers behind it."""

    def __init__(self, db, shim: FaultShim, proxy) -> None:
        self.db, self.shim, self.proxy = db, shim, proxy

    def admin(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.proxy.admin_port}{path}", timeout=5) as response:
            return json.load(response)

    def connect(self, autocommit: bool = True) -> pymysql.Connection:
        return pymysql.connect(host="127.0.0.1", port=self.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
                               autocommit=autocommit, read_timeout=90)  # fmt: skip

    def worker_of(self, session_id: int) -> int:
        return next(s["worker"] for s in self.admin("/status")["sessions"] if s["id"] == session_id)

    def kill_worker(self, session_id: int) -> int:
        """SIGKILL the worker that runs ``session_id``; the log's count of takeovers before."""
        index = self.worker_of(session_id)
        before = self.proxy.log_text().count("taken over from worker pid") + self.proxy.log_text().count("which ran it, died")
        os.kill(self.admin("/healthz")["pids"][index], signal.SIGKILL)
        return before

    def wait_taken_over(self, before: int, sessions: int = 1) -> None:
        def done() -> bool:
            text = self.proxy.log_text()
            return text.count("taken over from worker pid") + text.count("which ran it, died") >= before + sessions

        wait_for(done, what="the new worker to take the sessions over", timeout=60)

    def rows(self, table: str) -> list[tuple]:
        return sorted(tuple(r) for r in self.db.query(f"SELECT * FROM test.{table}"))


@pytest.fixture
def rig(db, tmp_path):
    prepare_server(db)
    with FaultShim(db.port) as shim:
        proxy = start_proxy(tmp_path / "proxy", shim.port, listen={"workers": 2}, log={"level": "info"},
                            recovery={"commit_marker": True})  # fmt: skip
        try:
            wait_for(lambda: proxy.log_text().count("listening on") >= 2, what="both workers listening")
            yield Rig(db, shim, proxy)
        finally:
            text = proxy.stop(timeout=30)
            assert "Traceback" not in text


def _table(rig: Rig, name: str) -> str:
    rig.db.query(f"DROP TABLE IF EXISTS test.{name}")
    rig.db.query(f"CREATE TABLE test.{name} (k INT PRIMARY KEY, v VARCHAR(20))")
    return name


def _in_thread(fn) -> dict:
    """Run ``fn`` in a thread; the dict gets "result" or "error" when it ends."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except Exception as exc:  # noqa: BLE001 -- the test reads it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    out["thread"] = thread
    return out


def _held(rig: Rig, match: str, fn) -> dict:
    """Start ``fn`` (a client call) in a thread, with the server's answer to ``match`` held by
    the shim; return once it is held (the command ran on the server, its answer is in flight)."""
    rig.shim.stall(None, match=match)
    mark = rig.shim.mark()
    out = _in_thread(fn)
    assert rig.shim.wait_command(match, timeout=30, since=mark) is not None, f"{match!r} never reached the server"
    time.sleep(1)  # its answer is back at the shim, and held there
    return out


def _finish(out: dict, rig: Rig) -> object:
    rig.shim.release()
    out["thread"].join(90)
    assert not out["thread"].is_alive(), "the client still waits: a hang"
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_idle_sessions_keep_their_state_and_prepared_statements(rig):
    table = _table(rig, "tk_idle")
    conn = rig.connect()
    with conn.cursor() as cur:
        cur.execute("SET @x = 'kept', sql_mode = 'ANSI_QUOTES', time_zone = '+03:00'")
    ps = mysql.connector.connect(host="127.0.0.1", port=rig.proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
                                 autocommit=True)  # fmt: skip
    prepared = ps.cursor(prepared=True)
    prepared.execute(f"INSERT INTO {table} VALUES (?, ?)", (1, "a"))
    killed = [conn.thread_id(), ps.connection_id]
    before = rig.kill_worker(killed[0])
    t0 = time.monotonic()
    with conn.cursor() as cur:
        cur.execute("SELECT @x, @@sql_mode, @@time_zone")
        assert cur.fetchone() == ("kept", "ANSI_QUOTES", "+03:00")
    assert time.monotonic() - t0 < 30
    prepared.execute(f"INSERT INTO {table} VALUES (?, ?)", (2, "b"))  # the same statement, prepared again behind the scenes
    assert rig.rows(table) == [(1, "a"), (2, "b")]
    rig.wait_taken_over(before)
    conn.close()
    ps.close()


def test_a_transaction_idle_at_the_crash_gets_1213_and_its_retry_commits_once(rig):
    table = _table(rig, "tk_tx")
    conn = rig.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'first try')")
    before = rig.kill_worker(conn.thread_id())
    with conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as err:
        cur.execute(f"INSERT INTO {table} VALUES (2, 'first try')")
    assert err.value.args[0] == 1213, err.value
    conn.rollback()  # as DM does before it retries the batch
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'retry')")
        cur.execute(f"INSERT INTO {table} VALUES (2, 'retry')")
    conn.commit()
    assert rig.rows(table) == [(1, "retry"), (2, "retry")]
    rig.wait_taken_over(before)
    conn.close()


def test_a_read_in_flight_is_answered(rig):
    conn = rig.connect()
    out = _held(rig, "SELECT 'read in flight'", lambda: conn.cursor().execute("SELECT 'read in flight'") and None)
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    _finish(out, rig)
    with conn.cursor() as cur:
        cur.execute("SELECT 'read in flight', 2")
        assert cur.fetchone() == ("read in flight", 2)
    conn.close()


def test_a_statement_in_flight_in_a_transaction_gets_1213(rig):
    table = _table(rig, "tk_dml")
    conn = rig.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'a')")
    out = _held(rig, f"INSERT INTO {table} VALUES (2", lambda: conn.cursor().execute(f"INSERT INTO {table} VALUES (2, 'b')"))
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    with pytest.raises(pymysql.err.OperationalError) as err:
        _finish(out, rig)
    assert err.value.args[0] == 1213, err.value
    conn.rollback()
    assert rig.rows(table) == []
    conn.close()


def test_a_commit_in_flight_is_settled_by_its_commit_marker(rig):
    table = _table(rig, "tk_commit")
    conn = rig.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'a')")
        cur.execute(f"INSERT INTO {table} VALUES (2, 'b')")
    out = _held(rig, "COMMIT", conn.commit)  # the server committed; its OK is held
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    _finish(out, rig)  # OK: the marker says it committed
    assert rig.rows(table) == [(1, "a"), (2, "b")]
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (3, 'c')")
    conn.commit()
    assert rig.rows(table) == [(1, "a"), (2, "b"), (3, "c")]
    assert "commit marker" in rig.proxy.log_text()
    conn.close()


def test_a_commit_whose_marker_was_being_written_gets_1213(rig):
    """The worker dies while the marker row is written, before the COMMIT left: the
    transaction did not commit (its connection died with the worker)."""
    table = _table(rig, "tk_marker")
    conn = rig.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute(f"INSERT INTO {table} VALUES (1, 'a')")
    out = _held(rig, "INSERT INTO replay_proxy", conn.commit)
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    with pytest.raises(pymysql.err.OperationalError) as err:
        _finish(out, rig)
    assert err.value.args[0] == 1213, err.value
    conn.rollback()
    assert rig.rows(table) == []
    conn.close()


def test_an_autocommit_write_in_flight_is_a_connection_error(rig):
    """Not idempotent and no marker can tell: 1158, never a second run. The row is there once."""
    table = _table(rig, "tk_auto")
    conn = rig.connect()
    out = _held(rig, f"INSERT INTO {table}", lambda: conn.cursor().execute(f"INSERT INTO {table} VALUES (1, 'once')"))
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    with pytest.raises(pymysql.err.OperationalError) as err:
        _finish(out, rig)
    assert err.value.args[0] == 1158, err.value
    assert rig.rows(table) == [(1, "once")]


def test_a_session_with_a_temporary_table_cannot_be_restored(rig):
    conn = rig.connect()
    with conn.cursor() as cur:
        cur.execute("CREATE TEMPORARY TABLE scratch (a INT)")
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    with conn.cursor() as cur, pytest.raises(pymysql.err.OperationalError) as err:
        cur.execute("SELECT COUNT(*) FROM scratch")
    assert err.value.args[0] == 1158 and "temporary table" in err.value.args[1], err.value


def _two_workers(db, tmp_path) -> Rig:
    """The proxy with two workers straight in front of ``db`` (no shim)."""
    prepare_server(db)
    proxy = start_proxy(tmp_path / "proxy", db.port, listen={"workers": 2}, log={"level": "info"})
    wait_for(lambda: proxy.log_text().count("listening on") >= 2, what="both workers listening")
    return Rig(db, None, proxy)


def _sessions_with_variables(rig: Rig, count: int = 6) -> list[pymysql.Connection]:
    """``count`` sessions, the i-th with ``@x = i``."""
    conns = [rig.connect() for _ in range(count)]
    for i, conn in enumerate(conns):
        with conn.cursor() as cur:
            cur.execute(f"SET @x = {i}")
    return conns


def _assert_variables_kept(conns: list[pymysql.Connection]) -> None:
    for i, conn in enumerate(conns):
        with conn.cursor() as cur:
            cur.execute("SELECT @x")
            assert cur.fetchone() == (i,)


def test_after_an_upgrade_a_crash_still_loses_nothing(mariadb, tmp_path):
    """The sessions moved by an upgrade are registered by the workers that took them, and the
    supervisor that re-executed itself keeps them again (its workers register anew)."""
    rig = _two_workers(mariadb, tmp_path)
    proxy = rig.proxy
    try:
        conns = _sessions_with_variables(rig)
        proxy.proc.send_signal(signal.SIGUSR2)
        wait_for(lambda: "re-executed with the code on disk" in proxy.log_text(), what="the supervisor's re-exec")
        wait_for(lambda: not rig.admin("/healthz")["draining_pids"], what="the old workers to exit")
        wait_for(lambda: proxy.log_text().count("reached the supervisor's session keeper again") >= 2 or
                 proxy.log_text().count("lost the supervisor's session keeper") == 0, what="the workers to register again")  # fmt: skip
        time.sleep(1)
        before = rig.kill_worker(conns[0].thread_id())
        _assert_variables_kept(conns)
        rig.wait_taken_over(before)
        assert "which ran it, died" not in proxy.log_text()
        for conn in conns:
            conn.close()
    finally:
        assert "Traceback" not in proxy.stop(timeout=30)


def test_a_ddl_in_flight_is_settled_from_tidbs_job_list(rig):
    """DM's BEGIN + DDL, the worker dead while the DDL ran: its journal went with the worker,
    but the transaction wrote nothing, so TiDB's DDL job list settles it (OK, the column there
    once); MariaDB has no job list: 1158."""
    table = _table(rig, "tk_ddl")
    conn = rig.connect(autocommit=False)
    with conn.cursor() as cur:
        cur.execute("BEGIN")
    out = _held(rig, f"ALTER TABLE {table}", lambda: conn.cursor().execute(f"ALTER TABLE {table} ADD COLUMN c2 INT"))
    # The job was created well before the takeover (beyond the clocks' allowed skew): the search
    # starts when the dead worker sent the DDL, or it misses the job and runs it again (1060).
    time.sleep(3)
    before = rig.kill_worker(conn.thread_id())
    rig.wait_taken_over(before)
    if rig.db.flavor == "tidb":
        _finish(out, rig)
        columns = [r[0] for r in rig.db.query(f"SHOW COLUMNS FROM test.{table}")]
        assert columns.count(b"c2" if isinstance(columns[0], bytes) else "c2") == 1, columns
        assert "DDL job" in rig.proxy.log_text()
    else:
        with pytest.raises(pymysql.err.OperationalError) as err:
            _finish(out, rig)
        assert err.value.args[0] == 1158, err.value


_INJECTED_BUG = '''\
"""Loaded by every process of the proxy under test: a worker's SIGHUP raises in one of the
worker's own tasks (the signal forwarder), a bug outside any session."""
import signal

import proxy.cli as cli


async def _forward_signals(signals, events):
    async for signum in signals:
        if signum == signal.SIGHUP:
            raise RuntimeError("injected bug in a worker's own task")
        await events.send(signum)


cli._forward_signals = _forward_signals
'''


def test_a_bug_that_brings_a_worker_down_loses_no_client(mariadb, tmp_path, monkeypatch):
    """An exception that escapes one of a worker's own tasks (a session's costs that session
    alone) unwinds the whole worker: its sessions are left to the supervisor, not closed, and
    the worker started in its place takes them over as after a SIGKILL. (Seen: the keeper link's
    AttributeError fixed in 6b7bb78 brought workers down during upgrades, and their unwinding
    closed every client: DM paused on `invalid connection`.)"""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_INJECTED_BUG)
    monkeypatch.setenv("PYTHONPATH", str(inject))
    rig = _two_workers(mariadb, tmp_path)
    proxy = rig.proxy
    try:
        conns = _sessions_with_variables(rig)
        time.sleep(0.5)  # the keeper has every session
        index = rig.worker_of(conns[0].thread_id())
        on_it = sum(1 for s in rig.admin("/status")["sessions"] if s["worker"] == index)
        os.kill(rig.admin("/healthz")["pids"][index], signal.SIGHUP)
        wait_for(lambda: "injected bug" in proxy.log_text(), what="the worker to fail")
        _assert_variables_kept(conns)
        rig.wait_taken_over(0, sessions=on_it)
        assert proxy.log_text().count("left to the supervisor: this worker is going down") == on_it
        for conn in conns:
            conn.close()
    finally:
        text = proxy.stop(timeout=30, tracebacks=2)  # the injected one: trio's exception group around it
    assert text.count("RuntimeError: injected bug in a worker's own task") == 1
