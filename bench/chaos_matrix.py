"""The chaos scenarios of the test suite, each run directly and through the proxy, side by side.

    python -m bench.chaos_matrix [--server mariadb|tidb] [--duration 20] [--interval 4]

DM-like Go workload (go-sql-driver as DM configures it, 8 pinned connections, 10-row
transactions); after every run every row is verified directly on the server (none lost, none
applied twice, counters exact). Workloads: ``safe`` -- DM's safe mode (REPLACE), proxy with
recovery.idempotent = "safe-mode"; ``insert`` -- plain INSERT + `n = n + k` counters, proxy
defaults (an in-doubt COMMIT must surface); ``insert-marker`` -- the same with
recovery.commit_marker = true; ``prepared`` -- safe mode through server-side prepared statements.

--server mariadb (default): MariaDB restarted with SIGTERM and SIGKILL in turn; the four workloads.

--server tidb: tidb-server (unistore, ``$REPLAY_PROXY_TIDB_SERVER`` or ~/.cache/replay-proxy/bin),
DM's session (tidb_txn_mode='optimistic'), the proxy watching TiDB's status port; disruptions:

- graceful restarts (SIGTERM) with graceful-wait-before-shutdown 0 s and 2 s;
- crash: TiDB's SQL layer dying without its storage -- the fault shim in front of tidb-server cuts
  every connection and refuses connects for a second (SIGKILL is no fault to check exact data
  after on unistore: it does not sync its writes, a killed tidb-server loses acknowledged data
  even without a proxy); the direct run goes through the same shim.

Prints one table and the errors the clients saw; writes chaos_matrix.json beside the servers'
work dir. Per side (direct, proxy): client error events (every error the client saw: each failed
reconnect attempt, one per 100 ms while the server is away, counts), failed transactions (the
transaction attempts that ended in an error, what DM counts as failed batches) and stuck
sessions (a worker still waiting for the server 50 s after the run: an error). A row fails when
a session is stuck on either side, or, through the proxy, a row does not verify, a client error
shows (in-doubt COMMITs apart for the plain insert workload) or no session was recovered.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from tests.lab.chaos import (
    CHAOS_GRACE_S,
    ChaosResult,
    chaos_problems,
    crashing,
    recoveries,
    restarting,
    run_chaos,
    start_chaos_proxy,
    tidb_backend,
)
from tests.lab.faultshim import FaultShim
from tests.lab.goclient import build_goclient
from tests.lab.mariadb import MariaDB
from tests.lab.tidb import TiDB, tidb_unavailable_reason

SAFE = ("safe", {"sql": "safe"}, {"idempotent": "safe-mode"})
INSERT = ("insert", {"sql": "insert"}, {})
MARKER = ("insert-marker", {"sql": "insert"}, {"commit_marker": True})
PREPARED = ("prepared", {"sql": "safe", "extra": {"extra_dsn": "interpolateParams=false"}}, {"idempotent": "safe-mode"})

MARIADB_WORKLOADS = [SAFE, INSERT, MARKER, PREPARED]
# (label, graceful-wait-before-shutdown, crash through the shim)
TIDB_DISRUPTIONS = [
    ("graceful restarts, wait 0 s", 0, False),
    ("graceful restarts, wait 2 s", 2, False),
    ("SQL layer crash (shim)", 0, True),
]
TIDB_WORKLOADS = [SAFE, MARKER, PREPARED]


def _stuck(result: ChaosResult) -> list[str]:
    return [f"worker {s.get('worker')} in {s.get('phase')}" for s in result.workload.get("stuck", [])] or (
        [f"{result.stuck} workers"] if result.stuck else []
    )


def row(scenario: str, workload: str, direct: ChaosResult, proxied: ChaosResult, proxy_log: str) -> dict[str, Any]:
    """One scenario, both sides, and why it fails (``problems``: empty when it passes)."""
    problems = [f"direct: {len(_stuck(direct))} sessions stuck: {_stuck(direct)[:3]}"] if direct.stuck else []
    if not direct.rows_ok:
        problems.append(f"direct: rows did not verify: {direct.verify.get('problems', [])[:3]}")
    w = proxied.workload
    problems += [
        f"proxy: {p}"
        for p in chaos_problems(
            disruptions=len(proxied.restarts),
            stuck=_stuck(proxied),
            errors=w.get("errors", {}),
            rows_ok=proxied.rows_ok,
            rows_verified=int(proxied.verify.get("checked_rows") or 0),
            rows_committed=int(w.get("committed_rows") or 0),
            row_problems=(proxied.verify.get("problems", [])[:3], proxied.corruption),
            proxy_log=proxy_log,
            allowed_errors=("commit:",) if workload == "insert" else (),
        )
    ]
    return {
        "scenario": scenario,
        "workload": workload,
        "direct": direct.summary(),
        "proxy": proxied.summary(),
        "proxy_recoveries": recoveries(proxy_log),
        "problems": problems,
    }


async def mariadb_rows(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    server = MariaDB(work / "mariadb")
    server.start()
    rows = []
    try:
        server.create_user("app", "apppw")
        server.create_database("test")
        for name, workload, recovery in MARIADB_WORKLOADS:
            label = name.replace("-", "_")
            run = {"duration": args.duration, "interval": args.interval, **workload}
            direct = await run_chaos(f"{label}_direct", server, server.port, work, **run)
            proxy = start_chaos_proxy(work / f"proxy-{name}", server.port, **recovery)
            try:
                via = await run_chaos(f"{label}_proxy", server, proxy.port, work, **run)
            finally:
                log = proxy.stop()
            rows.append(row("restarts (SIGTERM / SIGKILL)", name, direct, via, log))
            print(line(rows[-1]), flush=True)
    finally:
        server.stop()
    return rows


async def tidb_rows(args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    rows = []
    for n, (scenario, wait, crash) in enumerate(TIDB_DISRUPTIONS):
        server = TiDB(work / f"tidb-{n}", graceful_wait=wait)
        server.start()
        shim = FaultShim(server.port).start() if crash else None
        try:
            server.create_user("app", "apppw")
            server.create_database("test")
            port = shim.port if shim else server.port
            disrupt = crashing(shim) if shim else restarting(server)
            for name, workload, recovery in TIDB_WORKLOADS:
                label = f"t{n}_{name.replace('-', '_')}"
                run = {"duration": args.duration, "interval": args.interval, "disrupt": disrupt, **workload}
                direct = await run_chaos(f"{label}_direct", server, port, work, **run)
                proxy = start_chaos_proxy(work / f"proxy-{label}", port, backend=tidb_backend(server), **recovery)
                try:
                    via = await run_chaos(f"{label}_proxy", server, proxy.port, work, **run)
                finally:
                    log = proxy.stop()
                rows.append(row(scenario, name, direct, via, log))
                print(line(rows[-1]), flush=True)
        finally:
            if shim is not None:
                shim.stop()
            server.stop()
    return rows


def line(r: dict[str, Any]) -> str:
    d, p = r["direct"], r["proxy"]
    return (
        f"{r['scenario']}, {r['workload']}: direct {d['client_errors']} error events, {d['failed_txns']} failed txns, "
        f"{d['stuck_workers']} stuck, rows {d['row_check'][:40]} | proxy {p['client_errors']} error events, "
        f"{p['failed_txns']} failed txns, {p['stuck_workers']} stuck, rows {p['row_check'][:40]}, "
        f"{len(p['restarts'])} disruptions, longest stall {p['longest_stall_ms']} ms"
        + (f" | FAIL: {'; '.join(r['problems'])[:300]}" if r["problems"] else "")
    )


def render(rows: list[dict[str, Any]], header: str) -> str:
    def verified(s: dict[str, Any]) -> str:
        return f"{s['rows_verified']} {'ok' if s['row_check'] == 'ok' else 'FAIL'}"

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    def pair(r: dict[str, Any], fn) -> str:
        return f"{fn(r['direct'])} / {fn(r['proxy'])}"

    cols = [
        "scenario",
        "workload",
        "disruptions",
        "error events*",
        "failed txns",
        "stuck",
        "rows verified",
        "txns committed",
        "longest stall ms",
        "result",
    ]
    table = [
        [
            r["scenario"],
            r["workload"],
            pair(r, lambda s: len(s["restarts"])),
            pair(r, lambda s: s["client_errors"]),
            pair(r, lambda s: s["failed_txns"]),
            pair(r, lambda s: s["stuck_workers"]),
            pair(r, verified),
            pair(r, lambda s: s["committed_txns"]),
            pair(r, lambda s: ms(s["longest_stall_ms"])),
            "FAIL" if r["problems"] else "ok",
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    out = [header, "", "  ".join(c.ljust(w) for c, w in zip(cols, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(v.ljust(w) for v, w in zip(t, widths)) for t in table]
    out += [
        "",
        "each cell: direct / through the proxy",
        "* error events: every error the client saw, each failed reconnect attempt included (the workload retries a connect",
        "  every 100 ms while the server is away: up to ~10 per worker per second of downtime);",
        "  failed txns: transaction attempts (BEGIN .. COMMIT) that ended in an error or stuck, what DM sees fail;",
        f"  stuck: sessions still waiting for the server {CHAOS_GRACE_S} s after the run (an error; the row fails).",
        "  longest stall: a transaction's first attempt to its COMMIT, or to the run's end for one that never committed.",
    ]
    notes = []
    for r in rows:
        for who in ("direct", "proxy"):
            s = r[who]
            kinds = sorted(s["errors"].items(), key=lambda kv: -kv[1])[:3]
            if kinds:
                notes.append(f"  {r['scenario']}, {r['workload']}, {who}: " + "; ".join(f"{v}x {k[:110]}" for k, v in kinds))
            if s["row_check"] != "ok":
                notes.append(f"  {r['scenario']}, {r['workload']}, {who}: ROWS {s['row_check'][:300]}")
        for problem in r["problems"]:
            notes.append(f"  {r['scenario']}, {r['workload']}: FAIL {problem[:300]}")
    if notes:
        out += ["", "errors seen by the client (the most frequent kinds), row problems and failures:", *notes]
    return "\n".join(out)


async def main(args: argparse.Namespace) -> int:
    if args.server == "tidb" and tidb_unavailable_reason():
        print(f"bench.chaos_matrix: cannot run on TiDB: {tidb_unavailable_reason()}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix=f"chaos-matrix-{args.server}-"))
    build_goclient()
    started = time.monotonic()
    rows = await (tidb_rows if args.server == "tidb" else mariadb_rows)(args, work)
    if args.server == "tidb":
        header = (
            f"chaos on TiDB (tidb-server, unistore): DM-like Go workload, 8 pinned go-sql-driver connections, "
            f"10-row transactions, DM's session (tidb_txn_mode='optimistic'); {args.duration:g} s per run, a "
            f"disruption every {args.interval:g} s; direct = client -> tidb-server (through the shim for the "
            f"crash), proxy = client -> proxy -> same"
        )
    else:
        header = (
            f"chaos on MariaDB: DM-like Go workload, 8 pinned go-sql-driver connections, 10-row transactions; "
            f"{args.duration:g} s per run, a restart every {args.interval:g} s (SIGTERM / SIGKILL in turn)"
        )
    table = render(rows, header)
    out = work / "chaos_matrix.json"
    out.write_text(json.dumps(rows, indent=1))
    print()
    print(table)
    print(f"\n{time.monotonic() - started:.0f} s; details: {out}")
    return 1 if any(r["problems"] for r in rows) else 0


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=("mariadb", "tidb"), default="mariadb", help="the server (default mariadb)")
    parser.add_argument("--duration", type=float, default=20, help="seconds per run (default 20)")
    parser.add_argument("--interval", type=float, default=4, help="seconds between disruptions (default 4)")
    sys.exit(trio.run(main, parser.parse_args()))


if __name__ == "__main__":
    cli()
