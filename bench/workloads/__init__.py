"""Workloads: each one runs against one target at a time and returns its metrics.

A workload declares its metrics (unit, whether higher is better, whether it only makes sense for
an intermediary, e.g. "proxy CPU per statement"), does its one-time setup directly against
MariaDB, and ``run(env, target)`` returns {metric key: value}. The runner (bench/run.py)
interleaves the targets within each round and keeps every sample.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.env import BenchEnv
    from bench.stack import Target


class WorkloadError(RuntimeError):
    """One run failed (client error, timeout, wrong result): recorded, the benchmark goes on."""


class WorkloadSkipped(RuntimeError):
    """The workload cannot run here (a tool is missing): recorded with the reason."""


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    better: str | None = "higher"  # "higher", "lower" or None (informational)
    intermediary_only: bool = False  # e.g. the proxy's own CPU or memory: no value for direct
    digits: int = 1
    ratio: bool = True  # False: direct's value measures something else, no x/direct ratio


@dataclass
class Settings:
    """Sizes and durations; ``--quick`` picks smaller ones (see run.py)."""

    rounds: int = 3
    sysbench_time: float = 20.0
    sysbench_tables: int = 4
    sysbench_table_size: int = 10000
    sysbench_ps_mode: str = "disable"
    replicator_time: float = 20.0
    replicator_conns: int = 16
    replicator_batch: int = 10
    replicator_multirow: bool = False  # one multi-row REPLACE per transaction, as DM batches
    replicator_rate: float = 0.0  # transactions per second offered (0: each worker as fast as it can)
    cpu_time: float = 15.0
    cpu_rate: int = 250  # sysbench transactions per second (oltp_write_only: 6 statements each)
    big_result_mb: int = 200
    big_statement_mb: int = 60
    big_statement_reps: int = 3
    idle_conns: int = 2000
    quick: bool = False


@dataclass
class Workload:
    name: str
    title: str
    metrics: list[Metric]
    targets: tuple[str, ...] = (
        "direct",
        "haproxy",
        "trio_pump",
        "uvloop_pump",
        "netio_pump",
        "proxy",
        "proxy_mirrored",
        "proxy_workers",
        "proxy+plugins",
    )
    info: dict[str, Any] = field(default_factory=dict)
    # Start the intermediaries afresh for this workload and for each of its rounds (memory).
    fresh_stack: bool = False
    # Its runs report per-statement numbers of the middle process through bench.middle.MiddleMeter,
    # so --instrument / --perf add their metrics to it (LOOP_METRICS, PERF_METRICS).
    per_statement_meter: bool = False

    def setup(self, env: BenchEnv, settings: Settings) -> None:
        """Once per benchmark run, before the first round, directly against MariaDB."""

    def before_run(self, env: BenchEnv, settings: Settings) -> None:
        """Before every run (outside the measurement), directly against MariaDB."""

    def run(self, env: BenchEnv, target: Target, settings: Settings) -> dict[str, float | None]:
        raise NotImplementedError

    def teardown(self, env: BenchEnv, settings: Settings) -> None:
        """After the last round."""


# With --instrument or --perf ("where does the time go"): the kernel's share of CPU/stmt first.
SYS_METRIC = Metric("sys_us_per_stmt", "  of which kernel (stime)", "µs", "lower", intermediary_only=True)
LOOP_METRICS = [
    Metric("steps_per_stmt", "trio task steps/stmt", "", "lower", intermediary_only=True, digits=2),
    Metric("io_waits_per_stmt", "epoll waits/stmt", "", "lower", intermediary_only=True, digits=2),
]
PERF_METRICS = [
    Metric("ctx_switches_per_stmt", "context switches/stmt (perf)", "", "lower", intermediary_only=True, digits=2),
    Metric("instructions_per_stmt", "instructions/stmt (perf)", "", "lower", intermediary_only=True, digits=0),
]


def cpu_us_per_statement(cpu_seconds: float | None, statements: int) -> float | None:
    if cpu_seconds is None or statements <= 0:
        return None
    return cpu_seconds * 1e6 / statements
