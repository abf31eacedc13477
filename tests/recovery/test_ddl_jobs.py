"""A DDL in doubt whose job still runs when the proxy looks (proxy.recovery.ddljobs): on
tidb-server, behind the fault shim. The matrix (section 11) has the jobs that ended: done,
failed, never queued.

An open transaction that read the table holds its metadata lock, so TiDB's job for an ALTER of
it runs but cannot finish. The shim then crashes (every connection cut, its port closed for a
second, TiDB and the job untouched): the proxy reconnects, finds the job running, waits, and
once the transaction ends the job does, and the client gets OK for its ALTER, which ran once.
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


def _running(h: RecoveryHarness, database: str) -> int | None:
    rows = h.query(f"ADMIN SHOW DDL JOBS 5 WHERE DB_NAME = '{database}' AND STATE = 'running'")
    return rows[0][0] if rows else None
