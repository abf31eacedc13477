"""The proxy upgraded back to back under load (SIGUSR2 as soon as the last upgrade is done, for
~25 s): the DM-like Go workload (8 pinned connections, non-idempotent transactions) beside a
client of the binary protocol (mysql-connector's prepared statements, a parameter sent as long
data, session variables, a transaction open across upgrades). No error on either, no session
drained or reconnected, every row verified; on MariaDB and on TiDB."""

from __future__ import annotations

import io
import re
import threading
import time

import mysql.connector
import pytest

from tests.integration.conftest import start_proxy
from tests.lab.fixtures import APP_PASSWORD, APP_USER, prepare_server
from tests.lab.goclient import run_goclient
from tests.lab.upgrades import Upgraded

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

UPGRADING = 25.0  # seconds of upgrades, one after the other (each takes a Python start: 1-4 s here)


class BinaryClient(threading.Thread):
    """Prepared statements over the binary protocol, until stopped: a session variable set once
    and read back in every transaction, an INSERT whose blob goes as long data
    (COM_STMT_SEND_LONG_DATA), each transaction open across a pause so that upgrades find it in
    one. Every row it committed is in ``committed``; any error ends it and is kept."""

    def __init__(self, port: int, table: str) -> None:
        super().__init__(daemon=True, name="binary-client")
        self.port, self.table = port, table
        self.committed: list[int] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            conn = mysql.connector.connect(host="127.0.0.1", port=self.port, user=APP_USER, password=APP_PASSWORD, database="test",
                                           use_pure=True, autocommit=False)  # fmt: skip
            plain = conn.cursor()
            plain.execute("SET @tag = 'kept across upgrades', SESSION sql_mode = 'ANSI_QUOTES'")
            insert = conn.cursor(prepared=True)
            check = conn.cursor(prepared=True)
            n = 0
            while not self.stopping.is_set():
                n += 1
                conn.start_transaction()
                blob = io.BytesIO(b"%d:" % n + b"x" * 20000)  # a file-like parameter goes as long data
                insert.execute(f"INSERT INTO {self.table} (id, tag, body) VALUES (?, @tag, ?)", (n, blob))
                time.sleep(0.05)  # open across whatever upgrade comes
                check.execute("SELECT @tag, @@SESSION.sql_mode, COUNT(*) FROM " + self.table + " WHERE id <= ?", (n,))
                tag, mode, count = check.fetchall()[0]
                if (tag, mode, count) != ("kept across upgrades", "ANSI_QUOTES", n):
                    raise AssertionError(f"transaction {n}: read {(tag, mode, count)}")
                conn.commit()
                self.committed.append(n)
            conn.close()
        except BaseException as exc:  # noqa: BLE001 -- the test reads it
            self.error = exc


def test_upgrades_back_to_back_under_load_lose_nothing(db, goclient, tmp_path):
    prepare_server(db)
    table = "up_binary"
    db.query(f"DROP TABLE IF EXISTS test.{table}")
    db.query(f"CREATE TABLE test.{table} (id INT PRIMARY KEY, tag VARCHAR(40), body LONGBLOB)")
    tables = {"table": "upc_rows", "counters_table": "upc_counters"}
    run_goclient("setup", port=db.port, conns=8, **tables)
    proxy = Upgraded(start_proxy(tmp_path / "proxy", db.port, log={"level": "info"}))
    expect = tmp_path / "workload.json"
    result: dict = {}

    def load() -> None:
        result.update(run_goclient("workload", port=proxy.proxy.port, conns=8, duration=UPGRADING + 10, batch=5, sql="insert",
                                   out=expect, timeout=300, check=False, **tables))  # fmt: skip

    worker = threading.Thread(target=load, daemon=True)
    binary = BinaryClient(proxy.proxy.port, table)
    upgrades = 0
    try:
        worker.start()
        binary.start()
        time.sleep(3)
        started = time.monotonic()
        while time.monotonic() - started < UPGRADING:
            assert binary.error is None, f"after {upgrades} upgrades: {binary.error!r}"
            proxy.signal_upgrade()
            upgrades += 1
        binary.stopping.set()
        binary.join(60)
        worker.join(300)
    finally:
        binary.stopping.set()
        text = proxy.stop()
    assert binary.error is None, f"the binary-protocol client failed after {upgrades} upgrades: {binary.error!r}"
    assert upgrades >= 5, upgrades
    assert len(binary.committed) > 20, binary.committed
    rows = db.query(f"SELECT id, tag, LENGTH(body), LEFT(body, 8) FROM test.{table} ORDER BY id")
    assert [(int(r[0]), r[1]) for r in rows] == [(n, "kept across upgrades") for n in binary.committed]
    assert all(int(r[2]) == len(b"%d:" % int(r[0])) + 20000 for r in rows)
    assert result.get("ok") and result["error_count"] == 0 and result.get("reconnects") == 0, result
    verified = run_goclient("verify", port=db.port, expect=expect, **tables)
    assert verified["ok"] and verified["checked_rows"] == result["committed_rows"], verified
    moved = re.findall(r"upgrade: (\d+) session\(s\) moved to pid \d+, (\d+) left to drain", text)
    assert len(moved) == upgrades and all(left == "0" for _, left in moved), moved
    print(f"\n{upgrades} upgrades in {UPGRADING:g} s (each {min(proxy.handovers):.1f}-{max(proxy.handovers):.1f} s); "
          f"{result['committed_txns']} Go transactions and {len(binary.committed)} binary-protocol ones, 0 errors")  # fmt: skip
