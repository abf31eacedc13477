"""Chaos with Python clients: pinned connections that set session state once, then run
non-idempotent transactions (INSERT + `n = n + 1`) while the server restarts (MariaDB: SIGKILL
and SIGTERM in turn; TiDB: SIGTERM, its graceful shutdown -- unistore loses acknowledged writes on
SIGKILL --, with DM's tidb_txn_mode='optimistic' in the session). PyMySQL speaks the text
protocol; mysql-connector's prepared cursor sends every statement as COM_STMT_PREPARE / EXECUTE
(the statements are prepared again on every new backend connection). After every transaction
each worker checks that its session variables survived; at the end every row and counter is
verified."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter

import pymysql
import pytest

from tests.lab.chaos import CHAOS_GRACE_S, chaos_problems, corrupt_tables, recoveries, server_log_tail, start_chaos_proxy, tidb_backend

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

WORKERS = 4
DURATION = 20.0
INTERVAL = 4.0
SESSION = {"sql_mode": "STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION", "time_zone": "+05:30", "wait_timeout": 7777}


def _text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def _connect(client: str, port: int):
    """(connection, cursor, the client's error class): PyMySQL, or mysql-connector's prepared cursor."""
    if client == "pymysql":
        conn = pymysql.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test",
                               autocommit=True, read_timeout=120)  # fmt: skip
        return conn, conn.cursor(), pymysql.MySQLError
    import mysql.connector

    conn = mysql.connector.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test",
                                   autocommit=True, use_pure=True, connection_timeout=120)  # fmt: skip
    return conn, conn.cursor(prepared=True), mysql.connector.Error


class Worker(threading.Thread):
    def __init__(self, index: int, port: int, stop: threading.Event, session: dict, client: str) -> None:
        self.phase = "connect"  # what it waits for (a stuck worker says where)
        super().__init__(daemon=True)
        self.index = index
        self.port = port
        self.stop = stop
        self.session = session
        self.client = client
        self.committed: list[int] = []
        self.errors: list[str] = []
        self.session_checks = 0

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # a worker that dies must fail the test, not vanish
            self.errors.append(f"worker crashed: {type(exc).__name__}: {exc}")

    def _run(self) -> None:
        conn, cur, error = _connect(self.client, self.port)
        names = list(self.session)
        cur.execute("SET SESSION " + ", ".join(f"{name} = %s" for name in names) + ", @worker = %s", (*self.session.values(), self.index))
        check = "SELECT " + ", ".join(f"@@session.{name}" for name in names) + ", @worker"
        want = (*(str(v) for v in self.session.values()), str(self.index))
        seq = 0
        while not self.stop.is_set():
            seq += 1
            row_id = self.index * 1_000_000 + seq
            try:
                self.phase = "begin"
                cur.execute("BEGIN")
                self.phase = "dml"
                cur.execute("INSERT INTO chaos_rows (id, worker, v) VALUES (%s, %s, %s)", (row_id, self.index, f"w{self.index}-{seq}"))
                cur.execute("UPDATE chaos_counters SET n = n + 1 WHERE worker = %s", (self.index,))
                self.phase = "commit"
                cur.execute("COMMIT")
                self.committed.append(row_id)
                self.phase = "session check"
                cur.execute(check)
                seen = tuple(_text(v) for v in cur.fetchone())
                if seen != want:
                    self.errors.append(f"session state lost: {seen}, want {want}")
                self.session_checks += 1
                self.phase = "idle"
            except error as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return  # the connection is not trustworthy any more: stop this worker


def run_workers(server, workdir, client: str) -> tuple[list[Worker], list[str], str]:
    """The workers through a proxy while ``server`` restarts: (workers, restarts, proxy log)."""
    server.query("CREATE TABLE test.chaos_rows (id BIGINT PRIMARY KEY, worker INT, v VARCHAR(64))")
    server.query("CREATE TABLE test.chaos_counters (worker INT PRIMARY KEY, n BIGINT)")
    for w in range(WORKERS):
        server.query("INSERT INTO test.chaos_counters VALUES (%s, 0)", (w,))
    tidb = server.flavor == "tidb"
    proxy = start_chaos_proxy(workdir, server.port, backend=tidb_backend(server) if tidb else None, commit_marker=True)
    stop = threading.Event()
    session = {**SESSION, "tidb_txn_mode": "optimistic"} if tidb else SESSION
    workers = [Worker(i, proxy.port, stop, session, client) for i in range(WORKERS)]
    restarts = []
    try:
        for w in workers:
            w.start()
        start = time.monotonic()
        time.sleep(INTERVAL)
        sigs = [signal.SIGTERM] if tidb else [signal.SIGKILL, signal.SIGTERM]
        while time.monotonic() - start + INTERVAL < DURATION:
            sig = sigs[len(restarts) % len(sigs)]
            began, pid = time.monotonic(), server.pid
            server.restart(sig)
            assert server.pid not in (None, pid), f"restart with {signal.Signals(sig).name}: pid {pid} -> {server.pid}"
            restarts.append(f"{signal.Signals(sig).name} down {time.monotonic() - began:.1f}s")
            time.sleep(INTERVAL)
        stop.set()
        deadline = time.monotonic() + CHAOS_GRACE_S
        for w in workers:  # a worker still blocked after this is stuck (the test fails on it)
            w.join(max(0.0, deadline - time.monotonic()))
    finally:
        stop.set()
        log = proxy.stop()
    return workers, restarts, log


@pytest.mark.parametrize("client", ["pymysql", "connector-prepared"])
def test_workload_with_session_state_through_restarts(db_factory, tmp_path, client):
    for attempt in (1, 2):
        server = db_factory()
        workers, restarts, log = run_workers(server, tmp_path / f"proxy-{attempt}", client)
        committed = {row_id for w in workers for row_id in w.committed}
        rows = {r[0] for r in server.query("SELECT id FROM test.chaos_rows")}
        counters = dict(server.query("SELECT worker, n FROM test.chaos_counters"))
        expected_counters = {w.index: len(w.committed) for w in workers}
        corruption = [] if (rows, counters) == (committed, expected_counters) else corrupt_tables(server, ["chaos_rows", "chaos_counters"])
        if not corruption:
            break
        print(f"MariaDB corrupted its own table in run {attempt} ({corruption}); running again on a fresh server")
    errors = [e for w in workers for e in w.errors]
    print(
        f"restarts {restarts}; committed {len(committed)}; session checks {sum(w.session_checks for w in workers)}; "
        f"proxy: {recoveries(log)} sessions recovered or moved; errors {errors}"
    )
    problems = chaos_problems(
        disruptions=len(restarts),
        stuck=[f"worker {w.index} in {w.phase}" for w in workers if w.is_alive()],
        errors=dict(Counter(errors)),
        rows_ok=(rows, counters) == (committed, expected_counters),  # nothing lost or extra, nothing applied twice
        rows_verified=len(rows),
        rows_committed=len(committed),
        row_problems={"missing": sorted(committed - rows)[:5], "extra": sorted(rows - committed)[:5], "corruption": corruption},
        proxy_log=log,
        min_disruptions=3,
    )
    failures = [line for line in log.splitlines() if "reconnect attempt" in line or "Lost connection" in line][-8:]
    assert not problems, (
        f"{problems}\nrestarts: {restarts}\nproxy log:\n" + "\n".join(failures) + f"\nserver log:\n{server_log_tail(server)}"
    )
    assert all(len(w.committed) > 20 and w.session_checks == len(w.committed) for w in workers)
    assert counters == expected_counters, (counters, expected_counters)
