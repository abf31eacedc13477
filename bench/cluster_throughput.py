"""DM's shape of load on a TiDB cluster, without faults: directly, through HAProxy, TiProxy and
replay-proxy, side by side in one run (issue 27's "bench.run throughput for each middle").

    python -m bench.cluster_throughput [--rounds 3] [--duration 20] [--batch 100] [--out DIR]

One cluster (tests/lab/cluster.py: PD, the store, ``--servers`` tidb-servers); each middle as
bench.dm_e2e starts it (bench/dm_middles.py: the proxy as configs/dm-sidecar.toml configures it,
HAProxy in TCP mode with checks on the status ports, TiProxy finding the servers through PD),
in front of every server; ``direct`` is the first server. The load is tests/goclient, the
go-sql-driver client configured as DM does: 16 pinned connections, transactions of ``--batch``
REPLACEs (safe mode) + a counters UPDATE, COMMIT. Per run: transactions/s, p95 and p99
transaction latency, client errors, the middle's CPU per statement and the tidb-servers'.
Rounds alternate the order of the middles; the table has medians and the ratio to direct.
Every run must end with 0 client errors, or the run is reported as failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.dm_middles import LABELS, MIDDLES, start_middle
from bench.procstat import CpuMeter
from bench.servers import APP_PASSWORD, APP_USER
from tests.lab import goclient as gc
from tests.lab.cluster import Cluster, cluster_unavailable_reason

CONNS = 16


def run_once(port: int, middle_pid: int | None, servers: list[int], duration: float, batch: int) -> dict:
    """One timed load through ``port``; the numbers of the table."""
    middle, db = CpuMeter(middle_pid).start(), [CpuMeter(pid).start() for pid in servers]
    run = gc.run_goclient("workload", port=port, conns=CONNS, duration=duration, batch=batch, sql="safe",
                          timeout=duration + 120, check=False, full=True)  # fmt: skip
    middle.stop()
    for meter in db:
        meter.stop()
    data = run.data
    txns = int(data.get("committed_txns", 0))
    statements = txns * (batch + 3)  # START TRANSACTION, the REPLACEs, UPDATE, COMMIT
    lat = data.get("txn_latency_ms", {})
    db_cpu = sum(m.used or 0.0 for m in db)
    return {
        "ok": run.returncode == 0 and bool(data.get("ok")),
        "txn_per_s": txns / float(data.get("elapsed") or duration),
        "p95_ms": lat.get("p95"),
        "p99_ms": lat.get("p99"),
        "errors": int(data.get("error_count", 0)),
        "cpu_us_per_stmt": middle.used * 1e6 / statements if middle.used is not None and statements else None,
        "db_cpu_us_per_stmt": db_cpu * 1e6 / statements if statements else None,
    }


def _pid(middle) -> int | None:
    """The middle's process (None directly): the proxy keeps its Popen, the others their pid."""
    if middle is None:
        return None
    proc = getattr(middle, "proc", None)
    return proc.pid if proc is not None else middle.pid


def table(results: dict[str, list[dict]]) -> str:
    """Medians per middle, with throughput as a ratio to direct."""

    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in results[name] if r.get(key) is not None]
        return statistics.median(values) if values else None

    base = median("direct", "txn_per_s") if results.get("direct") else None
    lines = ["| | txn/s | × direct | p95 ms | p99 ms | client errors | middle CPU µs/stmt | tidb-servers' CPU µs/stmt |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, runs in results.items():
        tps = median(name, "txn_per_s")
        cells = [
            f"{tps:.0f}" if tps is not None else "-",
            f"{tps / base:.2f}" if tps and base else "-",
            *(f"{v:.1f}" if (v := median(name, k)) is not None else "-" for k in ("p95_ms", "p99_ms")),
            str(sum(r["errors"] for r in runs)),
            *(f"{v:.1f}" if (v := median(name, k)) is not None else "-" for k in ("cpu_us_per_stmt", "db_cpu_us_per_stmt")),
        ]
        lines.append(f"| {LABELS[name]} ({len(runs)} runs) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_throughput", description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=20, help="seconds per run (default 20)")
    p.add_argument("--batch", type=int, default=100, help="REPLACEs per transaction (default 100: DM's batch)")
    p.add_argument("--servers", type=int, default=3)
    p.add_argument("--middles", default=",".join(MIDDLES), help=f"comma-separated subset of {','.join(MIDDLES)}")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/cluster-throughput-<time>)")
    args = p.parse_args(argv)
    reason = cluster_unavailable_reason() or gc.go_unavailable_reason()
    if reason:
        print(f"bench.cluster_throughput: {reason}", file=sys.stderr)
        return 2
    middles = [m.strip() for m in args.middles.split(",") if m.strip()]
    out = args.out or Path(__file__).parent / "results" / time.strftime("cluster-throughput-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    gc.build_goclient()
    results: dict[str, list[dict]] = {m: [] for m in middles}
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="cluster-tput-") as tmp, Cluster(Path(tmp) / "cluster", servers=args.servers) as cluster:
        cluster.create_user(APP_USER, APP_PASSWORD)
        cluster.create_database("test")
        pids = [s.pid for s in cluster.servers]
        started = {}
        try:
            for name in middles:
                started[name] = start_middle(name, Path(tmp) / name, cluster.servers, cluster.pd.address, APP_USER, APP_PASSWORD)
            for round_no in range(args.rounds):
                order = middles if round_no % 2 == 0 else middles[::-1]
                for name in order:
                    gc.run_goclient("setup", port=cluster.servers[0].port, conns=CONNS, timeout=120)
                    port, middle = started[name]
                    result = run_once(port, _pid(middle), pids, args.duration, args.batch)
                    print(f"round {round_no + 1} {name}: {json.dumps(result)}", flush=True)
                    if not result["ok"] or result["errors"]:
                        failures.append(f"round {round_no + 1} {name}: {result['errors']} client errors")
                    results[name].append(result)
        finally:
            for _, middle in started.values():
                if middle is not None:
                    middle.stop()
        # Written before the cluster stops: a server slow to stop must not cost the results.
        text = table(results)
        (out / "results.json").write_text(json.dumps({"args": vars(args) | {"out": str(out)}, "results": results}, indent=2))
        (out / "table.md").write_text(text + "\n")
        print(text, flush=True)
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
