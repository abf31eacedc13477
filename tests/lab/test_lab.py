"""Tests of the test lab itself: MariaDB management and the Go client,
directly against MariaDB (no proxy)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pymysql
import pytest

from tests.lab import (
    GoClientError,
    MariaDB,
    MariaDBError,
    free_port,
    run_goclient,
    run_goclient_async,
)
from tests.lab.chaos import corrupt_tables
from tests.lab.fixtures import APP_PASSWORD, APP_USER

REPO = Path(__file__).resolve().parents[2]


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is not a running server.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- unit tests (no server) ----------------------------------------------------


def test_free_port_is_outside_ephemeral_range():
    lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20, "free_port handed out a port twice"
    assert all(not lo <= p <= hi for p in ports), (ports, lo, hi)


def _run_pytest_without_mariadb(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess:
    """Run a one-test suite using the lab hooks with mariadbd made unavailable."""
    (tmp_path / "conftest.py").write_text("from tests.lab.fixtures import pytest_collection_modifyitems, pytest_runtest_setup  # noqa\n")
    (tmp_path / "test_needs_db.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.integration
            def test_needs_db():
                pass

            def test_plain():
                pass
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), LAB_MARIADBD="/nonexistent/mariadbd")
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rsf", "-p", "no:cacheprovider", "-o", "markers=integration", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_mariadb_skips_outside_ci(tmp_path):
    res = _run_pytest_without_mariadb(tmp_path, ci=None)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 1 skipped" in res.stdout, res.stdout
    assert "/nonexistent/mariadbd" in res.stdout


def test_missing_mariadb_fails_under_ci(tmp_path):
    res = _run_pytest_without_mariadb(tmp_path, ci="true")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 passed, 1 error" in res.stdout, res.stdout  # setup failure: reported as error
    assert "CI=true" in res.stdout and "/nonexistent/mariadbd" in res.stdout


# -- MariaDB management --------------------------------------------------------


@pytest.mark.integration
def test_session_server_has_app_user_and_databases(mariadb):
    conn = mariadb.connect(APP_USER, APP_PASSWORD, database="test")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT CURRENT_USER(), @@port, @@max_allowed_packet, @@innodb_flush_log_at_trx_commit")
            user, port, packet, flush = cur.fetchone()
            cur.execute("SHOW DATABASES")
            dbs = {r[0] for r in cur.fetchall()}
    finally:
        conn.close()
    assert user == "app@%"
    assert port == mariadb.port
    assert packet == 64 * 1024 * 1024
    assert flush == 1
    assert {"test", "sbtest"} <= dbs
    plugins = mariadb.query("SELECT DISTINCT plugin FROM mysql.user WHERE user = 'app'")
    assert plugins == [("mysql_native_password",)]
    assert mariadb.host == "127.0.0.1"
    assert mariadb.socket_path.exists()


@pytest.mark.integration
def test_restarts_keep_committed_data(mariadb_factory):
    db = mariadb_factory(max_allowed_packet="1M")
    port, first_pid = db.port, db.pid
    assert db.query("SELECT @@max_allowed_packet") == [(1024 * 1024,)]
    db.query("CREATE TABLE test.k (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB")
    db.query("INSERT INTO test.k VALUES (1, 'before-term')")

    db.restart(signal.SIGTERM)
    assert db.is_running() and db.port == port and db.pid != first_pid
    assert not _pid_exists(first_pid)
    assert db.query("SELECT id, v FROM test.k") == [(1, "before-term")]

    # A committed row and an open transaction when the server is SIGKILLed:
    # the first survives crash recovery, the second is rolled back.
    db.query("INSERT INTO test.k VALUES (2, 'before-kill')")
    open_txn = db.connect(APP_USER, APP_PASSWORD, database="test")
    with open_txn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO k VALUES (3, 'uncommitted')")
    killed_pid = db.pid
    db.restart(signal.SIGKILL)
    assert not _pid_exists(killed_pid)
    assert db.query("SELECT id, v FROM test.k ORDER BY id") == [(1, "before-term"), (2, "before-kill")]
    with pytest.raises(pymysql.err.OperationalError):
        with open_txn.cursor() as cur:
            cur.execute("COMMIT")
    open_txn.close()
    assert db.port == port
    assert "crash recovery" in db.error_log_text().lower()


@pytest.mark.integration
def test_stop_kill_and_down_for(mariadb_factory):
    db = mariadb_factory()
    pid = db.pid
    db.kill()
    assert not db.is_running() and db.pid is None and not _pid_exists(pid)
    db.stop()  # stopping a stopped server is a no-op
    with pytest.raises(pymysql.err.OperationalError):
        pymysql.connect(host=db.host, port=db.port, user="root", connect_timeout=2)
    db.start()
    start = time.monotonic()
    db.restart(down_for=0.5)
    assert time.monotonic() - start >= 0.5
    assert db.query("SELECT 1") == [(1,)]
    db.stop()
    assert not db.is_running()


@pytest.mark.integration
def test_corrupt_tables_reports_what_check_table_finds(mariadb_factory):
    """The chaos tests tell a table MariaDB damaged itself from a proxy fault with this check;
    a MyISAM index file overwritten behind the server's back stands in for the damage."""
    db = mariadb_factory()
    db.query("CREATE TABLE test.sound (id INT PRIMARY KEY) ENGINE=InnoDB")
    db.query("CREATE TABLE test.damaged (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=MyISAM")
    db.query("INSERT INTO test.sound VALUES (1), (2)")
    db.query("INSERT INTO test.damaged SELECT seq, CONCAT('v', seq) FROM test.seq_1_to_2000")
    assert corrupt_tables(db, ["sound", "damaged"]) == []
    db.stop()
    index = db.datadir / "test" / "damaged.MYI"
    with index.open("r+b") as f:
        f.seek(1024)
        f.write(b"\xff" * 4096)
    db.start()
    found = corrupt_tables(db, ["sound", "damaged"])
    assert found and all(line.startswith("damaged: ") for line in found), found


@pytest.mark.integration
def test_pause_and_resume(mariadb_factory):
    db = mariadb_factory()
    db.pause()
    with pytest.raises(pymysql.err.OperationalError):
        # The TCP handshake completes in the kernel, the greeting never comes.
        pymysql.connect(host=db.host, port=db.port, user="root", connect_timeout=1, read_timeout=1)
    db.resume()
    assert db.query("SELECT 1") == [(1,)]
    db.pause()
    db.stop()  # stop() wakes a paused server so SIGTERM takes effect
    assert not db.is_running()


@pytest.mark.integration
def test_start_failure_reports_error_log(tmp_path):
    db = MariaDB(tmp_path / "bad", extra_args=["--no-such-option-for-lab-test"])
    with pytest.raises(MariaDBError) as excinfo:
        db.start(timeout=20)
    message = str(excinfo.value)
    assert "exited with status" in message
    assert "no-such-option-for-lab-test" in message  # the log tail is included
    assert not db.is_running()


# -- Go client directly against MariaDB -----------------------------------------


@pytest.mark.integration
def test_go_smoke_direct(mariadb, goclient):
    out = run_goclient("smoke", port=mariadb.port, timeout=180)
    assert out["ok"], out
    assert set(out["checks"].values()) == {"ok"}
    assert out["info"]["max_allowed_packet"] == 64 * 1024 * 1024
    assert {"long_data_prepared", "interpolate_fallback", "session_vars"} <= set(out["checks"])
    assert out["info"]["session_vars"]["time_zone"] == "+00:00"
    assert out["info"]["session_vars"]["foreign_key_checks"] == "0"


@pytest.mark.integration
async def test_go_smoke_async_helper(mariadb, goclient):
    out = await run_goclient_async("smoke", port=mariadb.port, long_data=False, timeout=120)
    assert out["ok"], out
    assert "long_data_prepared" not in out["checks"]


@pytest.mark.integration
def test_go_smoke_small_packets(mariadb_factory, goclient):
    # 1 MiB max_allowed_packet: the driver must learn it (maxAllowedPacket=0)
    # to choose long data and the prepared fallback correctly.
    db = mariadb_factory(max_allowed_packet="1M")
    out = run_goclient("smoke", port=db.port, big_size=256 * 1024, timeout=120)
    assert out["ok"], out
    assert out["info"]["max_allowed_packet"] == 1024 * 1024
    assert out["info"]["interpolate_fallback_bytes"] > 512 * 1024


@pytest.mark.integration
def test_go_smoke_reports_failures(mariadb, goclient):
    # A DSN session variable the server does not accept breaks the connect
    # check, and the run exits non-zero with the error in the JSON.
    with pytest.raises(GoClientError) as excinfo:
        run_goclient("smoke", port=mariadb.port, session=["no_such_variable=1"], timeout=60)
    assert "no_such_variable" in str(excinfo.value)
    res = run_goclient("smoke", port=mariadb.port, session=["no_such_variable=1"], check=False, full=True, timeout=60)
    assert res.returncode == 1 and res.data["ok"] is False
    assert "Unknown system variable" in res.data["checks"]["connect"]


def _workload(db: MariaDB, tmp_path: Path, table: str, **flags) -> tuple[dict, Path]:
    expect = tmp_path / f"{table}.json"
    out = run_goclient(
        "workload", port=db.port, table=table, counters_table=f"{table}_counters", out=expect, timeout=flags.pop("timeout", 120), **flags
    )
    return out, expect


@pytest.mark.integration
@pytest.mark.parametrize("sql, multirow", [("insert", False), ("safe", False), ("safe", True)], ids=["insert", "safe", "safe-multirow"])
def test_go_workload_and_verify_direct(mariadb, goclient, tmp_path, sql, multirow):
    table = f"lab_{sql}_{int(multirow)}"
    tables = dict(table=table, counters_table=f"{table}_counters")
    run_goclient("setup", port=mariadb.port, conns=4, **tables)
    out, expect = _workload(mariadb, tmp_path, table, sql=sql, multirow=multirow, conns=4, duration=2, batch=5)
    assert out["ok"] and out["error_count"] == 0, out
    assert out["committed_txns"] > 20
    assert out["committed_rows"] == out["committed_txns"] * 5
    assert set(out["per_worker"]) == {"0", "1", "2", "3"}
    lat = out["txn_latency_ms"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]

    verified = run_goclient("verify", port=mariadb.port, expect=expect)
    assert verified["ok"] and verified["checked_rows"] == out["committed_rows"], verified

    # A second run continues each worker's sequence after the first.
    out2, expect2 = _workload(mariadb, tmp_path, table, sql=sql, multirow=multirow, conns=4, txns=3, duration=30)
    for w, state in out2["per_worker"].items():
        assert state["first_seq"] == out["per_worker"][w]["last_committed_seq"] + 1
        assert state["committed_txns"] == 3
    assert run_goclient("verify", port=mariadb.port, expect=expect2)["ok"]


@pytest.mark.integration
def test_go_verify_detects_lost_and_double_applied(mariadb, goclient, tmp_path):
    table = "lab_detect"
    tables = dict(table=table, counters_table=f"{table}_counters")
    run_goclient("setup", port=mariadb.port, conns=2, **tables)
    out, expect = _workload(mariadb, tmp_path, table, sql="insert", conns=2, txns=5, duration=30)
    assert out["committed_txns"] == 10
    # Lose one committed row and apply one transaction's counter twice.
    mariadb.query(f"DELETE FROM test.{table} WHERE worker = 0 AND seq = 3 LIMIT 1")
    mariadb.query(f"UPDATE test.{table}_counters SET n = n + 10 WHERE worker = 1")
    # And a phantom transaction the client never saw commit.
    mariadb.query(f"INSERT INTO test.{table} VALUES (1000000000000 + 99 * 10000, 1, 99, 'x')")
    res = run_goclient("verify", port=mariadb.port, expect=expect, check=False, full=True)
    assert res.returncode == 1 and not res.data["ok"]
    problems = "\n".join(res.data["problems"])
    assert "worker 0 seq 3: 9 rows, want 10" in problems
    assert "worker 1: counter 60, want 50" in problems
    assert "worker 1 seq 99: 1 rows present, but the client never saw it commit" in problems
    assert 'worker 1 seq 99 row 0: payload "x"' in problems
    assert res.data["problem_count"] == 4


@pytest.mark.integration
@pytest.mark.chaos
@pytest.mark.parametrize("sql", ["insert", "safe"])
def test_go_workload_survives_restarts(mariadb_factory, goclient, tmp_path, sql):
    # Without a proxy the client sees errors on every restart, retries, and
    # the data must still match exactly what it saw commit.
    db = mariadb_factory()
    table = f"chaos_{sql}"
    run_goclient("setup", port=db.port, conns=4, table=table, counters_table=f"{table}_counters")
    result: dict = {}

    def work() -> None:
        try:
            result["out"] = _workload(
                db,
                tmp_path,
                table,
                sql=sql,
                conns=4,
                duration=7,
                batch=5,
                read_timeout="10s",
                retry_delay="50ms",
                grace="20s",
            )
        except Exception as e:  # surfaced by the main thread
            result["error"] = e

    worker = threading.Thread(target=work)
    worker.start()
    try:
        time.sleep(1.5)
        db.restart(signal.SIGKILL, down_for=0.5)
        time.sleep(1.5)
        db.restart(signal.SIGTERM, down_for=0.5)
    finally:
        worker.join(timeout=90)
    assert not worker.is_alive(), "workload did not finish"
    if "error" in result:
        raise result["error"]
    out, expect = result["out"]
    assert out["ok"], out
    assert out["error_count"] > 0 and out["reconnects"] > 0, out  # it did notice the restarts
    assert out["committed_txns"] > 0
    verified = run_goclient("verify", port=db.port, expect=expect)
    assert verified["ok"], json.dumps(verified, indent=2)


@pytest.mark.integration
@pytest.mark.chaos
def test_go_workload_reports_stuck_workers(mariadb_factory, goclient, tmp_path):
    # A hung server (SIGSTOP) must not hang the workload: after -duration and
    # -grace it reports the blocked workers and exits.
    db = mariadb_factory()
    table = "stuck"
    run_goclient("setup", port=db.port, conns=3, table=table, counters_table=f"{table}_counters")
    result: dict = {}

    def work() -> None:
        try:
            result["out"] = _workload(db, tmp_path, table, sql="insert", conns=3, duration=2, grace="1s", read_timeout="60s", check=False)
        except Exception as e:
            result["error"] = e

    worker = threading.Thread(target=work)
    worker.start()
    time.sleep(1)
    db.pause()
    try:
        worker.join(timeout=30)
    finally:
        db.resume()
    assert not worker.is_alive(), "workload hung on a paused server"
    if "error" in result:
        raise result["error"]
    out, expect = result["out"]
    # Stuck is a failure: counted, named by phase, among the errors, and the run is not ok.
    assert out["stuck_workers"] == 3 and not out["ok"], out
    assert sum(out["stuck_phases"].values()) == 3 and len(out["stuck"]) == 3, out
    assert out["error_count"] >= 3 and any(k.startswith("stuck: ") for k in out["errors"]), out
    assert out["longest_stall_ms"] >= 1000, out  # the unfinished transactions count (paused for > 1 s)
    assert out["elapsed"] < 10
    assert all(w["stuck"] and w["stuck_phase"] for w in out["per_worker"].values())
    # The server may still execute commands that were buffered while it was
    # stopped (including a COMMIT): verify once the client's sessions are gone.
    deadline = time.monotonic() + 15
    while db.query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'app'") != [(0,)]:
        assert time.monotonic() < deadline, "client sessions did not go away"
        time.sleep(0.1)
    verified = run_goclient("verify", port=db.port, expect=expect)
    assert verified["ok"], verified
