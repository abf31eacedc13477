"""2,000 idle client connections: memory per connection and connection set-up rate.

The bench process opens N connections with PyMySQL (handshake + authentication, then one
``SELECT 1`` each, as a replicator's connection has run a few commands before it idles), waits
for the intermediary's RSS to settle and computes (RSS with N connections - RSS before) / N.
For the proxy one client connection means a pair of sockets (client side + backend side) and the
session's state. For direct, the number shown is mariadbd's own growth per connection (a server
thread per connection), for reference only.

A short warm-up (open and close 20 connections) comes first, so one-time allocations made by the
first connection (imports, caches) are not counted per connection.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pymysql

from bench import rawclient
from bench.hygiene import raise_nofile
from bench.procstat import CpuMeter, wait_rss_settled
from bench.workloads import Metric, Settings, Workload, WorkloadError

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target


def _connect(port: int) -> pymysql.connections.Connection:
    # rawclient.connect: autocommit=None (PyMySQL sends nothing after the handshake on its own),
    # ssl_disabled (no SSL context, ~90 ms, per connection).
    return rawclient.connect(port, read_timeout=30, write_timeout=30)


class IdleConnections(Workload):
    def __init__(self) -> None:
        super().__init__(
            name="idle_conns",
            title="idle client connections",
            metrics=[
                Metric("rss_kib_per_conn", "RSS/conn", "KiB", "lower", digits=1, ratio=False),
                Metric("conns_per_s", "connect rate", "conn/s", "higher", digits=0),
                Metric("cpu_ms_per_conn", "CPU/connect", "ms", "lower", intermediary_only=True, digits=2),
            ],
            targets=("direct", "haproxy", "proxy"),
            fresh_stack=True,
        )

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        limit = raise_nofile(settings.idle_conns * 2 + 1024)
        if limit < settings.idle_conns + 256:
            raise WorkloadError(f"RLIMIT_NOFILE is {limit}: too low for {settings.idle_conns} connections")
        self.title = f"{settings.idle_conns} idle client connections"
        self.info.update(conns=settings.idle_conns, note="direct column: mariadbd's RSS growth per connection (reference only)")

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        assert env.db is not None
        # The process whose memory is measured: the intermediary, or the server for direct.
        pid = target.pid if target.pid is not None else env.db.pid
        assert pid is not None
        n = settings.idle_conns
        for _ in range(20):
            _connect(target.port).close()
        time.sleep(0.5)
        before = wait_rss_settled(pid)
        conns: list[pymysql.connections.Connection] = []
        deadline = time.monotonic() + 60 + n * 0.1
        meter = CpuMeter(target.pid)
        try:
            meter.start()
            start = time.monotonic()
            for i in range(n):
                if time.monotonic() > deadline:
                    raise WorkloadError(f"opening {n} connections through {target.name} timed out after {i}")
                try:
                    conns.append(_connect(target.port))
                except pymysql.err.Error as e:
                    raise WorkloadError(f"connection {i + 1} of {n} through {target.name} failed: {e!r}") from None
            connect_s = time.monotonic() - start
            connect_cpu = meter.stop()
            for i, conn in enumerate(conns):
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1")
                        cur.fetchall()
                except pymysql.err.Error as e:
                    raise WorkloadError(f"SELECT 1 on idle connection {i} through {target.name}: {e!r}") from None
            time.sleep(0.5)
            during = wait_rss_settled(pid)
        finally:
            for conn in conns:
                try:
                    conn.close()
                except Exception:
                    pass
        time.sleep(0.5)
        try:
            after_close = wait_rss_settled(pid, timeout=3)
        except OSError:
            after_close = None
        return {
            "rss_kib_per_conn": (during - before) / n,
            "conns_per_s": n / connect_s,
            "cpu_ms_per_conn": connect_cpu * 1000 / n if connect_cpu is not None else None,
            "_rss_before_kib": before,
            "_rss_with_conns_kib": during,
            "_rss_after_close_kib": after_close,
        }
