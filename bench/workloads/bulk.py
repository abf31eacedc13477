"""Bulk transfers: a 200 MB result set and a 60 MB statement (MB/s, intermediary peak RSS).

- big_result: ``SELECT id, payload FROM bench.big`` (1000-byte rows) read by bench/rawclient.py,
  which walks the packet framing without decoding rows (so the client is not the bottleneck) and
  checks every row arrived. MB/s counts payload bytes (10^6 bytes per MB).
- big_statement: one ``SELECT LENGTH(_binary'xxx...')`` statement of N MB sent by PyMySQL (pre-encoded,
  so the client's own cost is the same for every target), repeated; the server answers with one
  row, so the time is the client -> server direction. Over 16 MiB the statement spans several
  protocol packets, and the proxy spools it (limits.spool_threshold, 4 MiB by default).

Peak RSS of the intermediary: VmHWM after resetting it (/proc/<pid>/clear_refs), cross-checked by
sampling VmRSS every 20 ms.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pymysql

from bench import rawclient
from bench.procstat import CpuMeter, PeakRss
from bench.workloads import Metric, Settings, Workload, WorkloadError

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target

ROW_BYTES = 1000
INSERT_CHUNK = 20000
MB = 1_000_000

# What both bulk workloads report: how fast the bytes went and what they cost the intermediary.
TRANSFER_METRICS = (
    Metric("mb_per_s", "throughput", "MB/s", "higher"),
    Metric("peak_rss_mb", "peak RSS", "MB", "lower", intermediary_only=True),
    Metric("rss_growth_mb", "peak RSS - RSS before", "MB", "lower", intermediary_only=True),
    Metric("cpu_ms_per_mb", "CPU/MB", "ms", "lower", intermediary_only=True, digits=2),
)


def transfer_numbers(mb: float, elapsed: float, peak: PeakRss, cpu: float | None, pid: int | None) -> dict[str, float | None]:
    """The TRANSFER_METRICS values for ``mb`` megabytes moved in ``elapsed`` seconds."""
    return {
        "mb_per_s": mb / elapsed,
        "peak_rss_mb": peak.peak_kib * 1024 / MB if peak.peak_kib is not None else None,
        "rss_growth_mb": (peak.peak_kib - peak.start_kib) * 1024 / MB if peak.peak_kib is not None else None,
        "cpu_ms_per_mb": cpu * 1000 / mb if cpu is not None else None,
        "_elapsed_s": elapsed,
        "_rss_before_mb": peak.start_kib * 1024 / MB if pid else None,
    }


class BigResult(Workload):
    def __init__(self) -> None:
        super().__init__(
            name="big_result",
            title="big result set (raw streaming reader)",
            metrics=list(TRANSFER_METRICS),
            targets=("direct", "haproxy", "proxy"),
            fresh_stack=True,
        )
        self.rows = 0

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        assert env.db is not None
        self.rows = settings.big_result_mb * MB // ROW_BYTES
        self.title = f"{settings.big_result_mb} MB result set (raw streaming reader)"
        self.info.update(rows=self.rows, row_bytes=ROW_BYTES, mb=settings.big_result_mb)
        env.log(f"big_result: filling bench.big with {self.rows} rows of {ROW_BYTES} bytes")
        conn = env.db.admin(database="bench", read_timeout=600, write_timeout=600)
        try:
            with conn.cursor() as cur:
                cur.execute("DROP TABLE IF EXISTS bench.big")
                cur.execute(f"CREATE TABLE bench.big (id INT PRIMARY KEY, payload VARBINARY({ROW_BYTES})) ENGINE=InnoDB")
                for lo in range(1, self.rows + 1, INSERT_CHUNK):
                    hi = min(self.rows, lo + INSERT_CHUNK - 1)
                    cur.execute(f"INSERT INTO bench.big SELECT seq, RPAD(CONCAT(seq, ':'), {ROW_BYTES}, 'x') FROM seq_{lo}_to_{hi}")
                # Warm the buffer pool so the first target does not pay for it.
                cur.execute("SELECT COUNT(*), SUM(LENGTH(payload)) FROM bench.big")
                cur.fetchall()
        finally:
            conn.close()

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        try:
            conn = rawclient.connect(target.port)
        except pymysql.err.Error as e:
            raise WorkloadError(f"cannot connect through {target.name}: {e!r}") from None
        try:
            meter = CpuMeter(target.pid)
            with PeakRss(target.pid) as peak:
                meter.start()
                start = time.monotonic()
                try:
                    rows, nbytes = rawclient.stream_query(conn, b"SELECT id, payload FROM bench.big", timeout=60 + settings.big_result_mb)
                except (rawclient.RawQueryError, OSError) as e:
                    raise WorkloadError(f"big result through {target.name}: {e}") from None
                elapsed = time.monotonic() - start
                cpu = meter.stop()
        finally:
            conn.close()
        if rows != self.rows:
            raise WorkloadError(f"big result through {target.name}: {rows} of {self.rows} rows ({nbytes} bytes)")
        return {**transfer_numbers(self.rows * ROW_BYTES / MB, elapsed, peak, cpu, target.pid), "_wire_bytes": nbytes}

    def teardown(self, env: BenchEnv, settings: Settings) -> None:
        if env.db is not None and env.db.is_running():
            env.db.query("DROP TABLE IF EXISTS bench.big")


class BigStatement(Workload):
    def __init__(self) -> None:
        super().__init__(
            name="big_statement",
            title="big statement (PyMySQL, SELECT LENGTH(_binary'...'))",
            metrics=list(TRANSFER_METRICS),
            targets=("direct", "haproxy", "proxy"),
            fresh_stack=True,
        )
        self.sql = b""
        self.size = 0

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        self.size = settings.big_statement_mb * MB
        self.sql = b"SELECT LENGTH(_binary'" + b"x" * self.size + b"')"
        self.title = f"{settings.big_statement_mb} MB statement (PyMySQL, SELECT LENGTH(_binary'...'))"
        self.info.update(statement_bytes=len(self.sql), reps=settings.big_statement_reps)

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        try:
            conn = pymysql.connect(
                host="127.0.0.1",
                port=target.port,
                user="app",
                password="apppw",
                autocommit=True,
                ssl_disabled=True,
                max_allowed_packet=256 * 1024 * 1024,
                connect_timeout=10,
                read_timeout=300,
                write_timeout=300,
            )
        except pymysql.err.Error as e:
            raise WorkloadError(f"cannot connect through {target.name}: {e}") from None
        try:
            meter = CpuMeter(target.pid)
            with PeakRss(target.pid) as peak:
                meter.start()
                start = time.monotonic()
                for _ in range(settings.big_statement_reps):
                    with conn.cursor() as cur:
                        try:
                            cur.execute(self.sql)
                            row = cur.fetchone()
                        except pymysql.err.Error as e:
                            raise WorkloadError(f"{len(self.sql)}-byte statement through {target.name} failed: {e!r}") from None
                    if not row or int(row[0]) != self.size:
                        raise WorkloadError(f"{target.name}: LENGTH() returned {row!r}, expected {self.size}")
                elapsed = time.monotonic() - start
                cpu = meter.stop()
        finally:
            conn.close()
        return transfer_numbers(len(self.sql) * settings.big_statement_reps / MB, elapsed, peak, cpu, target.pid)

    def teardown(self, env: BenchEnv, settings: Settings) -> None:
        self.sql = b""
