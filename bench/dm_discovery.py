"""bench.dm_e2e on a cluster as TiDB Operator runs it: ``--faults moving`` (a rolling restart
where every tidb-server comes back on a new address) and ``--discovery dns|pd`` (how the proxy
finds the servers).

The cluster's tidb-servers then listen on one port at their own loopback addresses, like pods
(tests/lab/cluster.py with ``hosts``: 127.0.0.2, 127.0.0.3, ...). A move stops a server with
SIGTERM (its graceful wait first) and starts it on an address no server uses (``free_host``).
``dns``: dnsmasq (tests/lab/dns.py) serves ``basic-tidb-peer.lab.test``, whose records change as
a headless Service's endpoints do (tests/lab/discovery.py ``Endpoints``: a terminating pod leaves
the answer at once, its replacement joins once it serves); ``pd``: the servers register in PD
themselves. The proxy's ``[backend]`` is configs/dm-sidecar.toml's (discovery every 5 s, the
status port every 2 s) pointed at the name or at PD. TiProxy finds the servers through PD
anyway; DM writing directly, or HAProxy with its fixed server list, would write to addresses
that the moves take away: refused here (``problem``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tests.lab.cluster import Cluster
from tests.lab.discovery import Endpoints, discovery_keys
from tests.lab.dns import DOMAIN, DNSServer, dns_unavailable_reason

NAME = f"basic-tidb-peer.{DOMAIN}"
MODES = ("static", "dns", "pd")
FOLLOWS = ("proxy", "tiproxy")  # the middles that can follow a server to a new address


def needs_hosts(args: argparse.Namespace) -> bool:
    """The cluster's servers at their own addresses: for the moves, and for a name (one port)."""
    return args.faults == "moving" or args.discovery != "static"


def problem(args: argparse.Namespace) -> str | None:
    """Why ``--faults moving`` / ``--discovery`` cannot run with these arguments (None: they can)."""
    if not needs_hosts(args):
        return None
    if not args.cluster:
        return "--faults moving and --discovery dns|pd need --cluster"
    if args.discovery == "dns" and dns_unavailable_reason():
        return dns_unavailable_reason()
    middles = {t.rpartition(":")[2] for t in args.targets}
    fixed = sorted(middles - set(FOLLOWS))
    if fixed:
        return (f"target(s) {', '.join(fixed)}: DM (directly) and HAProxy are given fixed addresses of the servers, which "
                f"a move takes away; here only {' and '.join(FOLLOWS)} run on a cluster whose servers have addresses of their own")  # fmt: skip
    if "proxy" in middles and args.discovery == "static" and args.faults == "moving":
        return "the proxy with --discovery static keeps the addresses it started with, which the moves take away: --discovery dns or pd"
    return None


class LabDiscovery:
    """What the proxy finds the cluster's servers through (``mode``), and how each move is told
    to it (``endpoints``)."""

    def __init__(self, mode: str, cluster: Cluster, workdir: Path) -> None:
        self.mode, self.cluster = mode, cluster
        self.dns = DNSServer(workdir / "dns") if mode == "dns" else None
        self.endpoints = Endpoints(cluster, self.dns, NAME)

    def start(self) -> LabDiscovery:
        if self.dns is not None:
            self.dns.start()
            self.endpoints.publish()
        return self

    def backend(self) -> dict[str, Any] | None:
        """The proxy's ``[backend]`` keys for ``mode`` (None for static: the servers' addresses as they are)."""
        if self.mode == "static":
            return None
        return {"discovery": self.mode, "discovery_interval": "5s", **discovery_keys(self.mode, self.cluster, self.dns, NAME)}

    def stop(self) -> None:
        if self.dns is not None:
            self.dns.stop()
