"""The replicator-like workload: tests/goclient (go-sql-driver/mysql configured as TiDB DM does).

16 workers each pin one connection and loop START TRANSACTION; B x REPLACE INTO (safe mode);
UPDATE counters; COMMIT. The tables are recreated (directly on the database) before every run
so every target starts from the same table size. Beside the middle process's CPU per statement,
the database's own (mariadbd or tidb-server) is measured on every target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench.middle import MiddleMeter
from bench.procstat import CpuMeter
from bench.workloads import Metric, Settings, Workload, WorkloadError, WorkloadSkipped

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target


def goclient():
    """tests.lab.goclient, after checking Go and the driver are installed."""
    from tests.lab import goclient as gc

    reason = gc.go_unavailable_reason()
    if reason:
        raise WorkloadSkipped(reason)
    return gc


def statements_per_txn(settings: Settings) -> int:
    """START TRANSACTION, the batch's REPLACEs (one multi-row one, or one per row), the UPDATE
    of the counters, COMMIT."""
    return (1 if settings.replicator_multirow else settings.replicator_batch) + 3


class ReplicatorWorkload(Workload):
    def __init__(self) -> None:
        super().__init__(
            name="replicator",
            title="replicator-like: go-sql-driver, 16 pinned conns, batched txns (safe mode)",
            metrics=[
                Metric("txn_per_s", "txn/s", "txn/s", "higher", digits=0),
                Metric("stmt_per_s", "stmt/s", "q/s", "higher", digits=0),
                Metric("p95_ms", "p95 txn latency", "ms", "lower", digits=2),
                # Each statement's own round trip (BEGIN, the writes, COMMIT): at a fixed
                # --replicator-rate, what the middle adds to every statement DM sends.
                Metric("stmt_p50_ms", "p50 stmt latency", "ms", "lower", digits=3),
                Metric("stmt_p99_ms", "p99 stmt latency", "ms", "lower", digits=3),
                Metric("errors", "client errors", "", "lower", digits=0),
                Metric("cpu_us_per_stmt", "CPU/stmt", "µs", "lower", intermediary_only=True),
                # The database's own CPU per statement, beside the middle's: what share of the
                # gap to direct the middle process is.
                Metric("db_cpu_us_per_stmt", "server CPU/stmt", "µs", "lower", ratio=False),
            ],
        )
        self.per_statement_meter = True

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        gc = goclient()
        env.log("building tests/goclient")
        gc.build_goclient()
        self.info.update(conns=settings.replicator_conns, batch=settings.replicator_batch, sql="safe",
                         multirow=settings.replicator_multirow, rate=settings.replicator_rate or None,
                         statements_per_txn=statements_per_txn(settings))  # fmt: skip

    def before_run(self, env: BenchEnv, settings: Settings) -> None:
        assert env.db is not None
        goclient().run_goclient("setup", port=env.db.port, conns=settings.replicator_conns, timeout=120)

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        gc = goclient()
        meter = MiddleMeter(env, target).start()
        server = CpuMeter(env.db.pid).start()
        try:
            run = gc.run_goclient(
                "workload",
                port=target.port,
                conns=settings.replicator_conns,
                duration=settings.replicator_time,
                batch=settings.replicator_batch,
                sql="safe",
                multirow=settings.replicator_multirow,
                rate=settings.replicator_rate,
                timeout=settings.replicator_time + 120,
                check=False,
                full=True,
            )
        except gc.GoClientError as e:
            raise WorkloadError(str(e)) from None
        finally:
            meter.stop()
            server.stop()
        data = run.data
        if run.returncode != 0 or not data.get("ok", False):
            raise WorkloadError(f"goclient workload failed against {target.name}:\n{run.describe()}")
        txns = int(data["committed_txns"])
        statements = txns * statements_per_txn(settings)
        elapsed = float(data.get("elapsed") or settings.replicator_time)
        lat = data.get("txn_latency_ms", {})
        stmt_lat = data.get("stmt_latency_ms", {})
        return {
            "txn_per_s": float(data.get("txns_per_sec") or txns / elapsed),
            "stmt_per_s": statements / elapsed,
            "p95_ms": lat.get("p95"),
            "stmt_p50_ms": stmt_lat.get("p50"),
            "stmt_p99_ms": stmt_lat.get("p99"),
            "errors": float(data.get("error_count", 0)),
            **meter.per_statement(statements),
            "db_cpu_us_per_stmt": server.used * 1e6 / statements if server.used is not None and statements else None,
            "_p99_ms": lat.get("p99"),
            "_max_ms": lat.get("max"),
            "_committed_txns": txns,
            "_error_kinds": data.get("errors") or {},
        }
