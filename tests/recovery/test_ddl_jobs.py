"""A DDL in doubt whose job still runs when the proxy looks (proxy.recovery.ddljobs): on
tidb-server, behind the fault shim. The matrix (section 11) has the jobs that ended: done,
failed, never queued.

An open transaction that read the table holds its metadata lock, so TiDB's job for an ALTER of
it runs but cannot finish. The shim then crashes (every connection cut, its port closed for a
second, TiDB and the job untouched): the proxy reconnects, finds the job running, waits, and
once the transaction ends the job does, and the client gets OK for its ALTER, which ran once.

Two sessions sending the same ALTER at once (two DM workers merging shards into one table):
both pass TiDB's checks while the first job waits for the lock, so TiDB queues two jobs of the
same text; the first ends done, the second cancelled (1060). The proxy's session whose answer
was lost gets its own job's outcome, told by the connection that queued it.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.lab.procs import wait_for
from tests.recovery.harness import RecoveryHarness, recovery_harness  # noqa: F401 (fixture)

pytestmark = pytest.mark.integration

ALTER = "ALTER TABLE t ADD COLUMN note VARCHAR(8)"


@pytest.mark.parametrize("recovery_harness", ["tidb"], indirect=True)
def test_a_ddl_job_still_running_is_waited_for(recovery_harness: RecoveryHarness) -> None:
    h = recovery_harness
    database = "ddl_running"
    h.query(f"DROP DATABASE IF EXISTS {database}")
    h.query(f"CREATE DATABASE {database}")
    h.query("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8))", database=database)
    h.query("INSERT INTO t VALUES (1, 'a')", database=database)
    holder = h.direct(database)
    client = h.client(database=database)
    answer: dict[str, object] = {}
    try:
        holder.begin()
        with holder.cursor() as cur:
            cur.execute("SELECT * FROM t")  # its metadata lock keeps the ALTER's job from finishing

        def alter() -> None:
            try:
                with client.cursor() as cur:
                    cur.execute(ALTER)
                answer["ok"] = True
            except Exception as exc:  # what the client saw, for the assertion below
                answer["error"] = exc

        thread = threading.Thread(target=alter, daemon=True)
        thread.start()
        wait_for(lambda: _running(h, database) is not None, "the ALTER's job running", timeout=20, interval=0.1)
        h.shim.crash(1.0)  # the proxy's backend connection cut: its ALTER in doubt
        time.sleep(3)  # the proxy reconnects and finds the job running
        assert thread.is_alive(), f"the client was answered while the job still ran: {answer}"
        assert _running(h, database) is not None
        holder.commit()
        thread.join(30)
        assert answer == {"ok": True}, answer
        with client.cursor() as cur:  # the session goes on
            cur.execute("INSERT INTO t (id, v, note) VALUES (2, 'b', 'n')")
    finally:
        holder.close()
        client.close()
    assert h.query("SELECT id, note FROM t ORDER BY id", database=database) == [(1, None), (2, "n")]
    jobs = h.query(f"SELECT QUERY FROM information_schema.DDL_JOBS WHERE DB_NAME = '{database}' AND QUERY LIKE 'ALTER%'")
    assert jobs == [(ALTER,)], jobs  # it ran once
    log = h.proxy().log_text()
    assert "ended synced: OK" in log or "ended done: OK" in log, log[-3000:]


@pytest.mark.parametrize("recovery_harness", ["tidb"], indirect=True)
@pytest.mark.parametrize("proxy_first", [True, False], ids=["its-job-done", "its-job-rolled-back"])
def test_of_two_jobs_of_the_same_text_the_lost_session_gets_its_own(recovery_harness: RecoveryHarness, proxy_first: bool) -> None:
    h = recovery_harness
    database = f"ddl_twice_{int(proxy_first)}"
    h.query(f"DROP DATABASE IF EXISTS {database}")
    h.query(f"CREATE DATABASE {database}")
    h.query("CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8))", database=database)
    holder, other = h.direct(database), h.direct(database)
    client = h.client(database=database)
    answers: dict[str, object] = {}

    def alter(name: str, conn) -> threading.Thread:
        def run() -> None:
            try:
                with conn.cursor() as cur:
                    cur.execute(ALTER)
                answers[name] = "OK"
            except Exception as exc:  # what each session saw, for the assertions below
                answers[name] = exc.args[0] if exc.args else exc

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    try:
        holder.begin()
        with holder.cursor() as cur:
            cur.execute("SELECT * FROM t")  # its metadata lock holds the first job, and the second waits behind it
        order = [("proxy", client), ("other", other)] if proxy_first else [("other", other), ("proxy", client)]
        threads = []
        for n, (name, conn) in enumerate(order, 1):
            threads.append(alter(name, conn))
            wait_for(lambda n=n: len(_jobs(h, database)) == n, f"job {n} of the ALTER queued", timeout=20, interval=0.1)
        h.shim.crash(1.0)  # the proxy's backend connection cut: its ALTER in doubt
        time.sleep(2)
        holder.commit()  # the first job ends done, the second finds the column there: rolled back
        for thread in threads:
            thread.join(30)
    finally:
        for conn in (holder, other, client):
            conn.close()
    states = [state for _, state in _jobs(h, database)]
    assert states[0] == "synced" and states[1] in ("rollback done", "cancelled"), states  # (v8.5.3 says cancelled)
    assert answers == ({"proxy": "OK", "other": 1060} if proxy_first else {"other": "OK", "proxy": 1060}), answers
    log = h.proxy().log_text()
    assert "cannot be told apart" not in log, log[-3000:]
    assert h.query("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND COLUMN_NAME = 'note'", (database,)) == [
        (1,)
    ]


def _jobs(h: RecoveryHarness, database: str) -> list[tuple[int, str]]:
    """(id, state) of the ALTERs' jobs in ``database``, oldest first."""
    rows = h.query(f"ADMIN SHOW DDL JOBS 10 WHERE DB_NAME = '{database}' AND JOB_TYPE = 'add column'")
    return sorted((int(r[0]), r[11]) for r in rows)


def _running(h: RecoveryHarness, database: str) -> int | None:
    rows = h.query(f"ADMIN SHOW DDL JOBS 5 WHERE DB_NAME = '{database}' AND STATE = 'running'")
    return rows[0][0] if rows else None
