"""DM merging shards, several dm-workers each with its own replay-proxy, while the TiDB cluster
restarts in turn and crashes.

    python -m bench.dm_shards [--shard-modes pessimistic,optimistic] [--faults rolling,kill]
                              [--targets proxy] [--duration 160] [--interval 8] [--servers 2]

For each shard mode x fault kind x target, a fresh lab: ``--shards`` upstream MariaDB servers
(database ``shop_<i>`` on server i, the same tables; ``auto_increment_increment`` = the number
of shards and ``auto_increment_offset`` = i, so the shards' keys never meet), a TiDB cluster
(tests/lab/cluster.py: PD, one store process, ``--servers`` tidb-servers), one dm-master and a
dm-worker per shard, one source per shard and one task (``task-mode: all``) that merges every
``shop_<i>`` into ``shop`` (a route) in ``shard-mode`` pessimistic or optimistic. Target
``proxy``: each dm-worker dials the task's ``target-database`` host and reaches its own
replay-proxy there (tests/lab/sidecars.py), each proxy in front of every tidb-server with
configs/dm-sidecar.toml's settings (bench/dm_middles.py); ``direct``: every worker writes to the
first tidb-server.

A load writes to every shard (``--rate`` transactions/s per shard: new orders of several
statements, state changes, new customers, cancellations) and a heartbeat row per shard every
250 ms; at a quarter, half and three quarters of ``--duration`` the same DDL runs on every
shard at once (``SHARD_DDL``: ADD COLUMN, ADD INDEX, a column type change), as a schema change
rolled out to all shards does. Meanwhile the faults of bench/dm_e2e.py's ``--cluster`` runs:
``rolling``, one tidb-server at a time stopped with SIGTERM (``--graceful-wait``) and started
again; ``kill``, the same with SIGKILL; an event every ``--interval`` seconds, start to start,
from the task's start. Then the load stops, DM catches up, and the merged tables are compared
with the shards: row count and NULL-safe checksum (bench/dm_load.py), downstream against the
sum over the shards (each row is in exactly one shard).

Counted: DM's pauses and failed batches (every dm-worker's log, bench.dm_e2e.dm_events), the
shard DDL locks dm-master resolved (its log) and any left (``shard-ddl-lock``), the lag (the
oldest shard's heartbeat read downstream every second), each proxy's recoveries and 1158s
(/metrics, its log). Results in bench/results/<timestamp>-dm_shards/: table.txt, results.json.

bench/dm_paths.py runs DM's other paths (online DDL, the validator, the relay log, ...) through
the same lab with one shard.
"""

from __future__ import annotations

import argparse
import calendar
import datetime as _dt
import functools
import json
import random
import re
import shutil
import signal as _signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pymysql
import yaml

from bench import REPO, dm_load
from bench.dm_e2e import (
    DM_PASSWORD,
    DM_USER,
    TASK,
    UPSTREAM_ARGS,
    Restarter,
    Sampler,
    answering,
    cluster_event,
    dm_events,
    dm_statements,
    teardown,
)
from bench.dm_middles import proxy_numbers, sidecar_overrides
from bench.hygiene import sigterm_as_interrupt
from bench.runinfo import run_meta
from tests.lab.cluster import Cluster, cluster_unavailable_reason
from tests.lab.dm import SIDECAR_HOST, DMCluster, dm_unavailable_reason, parse_log, sidecar_unavailable_reason
from tests.lab.mariadb import MariaDB, free_port
from tests.lab.procs import read_log
from tests.lab.sidecars import Sidecar, sidecar_address

MERGED = "shop"  # the downstream database every shard merges into
SIGNALS = {"rolling": _signal.SIGTERM, "kill": _signal.SIGKILL}
TABLES = {
    "customers": "id BIGINT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(64) NOT NULL, email VARCHAR(128) NOT NULL, "
    "balance DECIMAL(14,2) NOT NULL DEFAULT 0, updated DATETIME(6) NOT NULL, UNIQUE KEY uk_email (email)",
    "orders": "id BIGINT AUTO_INCREMENT PRIMARY KEY, customer_id BIGINT NOT NULL, state VARCHAR(16) NOT NULL DEFAULT 'new', "
    "total DECIMAL(14,2) NOT NULL, created DATETIME(6) NOT NULL, note VARCHAR(64), KEY idx_customer (customer_id)",
    "order_items": "order_id BIGINT NOT NULL, line INT NOT NULL, sku VARCHAR(32) NOT NULL, qty INT NOT NULL, "
    "price DECIMAL(10,2) NOT NULL, PRIMARY KEY (order_id, line)",
    "heartbeat": "id INT PRIMARY KEY, ts DATETIME(6) NOT NULL",
}
# The schema change rolled out to every shard at once, at these fractions of the run.
SHARD_DDL = [
    (0.25, "ALTER TABLE orders ADD COLUMN coupon VARCHAR(16) NULL"),
    (0.50, "ALTER TABLE orders ADD INDEX idx_state (state)"),
    (0.75, "ALTER TABLE order_items MODIFY COLUMN qty BIGINT NOT NULL"),
]


def shard_schema(i: int) -> str:
    return f"shop_{i}"


def upstream_args(i: int, shards: int) -> list[str]:
    """bench.dm_e2e's binlog settings, server id ``i``, and auto-increment keys of shard ``i``
    of ``shards`` (i, i + shards, ...): the shards' rows never share a key."""
    own = [f"--server-id={i}", f"--auto-increment-increment={shards}", f"--auto-increment-offset={i}"]
    return [a for a in UPSTREAM_ARGS if not a.startswith("--server-id=")] + own


def preload(port: int, schema: str, scale: int, seed: int = 7) -> dict[str, int]:
    """The tables in ``schema``: ``scale`` orders of 1-3 lines, a customer per 5 orders, the
    heartbeat row (id: the shard's own auto-increment offset, so one per shard)."""
    rng = random.Random(seed)
    conn = dm_load.connect(port, database=None)
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {schema} CHARACTER SET utf8mb4")
        cur.execute(f"USE {schema}")
        for name, columns in TABLES.items():
            cur.execute(f"CREATE TABLE {name} ({columns}) ENGINE=InnoDB")
        customers = max(scale // 5, 10)
        cur.executemany("INSERT INTO customers (name, email, balance, updated) VALUES (%s, %s, 100, UTC_TIMESTAMP(6))",
                        [(f"name {n}", f"{schema}-{n}@shop.example") for n in range(customers)])  # fmt: skip
        cur.execute("SELECT id FROM customers")
        ids = [row[0] for row in cur.fetchall()]
        cur.executemany("INSERT INTO orders (customer_id, state, total, created, note) VALUES (%s, %s, %s, UTC_TIMESTAMP(6), %s)",
                        [(rng.choice(ids), rng.choice(["new", "paid", "shipped"]), "19.00", None if n % 3 else "gift")
                         for n in range(scale)])  # fmt: skip
        cur.execute("SELECT id FROM orders")
        items = [
            (o, line, f"sku-{rng.randint(1, 200)}", rng.randint(1, 4)) for (o,) in cur.fetchall() for line in range(1, rng.randint(2, 4))
        ]
        cur.executemany("INSERT INTO order_items VALUES (%s, %s, %s, %s, '9.50')", items)
        cur.execute("SELECT @@auto_increment_offset")
        cur.execute("INSERT INTO heartbeat VALUES (%s, UTC_TIMESTAMP(6))", (cur.fetchone()[0],))
    conn.close()
    return {"customers": customers, "orders": scale, "order_items": len(items)}


class ShardLoad:
    """Writers on every shard (``rate`` transactions/s each), a heartbeat per shard, and
    ``statements``: (seconds after ``start``, SQL) run on every shard at once (a thread per
    shard), or a callable run once at that time with the shards' ports (an online schema change
    with pt-online-schema-change, bench/dm_paths.py; ``str()`` of it is what is reported)."""

    def __init__(self, ports: list[int], rate: float, statements: list[tuple[float, str | Callable[[list[int]], str]]] = (),
                 threads: int = 2, seed: int = 11) -> None:  # fmt: skip
        self.ports, self.rate, self.threads, self.seed = ports, rate, threads, seed
        self.statements = sorted(statements, key=lambda s: s[0])
        self.stats = dm_load.LoadStats()
        self.ddl: list[dict[str, Any]] = []  # what each scheduled statement did, per shard
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        self.started = time.time()
        for s, port in enumerate(self.ports, 1):
            for k in range(self.threads):
                self._spawn(self._writer, port, s, k)
            self._spawn(self._heartbeat, port, s)
        if self.statements:
            self._spawn(self._schedule)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=target.__name__)
        self._threads.append(thread)
        thread.start()

    def stop(self) -> dm_load.LoadStats:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        return self.stats

    def _count(self, statements: int = 0, error: str | None = None) -> None:
        with self._lock:
            if error is None:
                self.stats.transactions += 1
                self.stats.statements += statements
            else:
                self.stats.errors.append(error[:200])

    def _heartbeat(self, port: int, shard: int) -> None:
        conn = dm_load.connect(port, database=shard_schema(shard))
        with conn.cursor() as cur:
            while True:
                cur.execute("UPDATE heartbeat SET ts = UTC_TIMESTAMP(6)")  # (its one row)
                if self._stop.wait(0.25):
                    break
            cur.execute("UPDATE heartbeat SET ts = UTC_TIMESTAMP(6)")  # the last word: looked for downstream
        conn.close()

    def _schedule(self) -> None:
        for at, what in self.statements:
            if self._stop.wait(max(0.0, self.started + at - time.time())):
                return
            began = time.time()
            if not isinstance(what, str):
                result = self._run(functools.partial(what, self.ports))
                self.ddl.append({"at": began - self.started, "sql": str(what), "results": [result]})
                continue
            results: list[str] = [""] * len(self.ports)
            runners = [threading.Thread(target=self._one, args=(port, s, what, results), daemon=True) for s, port in enumerate(self.ports)]
            for thread in runners:
                thread.start()
            for thread in runners:
                thread.join(300)
            self.ddl.append({"at": began - self.started, "sql": what, "results": results})

    def _one(self, port: int, index: int, sql: str, results: list[str]) -> None:
        def run() -> str:
            conn = dm_load.connect(port, database=shard_schema(index + 1))
            try:
                with conn.cursor() as cur:
                    cur.execute(sql)
            finally:
                conn.close()
            return "ok"

        results[index] = self._run(run)

    @staticmethod
    def _run(fn: Callable[[], str]) -> str:
        began = time.time()
        try:
            outcome = fn()
        except Exception as exc:  # noqa: BLE001 - said in the results
            outcome = f"{type(exc).__name__}: {exc}"[:300]
        return f"{outcome} ({time.time() - began:.1f} s)"

    def _writer(self, port: int, shard: int, index: int) -> None:
        rng = random.Random(self.seed * 1000 + shard * 10 + index)
        conn = dm_load.connect(port, database=shard_schema(shard))
        interval, due = self.threads / self.rate, time.monotonic()
        while not self._stop.is_set():
            due += interval
            try:
                self._count(self._transaction(conn, rng, shard))
            except pymysql.MySQLError as exc:  # lock waits during a schema change, deadlocks: counted
                self._count(error=str(exc))
                conn.rollback()
            if due > time.monotonic():
                self._stop.wait(due - time.monotonic())
        conn.close()

    @staticmethod
    def _transaction(conn: pymysql.Connection, rng, shard: int) -> int:
        roll = rng.random()
        with conn.cursor() as cur:
            cur.execute("SELECT MAX(id) FROM orders")
            last = cur.fetchone()[0] or 1
            some = rng.randint(1, last)  # (another shard's key, or a deleted one: no row, nothing replicated)
            if roll < 0.5:  # a new order
                cur.execute("BEGIN")
                cur.execute("SELECT id FROM customers ORDER BY id DESC LIMIT 1")
                customer = cur.fetchone()[0]
                cur.execute("INSERT INTO orders (customer_id, total, created, note) VALUES (%s, 28.50, UTC_TIMESTAMP(6), %s)",
                            (customer, "n" * rng.randint(0, 40)))  # fmt: skip
                order = cur.lastrowid
                lines = rng.randint(1, 3)
                for line in range(1, lines + 1):
                    cur.execute("INSERT INTO order_items VALUES (%s, %s, %s, %s, '9.50')", (order, line, f"sku-{rng.randint(1, 200)}", 3))
                cur.execute("UPDATE customers SET balance = balance - 28.50, updated = UTC_TIMESTAMP(6) WHERE id = %s", (customer,))
                cur.execute("COMMIT")
                return lines + 4
            if roll < 0.8:
                cur.execute("UPDATE orders SET state = %s WHERE id = %s", (rng.choice(["paid", "shipped"]), some))
                return 1
            if roll < 0.9:
                cur.execute("INSERT INTO customers (name, email, updated) VALUES (%s, %s, UTC_TIMESTAMP(6))",
                            (f"new {rng.random():.6f}", f"shop_{shard}-{rng.getrandbits(48)}@shop.example"))  # fmt: skip
                return 1
            cur.execute("BEGIN")
            cur.execute("DELETE FROM order_items WHERE order_id = %s", (some,))
            cur.execute("DELETE FROM orders WHERE id = %s", (some,))
            cur.execute("COMMIT")
            return 4


def merged_lag(port: int, host: str = "127.0.0.1") -> float | None:
    """Seconds between now (UTC) and the oldest shard's heartbeat in the merged database; None
    when it cannot be read."""
    try:
        conn = pymysql.connect(host=host, port=port, user="root", password="", connect_timeout=1, read_timeout=2)
    except pymysql.MySQLError:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT MIN(ts) FROM `{MERGED}`.heartbeat")
            row = cur.fetchone()
    except pymysql.MySQLError:
        return None
    finally:
        conn.close()
    if row is None or row[0] is None:
        return None
    return time.time() - (calendar.timegm(row[0].timetuple()) + row[0].microsecond / 1e6)


class ShardSampler(Sampler):
    """bench.dm_e2e's sampler, the lag read from the merged heartbeat table."""

    def read_lag(self) -> float | None:
        for k, server in enumerate(answering(self.servers, self._good)):
            lag = merged_lag(server.port, server.host)
            if lag is not None:
                self._good = (self._good + k) % len(self.servers)
                return lag
        return None


def shard_checksums(ports: list[int], shards: int) -> dict[str, tuple[int, int]]:
    """The shards' tables as one: per table, the row counts and checksums added up (each row
    lives in one shard, and the checksum is a sum over rows)."""
    total: dict[str, tuple[int, int]] = {}
    for i, port in enumerate(ports[:shards], 1):
        for table, (count, digest) in dm_load.checksums(port, schema=shard_schema(i)).items():
            before = total.get(table, (0, 0))
            total[table] = (before[0] + count, before[1] + digest)
    return total


def merged_checksums(ports: list[int]) -> dict[str, tuple[int, int]] | None:
    for port in ports:
        try:
            return dm_load.checksums(port, schema=MERGED)
        except pymysql.MySQLError:
            continue
    return None


def wait_merged(upstream: dict[str, tuple[int, int]], ports: list[int], timeout: float) -> float | None:
    """Seconds until the merged tables' checksums equal ``upstream`` (None: not in ``timeout``)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if merged_checksums(ports) == upstream:
            return time.monotonic() - began
        time.sleep(5)
    return None


@dataclass
class Setup:
    """One lab run: the topology, the task's modes and the faults."""

    shards: int = 2
    shard_mode: str | None = "pessimistic"  # None: no shard DDL coordination (one shard)
    faults: str = "rolling"  # rolling | kill | none
    target: str = "proxy"  # proxy | direct
    duration: float = 160
    interval: float = 8
    restarts: int | None = None  # default: duration / interval
    servers: int = 2
    graceful_wait: int = 3
    scale: int = 5000
    rate: float = 70
    catch_up: float = 300
    buffer_window: float = 30.0
    general_log: bool = False
    statements: list = field(default_factory=lambda: list(SHARD_DDL))  # (fraction of duration, SQL or a callable: ShardLoad)
    syncer: dict[str, Any] = field(default_factory=dict)  # more syncers.global settings (compact, multiple-rows, safe-mode)
    task: dict[str, Any] = field(default_factory=dict)  # more task settings (online-ddl, validators, ...)
    instance: dict[str, Any] = field(default_factory=dict)  # more mysql-instances[] settings (validator-config-name)
    source: dict[str, Any] = field(default_factory=dict)  # more source settings (enable-relay)
    label: str = ""


def task_file(path: Path, setup: Setup, host: str, port: int, dumps: Path) -> Path:
    sources = [f"shard-{i:02d}" for i in range(1, setup.shards + 1)]
    task: dict[str, Any] = {
        "name": TASK, "task-mode": "all", "meta-schema": "dm_meta",
        "target-database": {"host": host, "port": port, "user": DM_USER, "password": DM_PASSWORD},
        "routes": {"merge": {"schema-pattern": "shop_*", "target-schema": MERGED}},
        "block-allow-list": {"bw": {"do-dbs": ["~^shop_[0-9]+$"]}},
        "mydumpers": {"global": {"threads": 4, "chunk-filesize": "8"}},
        # One folder per source: DM names a local dump folder <dir>.<task>, the same for every worker.
        "loaders": {s: {"pool-size": 16, "dir": str(dumps / s), "import-mode": "logical", "on-duplicate-logical": "replace"}
                    for s in sources},
        "syncers": {"global": {"worker-count": 16, "batch": 100, **setup.syncer}},
        "mysql-instances": [{"source-id": s, "block-allow-list": "bw", "route-rules": ["merge"], "mydumper-config-name": "global",
                             "loader-config-name": s, "syncer-config-name": "global", **setup.instance} for s in sources],
        **setup.task,
    }  # fmt: skip
    if setup.shard_mode:
        task["shard-mode"] = setup.shard_mode
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def source_file(path: Path, i: int, port: int, extra: dict[str, Any]) -> Path:
    source = {"source-id": f"shard-{i:02d}", "flavor": "mariadb", "enable-gtid": False,
              "from": {"host": "127.0.0.1", "port": port, "user": "root", "password": ""}, **extra}  # fmt: skip
    path.write_text(yaml.safe_dump(source, sort_keys=False))
    return path


def lock_events(dm: DMCluster) -> dict[str, int]:
    """What dm-master's log says of the shard DDL locks: resolved, and DDL infos received."""
    events = parse_log(read_log(dm.master_log), ("the lock for the shard DDL lock operation has been resolved", "receive a shard DDL info"))
    return {"resolved": sum(1 for e in events if e.message.startswith("the lock")),
            "ddl_infos": sum(1 for e in events if e.message.startswith("receive"))}  # fmt: skip


def locks_left(dm: DMCluster) -> list[dict[str, Any]] | None:
    """The shard DDL locks dm-master still holds (``shard-ddl-lock``: ID, mode, owner, synced
    and unsynced sources), None if it cannot say."""
    try:
        answer = dm.ctl("shard-ddl-lock", timeout=60)
    except Exception:  # noqa: BLE001 - reported as unknown
        return None
    return list(answer.get("locks") or []) if answer.get("result") else None


def _status(dm: DMCluster) -> dict[str, Any] | None:
    """``query-status`` of the task (the validator's counts among it), None if it cannot say."""
    try:
        return dm.ctl("query-status", TASK, timeout=60)
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


def _validations(status: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [st["validation"] for src in (status or {}).get("sources", []) for st in src.get("subTaskStatus", []) if st.get("validation")]


def status_at_end(dm: DMCluster, validator: bool, timeout: float = 60) -> tuple[dict[str, Any] | None, float | None]:
    """``query-status`` once DM caught up; with a validator, once it has no row pending (it
    checks a row again every ``validate-interval``, 10 s, until the row matches downstream),
    and the seconds that took (None: rows still pending after ``timeout``)."""
    began = time.monotonic()
    while True:
        status = _status(dm)
        found = _validations(status)
        if not validator or (found and all(_counts(v.get("pendingRowsStatus")) == [0, 0, 0] for v in found)):
            return status, time.monotonic() - began
        if time.monotonic() - began > timeout:
            return status, None
        time.sleep(2)


def _counts(text: str | None) -> list[int] | None:
    """``"insert/update/delete: 497/91/0"`` -> [497, 91, 0]."""
    m = re.search(r": *(\d+(?:/\d+)*)$", text or "")
    return [int(n) for n in m.group(1).split("/")] if m else None


def run_lab(setup: Setup, workdir: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """One run of ``setup`` in ``workdir``; its record."""
    workdir.mkdir(parents=True)
    ups = [MariaDB(workdir / f"upstream{i}", extra_args=upstream_args(i, setup.shards)) for i in range(1, setup.shards + 1)]
    cluster: Cluster | None = None
    sidecars: list[Sidecar] = []
    dm = load = sampler = restarter = None
    try:
        for i, up in enumerate(ups, 1):
            up.start()
            preload(up.port, shard_schema(i), setup.scale, seed=i)
        cluster = Cluster(workdir / "cluster", servers=setup.servers, graceful_wait=setup.graceful_wait)
        for server in cluster.servers:
            server.general_log = setup.general_log
        began = time.time()
        cluster.start()
        cluster.create_user(DM_USER, DM_PASSWORD)
        log(
            f"  {setup.shards} shard(s) preloaded ({setup.scale} orders each); cluster up in {time.time() - began:.0f} s on {cluster.ports}"
        )
        if setup.target == "proxy":
            port = free_port()
            overrides = sidecar_overrides(cluster.servers, DM_USER, DM_PASSWORD, setup.buffer_window)
            for i in range(setup.shards):
                sidecars.append(Sidecar(workdir / f"proxy{i + 1}", cluster.ports, sidecar_address(i), port, **overrides).start())
            host = SIDECAR_HOST
            dm = DMCluster(workdir / "dm", workers=setup.shards, sidecars=[s.host for s in sidecars])
        else:
            host, port = "127.0.0.1", cluster.ports[0]
            dm = DMCluster(workdir / "dm", workers=setup.shards)
        dm.start()
        for i, up in enumerate(ups, 1):
            dm.create_source(source_file(workdir / f"source{i}.yaml", i, up.port, setup.source))
        task = task_file(workdir / "task.yaml", setup, host, port, workdir / "dumped")
        check = dm.ctl("check-task", str(task))
        statements = [(fraction * setup.duration, what) for fraction, what in setup.statements]
        load = ShardLoad([up.port for up in ups], setup.rate, statements)
        sampler = ShardSampler(cluster.servers, dm, load)
        restarts = 0 if setup.faults == "none" else setup.restarts or max(1, int(setup.duration // setup.interval))
        restarter = Restarter(cluster_event(cluster, SIGNALS.get(setup.faults, _signal.SIGTERM)), setup.interval, log, restarts,
                              start_to_start=True)  # fmt: skip
        started = time.time()
        dm.start_task(task)
        load.start()
        sampler.start()
        if restarts:
            restarter.start()
        log(f"  task started ({setup.shard_mode or 'no'} shard mode, {setup.target}); load {setup.rate:g} txn/s per shard for "
            f"{setup.duration:g} s; {restarts} {setup.faults} faults every {setup.interval:g} s")  # fmt: skip
        time.sleep(max(0.0, started + setup.duration - time.time()))
        limit = time.time() + restarts * (setup.interval + 180)
        while restarter.is_alive() and time.time() < limit:
            restarter.join(1.0)
        restarter.stop_event.set()
        stats = load.stop()
        ended = time.time()
        upstream = shard_checksums([up.port for up in ups], setup.shards)
        log(f"  load stopped: {stats.transactions} transactions, {len(stats.errors)} failed upstream; waiting for DM to catch up")
        caught_up = wait_merged(upstream, cluster.ports, setup.catch_up)
        sampler.stop_event.set()
        sampler.join(10)
        downstream = merged_checksums(cluster.ports) or {}
        status, settled = status_at_end(dm, validator="validators" in setup.task)
        corpus = dm_statements(cluster.error_log_text()) if setup.general_log else None
        return {
            "label": setup.label, "target": setup.target, "shard_mode": setup.shard_mode, "faults": setup.faults,
            "shards": setup.shards, "servers": setup.servers, "graceful_wait": setup.graceful_wait, "check_task": check.get("result"),
            "started": started, "ended": ended, "caught_up_after": caught_up, "restarts_planned": restarts,
            "restarts": restarter.restarts, "load": {"transactions": stats.transactions, "statements": stats.statements,
                                                     "errors": len(stats.errors), "error_samples": stats.errors[:5]},
            "ddl": load.ddl, "lag": sampler.lag, "units": sampler.units,
            "dm": dm_events(dm, started, sync_running_at=sampler.sync_running_at),
            "locks": {**lock_events(dm), "left": locks_left(dm)}, "status_at_end": status, "validator_settled_after": settled,
            "proxies": [proxy_numbers(s) for s in sidecars],
            "tables": {name: {"upstream": upstream[name], "downstream": downstream.get(name)} for name in upstream},
            "identical": upstream == downstream, "corpus": corpus,
        }  # fmt: skip
    finally:
        for thread in (restarter, sampler):
            if thread is not None:
                thread.stop_event.set()
                if thread.is_alive():
                    thread.join(120)
        if load is not None:
            load.stop()
        stops = [
            dm.stop if dm else None,
            *(s.stop for s in sidecars),
            (lambda: teardown(cluster)) if cluster else None,
            *(u.stop for u in ups),
        ]
        for stop in stops:
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # noqa: BLE001 - the others are stopped anyway
                    log(f"  stopping: {exc}")
        for name in ("cluster/store/data", "cluster/pd/data", "dumped", "dm/master-data"):
            shutil.rmtree(workdir / name, ignore_errors=True)
        for up in ups:
            shutil.rmtree(up.basedir / "data", ignore_errors=True)


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """The figures of a run's table row."""
    by, sync_at = r["dm"]["by_phase"], r["dm"]["sync_started"]
    lag = [v for t, v in r["lag"] if v is not None and t <= r["ended"]]
    in_sync = [v for t, v in r["lag"] if v is not None and sync_at is not None and sync_at <= t <= r["ended"]]
    refusals: dict[str, int] = {}
    for p in r["proxies"]:
        for reason, n in p["refused_by_reason"].items():
            refusals[reason] = refusals.get(reason, 0) + n
    left = r["locks"]["left"]
    return {
        "faults": f"{len(r['restarts'])} {r['faults']}", "pauses": r["dm"]["pauses"], "paused_s": r["dm"]["paused_s"],
        "failed": sum(p["failed_txns"] for p in by.values()),
        "recoveries": sum(sum(p["recoveries"].values()) for p in r["proxies"]), "moved": sum(p.get("moved", 0) for p in r["proxies"]),
        "refused_1158": sum(p["refused_1158"] for p in r["proxies"]), "refusals": refusals,
        "locks_resolved": r["locks"]["resolved"], "locks_left": "?" if left is None else len(left),
        "max_lag": max(lag) if lag else None, "sync_lag": (max(in_sync), statistics.median(in_sync)) if in_sync else None,
        "caught_up_after": r["caught_up_after"], "identical": r["identical"], "validation": validation_of(r.get("status_at_end")),
    }  # fmt: skip


def validation_of(status: dict[str, Any] | None) -> str | None:
    """The validator's rows (processed, pending, and in error: new / ignored / resolved) at the
    end of the run, from ``query-status``; None without a validator."""
    numbers = [{k: str(v.get(k, "")).rsplit(": ", 1)[-1] for k in ("errorRowsStatus", "processedRowsStatus", "pendingRowsStatus")}
               for v in _validations(status)]  # fmt: skip
    return "; ".join(f"errors {n['errorRowsStatus']}, processed {n['processedRowsStatus']}, pending {n['pendingRowsStatus']}"
                     for n in numbers) or None  # fmt: skip


ROWS = [
    ("faults (tidb-server restarts / crashes)", lambda s: s["faults"]),
    ("DM pauses (every dm-worker's log)", lambda s: str(s["pauses"])),
    ("  time paused (s)", lambda s: f"{s['paused_s']:.0f}"),
    ("failed batches / statements as DM sees them", lambda s: str(s["failed"])),
    ("proxy recoveries / sessions moved", lambda s: f"{s['recoveries']:.0f} / {s['moved']:.0f}"),
    ("proxy: refused, 1158", lambda s: f"{s['refused_1158']:.0f}"),
    ("shard DDL locks resolved (dm-master) / left", lambda s: f"{s['locks_resolved']} / {s['locks_left']}"),
    ("max lag while the load ran (s)", lambda s: "-" if s["max_lag"] is None else f"{s['max_lag']:.1f}"),
    ("  in the sync: max / median (s)", lambda s: "-" if s["sync_lag"] is None else f"{s['sync_lag'][0]:.1f} / {s['sync_lag'][1]:.1f}"),
    ("caught up after the load (s)", lambda s: "no" if s["caught_up_after"] is None else f"{s['caught_up_after']:.0f}"),
    ("tables identical (count + NULL-safe checksum)", lambda s: "yes" if s["identical"] else "NO"),
]
VALIDATOR_ROWS = [
    ("validator's rows in error (new/ignored/resolved)", lambda s: _part(s["validation"], "errors")),
    ("  processed (insert/update/delete)", lambda s: _part(s["validation"], "processed")),
    ("  pending at the end (insert/update/delete)", lambda s: _part(s["validation"], "pending")),
]


def _part(validation: str | None, name: str) -> str:
    return "-" if validation is None else re.search(rf"{name} ([^,;]*)", validation).group(1)


def render(runs: list[dict[str, Any]]) -> str:
    heads = [r["label"] or f"{r['shard_mode']} {r['faults']} {r['target']}" for r in runs]
    width = max([22, *(len(h) + 2 for h in heads)])
    lines = [f"{'':46}" + "".join(f"{h:>{width}}" for h in heads)]
    sums = [summary(r) for r in runs]
    for label, cell in ROWS + (VALIDATOR_ROWS if any(s["validation"] for s in sums) else []):
        lines.append(f"{label:46}" + "".join(f"{cell(s):>{width}}" for s in sums))
    reasons = sorted({k for s in sums for k in s["refusals"]})
    for reason in reasons:
        lines.append(f"  {reason[:44]:44}" + "".join(f"{s['refusals'].get(reason, 0):>{width}}" for s in sums))
    kinds = sorted({k for r in runs for k in r["dm"]["failed"]})
    for kind in kinds[:8]:
        lines.append(f"  pause: {kind[:38]:38}" + "".join(f"{r['dm']['failed'].get(kind, 0):>{width}}" for r in runs))
    for r, head in zip(runs, heads):
        for d in r["ddl"]:
            lines.append(f"  {head}: +{d['at']:.0f} s {d['sql'][:60]}: {'; '.join(d['results'])[:120]}")
    return "\n".join(lines)


def unavailable(targets: list[str]) -> list[str]:
    reasons = [dm_unavailable_reason(), cluster_unavailable_reason()]
    if "proxy" in targets:
        reasons.append(sidecar_unavailable_reason())
    return [r for r in reasons if r]


def main_loop(prog: str, setups: list[Setup], out: Path | None, argv: list[str] | None, settings: dict[str, Any]) -> int:
    """Run ``setups`` one after the other, each in a fresh lab; write table.txt, results.json
    (and with a general log the DM statements: dm_statements-<label>.jsonl)."""
    sigterm_as_interrupt()
    reasons = unavailable([s.target for s in setups])
    for reason in reasons:
        print(f"{prog}: {reason}", file=sys.stderr)
    if reasons:
        return 2
    now = _dt.datetime.now()
    out = (out or REPO / "bench" / "results" / f"{now:%Y%m%d-%H%M%S}-{prog.split('.')[-1]}").resolve()
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    results: dict[str, Any] = {"meta": run_meta(now, prog, argv, settings=settings | {"out": str(out)}), "runs": []}
    for setup in setups:
        name = re.sub(r"[^a-z0-9]+", "-", (setup.label or f"{setup.shard_mode}-{setup.faults}-{setup.target}").lower())
        log(f"{name}: fresh lab in {out / name}")
        record = run_lab(setup, out / name, log)
        if record.get("corpus") is not None:
            with open(out / f"dm_statements-{name}.jsonl", "w") as f:
                f.writelines(json.dumps(entry) + "\n" for entry in record["corpus"])
        results["runs"].append(record)
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        log("  " + json.dumps(summary(record), default=str))
    table = render(results["runs"])
    (out / "table.txt").write_text(table + "\n")
    print(table)
    print(f"\nresults: {out}")
    return 0 if all(r["identical"] for r in results["runs"]) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.dm_shards", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shard-modes", default="pessimistic,optimistic", help="shard-mode values, one lab each (default both)")
    p.add_argument(
        "--faults", default="rolling,kill", help="rolling (SIGTERM in turn), kill (SIGKILL in turn), none (default rolling,kill)"
    )
    p.add_argument("--targets", default="proxy", help="proxy (a sidecar per worker), direct (default proxy)")
    p.add_argument("--shards", type=int, default=2, help="upstream shards, one dm-worker each (default 2)")
    lab_arguments(p, "dm_shards", duration=160, rate=70, per_shard=" per shard")
    p.add_argument("--general-log", action="store_true", help="TiDB's general log on: DM's statements, one per shape")
    return p.parse_args(argv)


def lab_arguments(p: argparse.ArgumentParser, bench: str, duration: float, rate: float, per_shard: str = "") -> None:
    """The lab's options (``Setup``'s fields) that bench.dm_shards and bench.dm_paths share."""
    p.add_argument("--duration", type=float, default=duration, help=f"seconds of load and faults (default {duration:g})")
    p.add_argument("--interval", type=float, default=8, help="seconds from one fault to the next, start to start (default 8)")
    p.add_argument("--servers", type=int, default=2, help="tidb-servers in the cluster (default 2)")
    p.add_argument("--graceful-wait", type=int, default=3, help="every tidb-server's graceful-wait-before-shutdown (default 3)")
    p.add_argument("--scale", type=int, default=5000, help=f"orders preloaded{per_shard} (default 5000)")
    p.add_argument("--rate", type=float, default=rate, help=f"transactions per second{per_shard} (default {rate:g})")
    p.add_argument("--catch-up", type=float, default=300, help="seconds DM may take to catch up at the end (default 300)")
    p.add_argument("--out", type=Path, help=f"results folder (default bench/results/<timestamp>-{bench})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    common = {k: getattr(args, k) for k in ("shards", "duration", "interval", "servers", "graceful_wait", "scale", "rate", "catch_up",
                                            "general_log")}  # fmt: skip
    setups = [Setup(shard_mode=mode, faults=faults, target=target, **common)
              for mode in args.shard_modes.split(",") for faults in args.faults.split(",") for target in args.targets.split(",")]  # fmt: skip
    return main_loop("bench.dm_shards", setups, args.out, argv, vars(args))


if __name__ == "__main__":
    sys.exit(main())
