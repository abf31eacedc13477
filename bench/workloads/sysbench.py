"""sysbench OLTP workloads (oltp_point_select, oltp_write_only) and the fixed-rate CPU workload.

sysbench reports queries (BEGIN and COMMIT included: every statement the proxy relays) and the
95th percentile of the per-event latency. The intermediary's CPU is read from /proc before and
after the run and divided by those queries.

By default statements go over the text protocol (``--db-ps-mode=disable``), as the replicator
sends them (go-sql-driver with interpolateParams=true); ``--sysbench-ps-mode auto`` switches to
sysbench's default, server-side prepared statements (COM_STMT_PREPARE/EXECUTE).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from typing import TYPE_CHECKING

from bench.middle import MiddleMeter
from bench.workloads import Metric, Settings, Workload, WorkloadError, WorkloadSkipped

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target

DB = "sbtest"


def sysbench_args(settings: Settings, port: int, ps_mode: str | None = None) -> list[str]:
    return [
        "--db-driver=mysql",
        "--mysql-host=127.0.0.1",
        f"--mysql-port={port}",
        "--mysql-user=app",
        "--mysql-password=apppw",
        f"--mysql-db={DB}",
        f"--tables={settings.sysbench_tables}",
        f"--table-size={settings.sysbench_table_size}",
        f"--db-ps-mode={ps_mode or settings.sysbench_ps_mode}",
    ]


def parse_sysbench(out: str) -> dict[str, float]:
    """Numbers from sysbench 1.0's text report."""

    def grab(pattern: str) -> float | None:
        m = re.search(pattern, out, re.MULTILINE)
        return float(m.group(1)) if m else None

    result = {
        "queries": grab(r"^\s*queries:\s+(\d+)"),
        "qps": grab(r"^\s*queries:\s+\d+\s+\(([\d.]+) per sec"),
        "transactions": grab(r"^\s*transactions:\s+(\d+)"),
        "tps": grab(r"^\s*transactions:\s+\d+\s+\(([\d.]+) per sec"),
        "ignored_errors": grab(r"^\s*ignored errors:\s+(\d+)"),
        "reconnects": grab(r"^\s*reconnects:\s+(\d+)"),
        "p95_ms": grab(r"^\s*95th percentile:\s+([\d.]+)"),
        "avg_ms": grab(r"^\s*avg:\s+([\d.]+)"),
        "max_ms": grab(r"^\s*max:\s+([\d.]+)"),
        "elapsed": grab(r"^\s*total time:\s+([\d.]+)s"),
    }
    missing = [k for k in ("queries", "qps", "p95_ms") if result[k] is None]
    if missing:
        raise WorkloadError(f"could not read {', '.join(missing)} from sysbench output:\n{out[-2000:]}")
    return {k: v for k, v in result.items() if v is not None}


def run_sysbench(
    test: str, settings: Settings, port: int, threads: int, duration: float, rate: int | None = None, ps_mode: str | None = None,
    events: int = 0, timeout: float | None = None,
) -> dict[str, float]:  # fmt: skip
    """``events``: stop after this many events instead of after ``duration`` seconds."""
    timeout = duration + 120 if timeout is None else timeout
    cmd = [
        "sysbench",
        test,
        *sysbench_args(settings, port, ps_mode),
        f"--threads={threads}",
        f"--time={0 if events else max(1, round(duration))}",
        f"--events={events}",
        "--percentile=95",
        "--report-interval=0",
    ]
    if rate:
        cmd.append(f"--rate={rate}")
    cmd.append("run")
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise WorkloadError(f"sysbench did not finish within {timeout:.0f} s: {' '.join(cmd)}") from e
    if res.returncode != 0:
        raise WorkloadError(f"sysbench exited with {res.returncode}: {' '.join(cmd)}\n{(res.stdout + res.stderr)[-3000:]}")
    return parse_sysbench(res.stdout)


class SysbenchSetup:
    """sysbench prepare, once per benchmark run (shared by every sysbench workload)."""

    done = False

    @classmethod
    def ensure(cls, env: BenchEnv, settings: Settings) -> None:
        if cls.done:
            return
        if shutil.which("sysbench") is None:
            raise WorkloadSkipped("sysbench not found on PATH (Debian: apt-get install sysbench)")
        assert env.db is not None
        env.log(f"sysbench prepare: {settings.sysbench_tables} tables x {settings.sysbench_table_size} rows")
        cmd = ["sysbench", "oltp_common", *sysbench_args(settings, env.db.port), "--threads=2", "cleanup"]
        subprocess.run(cmd, capture_output=True, timeout=300)
        cmd[-1] = "prepare"
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise WorkloadError(f"sysbench prepare failed: {(res.stdout + res.stderr)[-3000:]}")
        cls.done = True


class SysbenchWorkload(Workload):
    """``ps_mode``: this workload's own ``--db-ps-mode`` (``auto``: prepared statements, the
    ``_ps`` variants); None: ``--sysbench-ps-mode``."""

    def __init__(self, test: str, threads: int, ps_mode: str | None = None) -> None:
        short = test.replace("oltp_", "")
        prepared = ps_mode == "auto"
        super().__init__(
            name=f"{short}_{threads}t" + ("_ps" if prepared else ""),
            title=f"sysbench {test}, {threads} thread{'s' if threads > 1 else ''}" + (", prepared statements" if prepared else ""),
            metrics=[
                Metric("qps", "QPS", "q/s", "higher", digits=0),
                Metric("p95_ms", "p95 latency", "ms", "lower", digits=2),
                Metric("cpu_us_per_stmt", "CPU/stmt", "µs", "lower", intermediary_only=True),
            ],
        )
        self.test = test
        self.threads = threads
        self.ps_mode = ps_mode
        self.per_statement_meter = True

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        SysbenchSetup.ensure(env, settings)
        self.info["ps_mode"] = self.ps_mode or settings.sysbench_ps_mode
        self.info["tables"] = f"{settings.sysbench_tables} x {settings.sysbench_table_size} rows"

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        meter = MiddleMeter(env, target).start()
        try:
            out = run_sysbench(self.test, settings, target.port, self.threads, settings.sysbench_time, ps_mode=self.ps_mode)
        finally:
            meter.stop()
        return {
            "qps": out["qps"],
            "p95_ms": out["p95_ms"],
            **meter.per_statement(out["queries"]),
            "_queries": out["queries"],
            "_ignored_errors": out.get("ignored_errors", 0),
            "_reconnects": out.get("reconnects", 0),
        }


class CpuPerStatement(Workload):
    """A fixed offered load (sysbench --rate), so CPU per statement does not depend on throughput."""

    def __init__(self) -> None:
        super().__init__(
            name="cpu_per_stmt",
            title="CPU per statement at a fixed rate (sysbench oltp_write_only --rate, 4 threads)",
            metrics=[
                Metric("cpu_us_per_stmt", "CPU/stmt", "µs", "lower", intermediary_only=True),
                Metric("qps", "QPS (offered)", "q/s", None, digits=0),
                Metric("p95_ms", "p95 latency", "ms", "lower", digits=2),
            ],
        )
        self.per_statement_meter = True

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        SysbenchSetup.ensure(env, settings)
        self.info["rate_tps"] = settings.cpu_rate
        self.info["ps_mode"] = settings.sysbench_ps_mode

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        meter = MiddleMeter(env, target).start()
        try:
            out = run_sysbench("oltp_write_only", settings, target.port, 4, settings.cpu_time, rate=settings.cpu_rate)
        finally:
            meter.stop()
        return {
            **meter.per_statement(out["queries"]),
            "qps": out["qps"],
            "p95_ms": out["p95_ms"],
            "_queries": out["queries"],
            "_ignored_errors": out.get("ignored_errors", 0),
        }
