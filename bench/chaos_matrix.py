"""The chaos scenarios of the test suite, each run directly and through the proxy, side by side.

    python -m bench.chaos_matrix [--duration 20] [--interval 4]

Scenarios (DM-like Go workload, 8 pinned go-sql-driver connections, 10-row transactions,
MariaDB restarted every few seconds with SIGTERM and SIGKILL alternately):

- safe: DM safe mode (REPLACE), proxy with recovery.idempotent = "safe-mode";
- insert: plain INSERT + `n = n + k` counters, proxy defaults (an in-doubt COMMIT must surface);
- insert-marker: the same with recovery.commit_marker = true;
- prepared: safe mode through server-side prepared statements (interpolateParams=false).

Prints client-visible errors and the row check for each, and writes chaos_matrix.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.lab.chaos import run_chaos  # noqa: E402
from tests.lab.goclient import build_goclient  # noqa: E402
from tests.lab.mariadb import MariaDB  # noqa: E402
from tests.lab.proxy import ProxyProcess  # noqa: E402

SCENARIOS = [
    ("safe", {"sql": "safe"}, {"recovery": {"idempotent": "safe-mode"}}),
    ("insert", {"sql": "insert"}, {}),
    ("insert-marker", {"sql": "insert"}, {"recovery": {"commit_marker": True}}),
    ("prepared", {"sql": "safe", "extra": {"extra_dsn": "interpolateParams=false"}}, {"recovery": {"idempotent": "safe-mode"}}),
]


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="chaos-matrix-"))
    build_goclient()
    server = MariaDB(work / "mariadb")
    server.start()
    results = []
    try:
        server.create_user("app", "apppw")
        server.create_database("test")
        for name, workload, overrides in SCENARIOS:
            label = name.replace("-", "_")
            run = {"duration": args.duration, "interval": args.interval, **workload}
            direct = await run_chaos(f"{label}_direct", server, server.port, work, **run)
            proxy = ProxyProcess(work / f"proxy-{name}", server.port, log={"level": "info"}, **overrides).start()
            try:
                via = await run_chaos(f"{label}_proxy", server, proxy.port, work, **run)
            finally:
                proxy.stop()
            results.append({"scenario": name, "direct": direct.summary(), "proxy": via.summary()})
            print(
                f"{name:14s} direct: {direct.errors:4d} errors, rows {direct.summary()['row_check']:3s} | "
                f"proxy: {via.errors:4d} errors, rows {via.summary()['row_check']:3s}, "
                f"restarts {len(via.restarts)}, longest stall {via.summary()['max_txn_latency_ms']} ms",
                flush=True,
            )
    finally:
        server.stop()
    out = work / "chaos_matrix.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"details: {out}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=20, help="seconds per run (default 20)")
    parser.add_argument("--interval", type=float, default=4, help="seconds between restarts (default 4)")
    trio.run(main, parser.parse_args())


if __name__ == "__main__":
    cli()
