"""Real DM v8.5 through the proxy into a real tidb-server: the shipped task file passes
``dmctl check-task``, and a task replicates a schema made the way DM and users make it
(UNIQUE KEY, KEY with a prefix, a foreign key, DEFAULT expressions) through a TiDB restart
without a pause and with every row.

Skipped, with one line, without the DM and tidb-server binaries (tests/lab/dm.py, tidb.py).
"""

from __future__ import annotations

import re
import threading
import time

import pytest
import yaml

from tests.integration.conftest import start_proxy
from tests.lab.dm import DMCluster, dm_unavailable_reason
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import REPO
from tests.lab.upgrades import Upgraded

pytestmark = pytest.mark.integration

UPSTREAM_ARGS = ["--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
                 "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"]  # fmt: skip


@pytest.fixture
def replication(tidb_factory, tmp_path):
    """MariaDB upstream (binlog on), DM, the proxy, a tidb-server downstream."""
    reason = dm_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs DM: {reason}")
    up = MariaDB(tmp_path / "upstream", extra_args=UPSTREAM_ARGS)
    up.start()
    tidb = tidb_factory()
    tidb.create_user("dm", "dm-secret")
    proxy = start_proxy(tmp_path / "proxy", tidb.port, users=[{"name": "dm", "password": "dm-secret"}],
                        backend={"status_port": tidb.status_port, "health_interval": "0.5s"},
                        recovery={"idempotent": "safe-mode", "commit_marker": True})  # fmt: skip
    dm = DMCluster(tmp_path / "dm")
    try:
        dm.start()
        source = tmp_path / "source.yaml"
        source.write_text(yaml.safe_dump({"source-id": "mysql-replica-01", "flavor": "mariadb", "enable-gtid": False,
                                          "from": {"host": "127.0.0.1", "port": up.port, "user": "root", "password": ""}}))  # fmt: skip
        dm.create_source(source)
        yield up, tidb, proxy, dm, tmp_path
    finally:
        dm.stop()
        proxy.stop()
        up.stop()


def shipped_task(tmp_path, proxy_port: int):
    """configs/deploy/dm/task.yaml with the lab's address, user and dump folder."""
    task = yaml.safe_load((REPO / "configs" / "deploy" / "dm" / "task.yaml").read_text())
    task["target-database"].update({"host": "127.0.0.1", "port": proxy_port, "user": "dm", "password": "dm-secret"})
    task["loaders"]["global"]["dir"] = str(tmp_path / "dumped")
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path, task


def test_the_shipped_task_passes_check_task_and_replicates_through_a_restart(replication):
    up, tidb, proxy, dm, tmp_path = replication
    up.query("CREATE DATABASE orders CHARACTER SET utf8mb4")
    up.query("CREATE TABLE orders.customers (id BIGINT PRIMARY KEY, email VARCHAR(128) NOT NULL, "
             "UNIQUE KEY uk_email (email))")  # fmt: skip
    up.query("CREATE TABLE orders.orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, customer_id BIGINT NOT NULL, "
             "note VARCHAR(200), created DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6), "
             "KEY idx_note (note(10)), KEY idx_customer (customer_id, created))")  # fmt: skip
    up.query("INSERT INTO orders.customers VALUES (1, 'a@x'), (2, 'b@x')")
    up.query("INSERT INTO orders.orders (customer_id, note) VALUES (1, 'first'), (2, 'second')")
    path, task = shipped_task(tmp_path, proxy.port)

    check = dm.ctl("check-task", str(path))
    assert check["result"], check  # warnings (MariaDB as a source is "experimental") are no failure
    assert dm.ctl("start-task", str(path))["result"]
    name = task["name"]
    wait_rows(tidb, "SELECT COUNT(*) FROM orders.orders", 2, 60)

    # DDL DM replicates (an index name before "(": no stored function), then a restart.
    up.query("ALTER TABLE orders.orders ADD COLUMN state VARCHAR(16) NOT NULL DEFAULT 'new', ADD KEY idx_state (state(4))")
    up.query("INSERT INTO orders.orders (customer_id, note, state) VALUES (2, 'third', 'paid')")
    wait_rows(tidb, "SELECT COUNT(*) FROM orders.orders", 3, 60)
    tidb.restart()
    for i in range(20):
        up.query(f"INSERT INTO orders.orders (customer_id, note) VALUES (1, 'after restart {i}')")
    wait_rows(tidb, "SELECT COUNT(*) FROM orders.orders", 23, 90)

    status = dm.ctl("query-status", name)
    stages = [s["stage"] for src in status["sources"] for s in src["subTaskStatus"]]
    assert stages == ["Running"], status
    assert dm.pauses() == [], [p.fields for p in dm.pauses()]
    assert "the client gets 1158" not in proxy.log_text()  # (a connection id may hold the digits 1158)
    up_rows = up.query("SELECT id, customer_id, note, state FROM orders.orders ORDER BY id")
    assert tidb.query("SELECT id, customer_id, note, state FROM orders.orders ORDER BY id") == up_rows


def test_dm_replicates_through_three_upgrades_of_the_proxy(replication):
    """The proxy is upgraded three times (SIGUSR2) while DM replicates a steady stream of
    transactions: DM's connections move to each new process with their backend connections,
    so DM sees nothing -- no pause, no error in its log -- and every row arrives once."""
    up, tidb, proxy, dm, tmp_path = replication
    upgraded = Upgraded(proxy)
    up.query("CREATE DATABASE orders CHARACTER SET utf8mb4")
    up.query("CREATE TABLE orders.items (id BIGINT PRIMARY KEY, qty INT NOT NULL, note VARCHAR(64))")
    path, task = shipped_task(tmp_path, proxy.port)
    assert dm.ctl("start-task", str(path))["result"]
    stop = threading.Event()
    written = []

    def write() -> None:  # 5-row transactions and an UPDATE, back to back
        conn = up.admin()
        n = 0
        with conn.cursor() as cur:
            while not stop.is_set():
                cur.execute("BEGIN")
                cur.execute("INSERT INTO orders.items VALUES " + ", ".join(f"({n + i}, {i}, 'w{n + i}')" for i in range(5)))
                cur.execute(f"UPDATE orders.items SET qty = qty + 1 WHERE id = {n}")
                cur.execute("COMMIT")
                n += 5
                written.append(n)
                time.sleep(0.02)
        conn.close()

    writer = threading.Thread(target=write, daemon=True)
    try:
        wait_rows(tidb, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'orders'", 1, 60)
        writer.start()
        time.sleep(3)
        for _ in range(3):
            upgraded.signal_upgrade()
            time.sleep(3)
        stop.set()
        writer.join(30)
        wait_rows(tidb, "SELECT COUNT(*) FROM orders.items", written[-1], 120)
        status = dm.ctl("query-status", task["name"])
        stages = [st["stage"] for src in status["sources"] for st in src["subTaskStatus"]]
        assert stages == ["Running"], status
        assert dm.pauses() == [], [p.fields for p in dm.pauses()]
        assert "invalid connection" not in dm.worker_log_text(), "DM saw a connection break"
        text = proxy.log_text()
        moved = re.findall(r"upgrade: (\d+) session\(s\) moved to pid \d+, (\d+) left to drain", text)
        assert len(moved) == 3 and all(int(n) > 0 and left == "0" for n, left in moved), moved
        assert tidb.query("SELECT id, qty, note FROM orders.items ORDER BY id") == up.query(
            "SELECT id, qty, note FROM orders.items ORDER BY id"
        )
        print(
            f"\n{len(written)} upstream transactions; sessions moved per upgrade: {[int(n) for n, _ in moved]}; "
            f"hand-overs {upgraded.handovers} s; 0 pauses"
        )
    finally:
        stop.set()
        upgraded.stop()


def wait_rows(db, sql: str, expected: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = db.query(sql)[0][0]
        except Exception as exc:  # the table may not exist yet
            seen = exc
        if seen == expected:
            return
        time.sleep(0.5)
    raise AssertionError(f"{sql} gave {seen!r}, not {expected}, after {timeout} s")
