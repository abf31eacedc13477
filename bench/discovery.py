"""backend.discovery on a TiDB cluster as TiDB Operator runs it: the DM-like Go workload (8
pinned go-sql-driver connections, DM's session) through the proxy, one run per kind of change,
for each mode:

- scale out: a third tidb-server added (sessions opened before reach it);
- moving addresses: a rolling restart where every tidb-server comes back on a new address;
- scale in: one tidb-server removed (its sessions moved between transactions, none lost).

The tidb-servers listen on one port at their own loopback addresses (127.0.0.2, ...), with
graceful-wait-before-shutdown ``--graceful-wait`` s. ``dns``: dnsmasq serves a name whose records
the bench changes as a headless Service's endpoints change (a terminating pod leaves first, its
replacement joins once it serves); ``pd``: the servers register in PD themselves. Every row is
verified directly on the cluster after each run.

    python -m bench.discovery                    # both modes
    python -m bench.discovery --mode pd --settle 5

Not a timed test: it prints one line per run (client errors, sessions moved and recovered,
rows verified) and writes the summaries as JSON (``--out``). Needs tidb-server, pd-server,
unistore-server (tests/lab/cluster.py) and dnsmasq.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import trio

from tests.lab.cluster import Cluster, cluster_unavailable_reason
from tests.lab.discovery import cluster_steps, discovery_backend, discovery_keys, run_with_steps
from tests.lab.dns import DOMAIN, DNSServer, dns_unavailable_reason
from tests.lab.fixtures import prepare_server
from tests.lab.proxy import ProxyProcess

NAME = f"basic-tidb-peer.{DOMAIN}"


def proxy_for(mode: str, cluster: Cluster, dns: DNSServer | None, workdir: Path) -> ProxyProcess:
    backend = discovery_backend(mode, **discovery_keys(mode, cluster, dns, NAME))
    return ProxyProcess(workdir, [], backend=backend, log={"level": "info"},
                        recovery={"buffer_window": "40s", "idempotent": "safe-mode"})  # fmt: skip


async def bench_mode(mode: str, workdir: Path, args: argparse.Namespace) -> list[dict]:
    dns = None
    if mode == "dns":
        dns = DNSServer(workdir / "dns")
        dns.start()
    cluster = Cluster(workdir / "cluster", servers=2, hosts=True, graceful_wait=args.graceful_wait)
    results = []
    try:
        cluster.start()
        prepare_server(cluster)
        if dns is not None:
            dns.set(NAME, [s.host for s in cluster.servers])
        steps = cluster_steps(cluster, dns, NAME)  # scale out, a new address for each of three, scale in
        runs = {"scale_out": steps[:1], "moving_addresses": steps[1:-1], "scale_in": steps[-1:]}
        for kind, kind_steps in runs.items():
            label = f"{mode}_{kind}"
            proxy = proxy_for(mode, cluster, dns, workdir / f"proxy-{kind}")
            with proxy:
                run = await run_with_steps(label, cluster, proxy, workdir / "run", kind_steps, tidb=True, lead=args.lead,
                                           settle=args.settle, tail=args.tail, step_time=4.0)  # fmt: skip
                run.proxy_log = proxy.stop()
            summary = run.summary()
            summary["problems"] = run.problems(min_txns=50)
            results.append(summary)
            print(
                f"{label:<24} client errors {summary['client_errors']:>3}  failed txns {summary['failed_txns']:>3}  "
                f"moved {summary['sessions_moved']:>3}  recovered {summary['sessions_recovered']:>3}  "
                f"txns {summary['committed_txns']:>6}  rows verified {summary['rows_verified']:>7} ({summary['row_check']})  "
                f"longest stall {summary['longest_stall_ms']} ms  {'; '.join(summary['problems']) or 'ok'}",
                flush=True,
            )
            for step in summary["steps"]:
                print(f"    {step['step']}: {step['what']} ({step['took_s']} s) -> sessions {step['sessions']}", flush=True)
    finally:
        cluster.stop()
        if dns is not None:
            dns.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="dns,pd", help="dns, pd, or both (comma-separated)")
    parser.add_argument("--graceful-wait", type=int, default=3, help="tidb-server's graceful-wait-before-shutdown (s)")
    parser.add_argument("--lead", type=float, default=4.0, help="workload seconds before the first change")
    parser.add_argument("--settle", type=float, default=4.0, help="seconds after each change")
    parser.add_argument("--tail", type=float, default=4.0, help="workload seconds after the last change")
    parser.add_argument("--out", default=None, help="write the summaries here (JSON)")
    args = parser.parse_args(argv)
    for reason in (cluster_unavailable_reason(), dns_unavailable_reason()):
        if reason:
            print(f"bench.discovery: {reason}", file=sys.stderr)
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="replay-proxy-discovery-"))
    print(f"workdir {workdir}", flush=True)
    started = time.monotonic()
    results = []
    for mode in args.mode.split(","):
        results += trio.run(bench_mode, mode.strip(), workdir / mode.strip(), args)
    out = Path(args.out) if args.out else workdir / "summary.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"{len(results)} runs in {time.monotonic() - started:.0f} s; summaries: {out}")
    return 1 if any(r["problems"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
