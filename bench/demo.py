"""The README demo: a replicator-like workload while the database restarts, with and without
replay-proxy, side by side.

    python -m bench.demo [--duration 30] [--interval 4] [--sql safe|insert]

It starts a throwaway MariaDB (standing in for TiDB) in a temp dir, the proxy in front of it
(configs/demo.toml's settings), builds the Go client (go-sql-driver/mysql with DM's DSN), and
runs the same workload twice — directly and through the proxy — while MariaDB is restarted
every few seconds (SIGTERM and SIGKILL alternately). Then it verifies every row.
"""

from __future__ import annotations

import argparse
import tempfile
import tomllib
from pathlib import Path

import trio

from bench import REPO
from tests.lab.chaos import CHAOS_GRACE_S, ChaosResult, recoveries, run_chaos
from tests.lab.goclient import build_goclient
from tests.lab.mariadb import MariaDB
from tests.lab.proxy import ProxyProcess


def demo_config_overrides() -> dict:
    """configs/demo.toml minus what depends on this run (addresses, ports)."""
    data = tomllib.loads((REPO / "configs" / "demo.toml").read_text())
    for key in ("listen", "backend", "admin", "users", "name"):
        data.pop(key, None)
    return data


def table(direct: ChaosResult, proxied: ChaosResult) -> str:
    d, p = direct.summary(), proxied.summary()
    rows = [
        ("client error events (see *)", d["client_errors"], p["client_errors"]),
        ("failed transactions", d["failed_txns"], p["failed_txns"]),
        ("stuck sessions", d["stuck_workers"], p["stuck_workers"]),
        ("committed transactions", d["committed_txns"], p["committed_txns"]),
        ("transactions per second", d["txns_per_sec"], p["txns_per_sec"]),
        ("longest stall (ms)", _ms(d["longest_stall_ms"]), _ms(p["longest_stall_ms"])),
        ("rows verified", d["rows_verified"], p["rows_verified"]),
        ("row check (lost/doubled)", d["row_check"], p["row_check"]),
        ("restarts", len(d["restarts"]), len(p["restarts"])),
    ]
    width = max(len(r[0]) for r in rows)
    out = [f"{'':<{width}}  {'direct':>14}  {'through proxy':>14}"]
    out += [f"{name:<{width}}  {str(a):>14}  {str(b):>14}" for name, a, b in rows]
    out += [
        "",
        "* every error the client saw, each failed reconnect attempt included (one per 100 ms while",
        "  MariaDB is down); failed transactions: BEGIN .. COMMIT attempts that ended in an error (what",
        f"  a replicator retries); stuck: still waiting for the server {CHAOS_GRACE_S} s after the run (an error).",
        "  longest stall: a transaction's first attempt to its COMMIT, or to the end if it never committed.",
    ]
    return "\n".join(out)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


async def main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="replay-proxy-demo-"))
    print(f"workdir {work}")
    print("building the Go client (go-sql-driver/mysql, DM's DSN) ...")
    build_goclient()
    server = MariaDB(work / "mariadb")
    server.start()
    proxy = None
    try:
        server.create_user("app", "apppw")
        server.create_database("test")
        proxy = ProxyProcess(work / "proxy", server.port, **demo_config_overrides()).start()
        print(f"MariaDB on 127.0.0.1:{server.port}, replay-proxy on 127.0.0.1:{proxy.port}")
        kw = dict(sql=args.sql, duration=args.duration, interval=args.interval, conns=args.conns)
        print(f"\n[1/2] {args.duration:g}s of workload DIRECTLY against MariaDB, restarting it every {args.interval:g}s ...")
        direct = await run_chaos("direct", server, server.port, work, **kw)
        print(f"[2/2] {args.duration:g}s of the same workload THROUGH replay-proxy, restarting MariaDB every {args.interval:g}s ...")
        proxied = await run_chaos("proxied", server, proxy.port, work, **kw)
    finally:
        log = proxy.stop() if proxy is not None else ""
        server.stop()
    recovered = recoveries(log)
    print(
        f"\nDM-like workload: {args.conns} pinned connections, 10-row transactions ({args.sql} SQL),"
        f" MariaDB restarted every {args.interval:g}s (SIGTERM / SIGKILL alternately)\n"
    )
    print(table(direct, proxied))
    print(f"\nproxy sessions recovered: {recovered} times; proxy log: {work / 'proxy' / 'proxy.log'}")
    for result in (direct, proxied):
        if result.workload.get("errors"):
            print(f"\n{result.label} errors seen by the client:")
            for msg, n in sorted(result.workload["errors"].items(), key=lambda kv: -kv[1])[:5]:
                print(f"  {n:5d}  {msg[:150]}")
    # A stuck session fails the demo on either side: a hang is not a quiet run.
    ok = proxied.rows_ok and direct.rows_ok and not proxied.stuck and not direct.stuck and recovered > 0
    ok = ok and (proxied.errors == 0 or (args.sql == "insert" and all(k.startswith("commit:") for k in proxied.workload["errors"])))
    print("\nresult:", "OK" if ok else "PROBLEM (see above)")
    return 0 if ok else 1


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=30, help="seconds of workload per run (default 30)")
    parser.add_argument("--interval", type=float, default=4, help="seconds between restarts (default 4)")
    parser.add_argument("--conns", type=int, default=8, help="pinned connections (default 8)")
    parser.add_argument(
        "--sql",
        choices=["safe", "insert"],
        default="safe",
        help="safe: DM safe mode (REPLACE); insert: plain INSERT + counters (default safe)",
    )
    raise SystemExit(trio.run(main, parser.parse_args()))


if __name__ == "__main__":
    cli()
