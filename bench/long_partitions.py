"""Long partitions with one backend: what a client sees through partitions of minutes.

    python -m bench.long_partitions [SECONDS ...]        # default: 90 300

One MariaDB behind the proxy (``backend.dead_after`` 10 s, ``recovery.buffer_window`` 30 s,
both the defaults of configs/dm-sidecar.toml's kind). For each length, three sessions: one idle
with a user variable, one in a transaction that has written a row, one whose read is sent into
the partition; then every packet to and from the server's port is dropped (netfilter, as in
tests/lab/netfault.py) for that long. After the heal: the idle session's next command, the
transaction's next INSERT and COMMIT, and which rows landed. Needs root and iptables.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import pymysql

from tests.lab.fixtures import running_server
from tests.lab.netfault import Partition, heal_all, partition_unavailable_reason
from tests.lab.proxy import ProxyProcess


def _connect(port: int) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test", autocommit=True,
                           read_timeout=900, write_timeout=900)  # fmt: skip


def _run(cur, sql: str) -> tuple:
    t0 = time.monotonic()
    try:
        cur.execute(sql)
        return ("ok", cur.fetchall(), round(time.monotonic() - t0, 1))
    except pymysql.err.MySQLError as exc:
        return ("error", exc.args[0], round(time.monotonic() - t0, 1))


def one_partition(server, proxy_port: int, seconds: float) -> dict:
    key = int(seconds)
    idle, tx, busy = (_connect(proxy_port) for _ in range(3))
    idle.cursor().execute("SET @kept = 1")
    tx_cur = tx.cursor()
    tx_cur.execute("BEGIN")
    tx_cur.execute(f"INSERT INTO test.long_partitions VALUES ({key})")
    seen: dict = {}
    partition = Partition(server.port).cut()
    try:
        reader = threading.Thread(
            target=lambda: seen.__setitem__("read sent into it", _run(busy.cursor(), "SELECT COUNT(*) FROM test.long_partitions"))
        )
        reader.start()
        time.sleep(seconds)
    finally:
        partition.heal()
    reader.join()
    time.sleep(3)  # the reconnects' backoff
    seen["idle: next command"] = _run(idle.cursor(), "SELECT @kept")
    seen["transaction: next INSERT"] = _run(tx_cur, f"INSERT INTO test.long_partitions VALUES ({key + 1})")
    seen["transaction: COMMIT"] = _run(tx_cur, "COMMIT")
    seen["rows"] = server.query(f"SELECT id FROM test.long_partitions WHERE id IN ({key}, {key + 1})")
    for conn in (idle, tx, busy):
        try:
            conn.close()
        except pymysql.err.Error:
            pass
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.long_partitions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("seconds", nargs="*", type=float, default=[90.0, 300.0])
    args = parser.parse_args()
    reason = partition_unavailable_reason()
    if reason:
        raise SystemExit(f"bench.long_partitions: {reason}")
    base = Path(tempfile.mkdtemp(prefix="long-partitions-"))
    heal_all()
    try:
        with running_server("mariadb", base / "db") as server:
            server.query("CREATE TABLE test.long_partitions (id INT PRIMARY KEY)")
            proxy = ProxyProcess(base / "proxy", server.port, recovery={"buffer_window": "30s"}, log={"level": "info"}).start()
            try:
                for seconds in args.seconds:
                    print(f"partition of {seconds:g} s: {one_partition(server, proxy.port, seconds)}", flush=True)
            finally:
                proxy.stop()
                print(f"proxy log: {proxy.log_path}")
    finally:
        heal_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
