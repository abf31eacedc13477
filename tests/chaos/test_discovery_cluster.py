"""The cluster as TiDB Operator runs it, found and followed by the proxy without a reload: a
TiDB cluster (tests/lab/cluster.py: PD, a store process, tidb-servers sharing all data) whose
tidb-servers listen on one port at their own loopback addresses (127.0.0.2, 127.0.0.3, ...), as
pods do, with ``graceful-wait-before-shutdown`` 2 s; the DM-like Go workload (8 pinned
go-sql-driver connections, DM's session) runs through the proxy while

- a third server is added (scale out): sessions opened before reach it;
- each server in turn is stopped and comes back on a new address (a rolling restart where every
  pod gets a new IP): its sessions move between transactions, the new address gets sessions;
- the last server is removed (scale in): its sessions move, none lost;

once with ``discovery = "dns"`` (a name whose records dnsmasq serves, changed as a headless
Service's endpoints change) and once with ``discovery = "pd"`` (the servers register in PD
themselves). Every row verified; no client error, no stuck worker, no 1158. The longer runs,
and real DM: bench/discovery.py.
"""

from __future__ import annotations

import json

import pytest

from tests.lab.discovery import cluster_steps, discovery_backend, discovery_keys, run_with_steps
from tests.lab.dns import DOMAIN, DNSServer, dns_unavailable_reason
from tests.lab.fixtures import require, running_cluster
from tests.lab.proxy import ProxyProcess

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

NAME = f"basic-tidb-peer.{DOMAIN}"


def check(run) -> None:
    """No client error or stuck worker, every row, no 1158; each step reached the sessions."""
    print(json.dumps(run.summary(), indent=2))
    assert not run.problems(min_txns=100), run.problems()
    out, *moves, scale_in = run.steps
    hosts = [{a.rsplit(":", 1)[0] for a in step["sessions"]} for step in run.steps]
    assert out["what"] in hosts[0] and len(hosts[0]) == 3, out  # the new server carries sessions opened before it
    for step, after in zip(moves, hosts[1:]):
        old, new = step["what"].split(": ")[1].split(" -> ")
        assert old not in after and new in after, step  # nothing left on the old address; the new one used
    assert scale_in["what"] not in hosts[-1] and sum(scale_in["sessions"].values()) == 8, scale_in
    assert len(run.moved) >= 6, run.moved
    assert all(frm != to for frm, to in run.moved)


async def test_dns_scale_out_new_addresses_scale_in(tmp_path, goclient):
    require(dns_unavailable_reason())
    dns = DNSServer(tmp_path / "dns")
    dns.start()
    try:
        with running_cluster(tmp_path / "cluster", servers=2, hosts=True, graceful_wait=2) as cluster:
            dns.set(NAME, [s.host for s in cluster.servers])
            backend = discovery_backend("dns", **discovery_keys("dns", cluster, dns, NAME))
            proxy = ProxyProcess(tmp_path / "proxy", cluster.port, backend=backend, log={"level": "info"},
                                 recovery={"buffer_window": "40s", "idempotent": "safe-mode"})  # fmt: skip
            with proxy:
                run = await run_with_steps("dns_cluster", cluster, proxy, tmp_path / "run", cluster_steps(cluster, dns, NAME),
                                           tidb=True, step_time=3.0)  # fmt: skip
                run.proxy_log = proxy.stop()
            check(run)
            assert run.proxy_log.count(" gone (dns ") >= 4
    finally:
        dns.stop()


async def test_pd_scale_out_new_addresses_scale_in(tmp_path, goclient):
    with running_cluster(tmp_path / "cluster", servers=2, hosts=True, graceful_wait=2) as cluster:
        backend = discovery_backend("pd", **discovery_keys("pd", cluster))  # the status ports: as registered
        proxy = ProxyProcess(tmp_path / "proxy", [], backend=backend, log={"level": "info"},
                             recovery={"buffer_window": "40s", "idempotent": "safe-mode"})  # fmt: skip
        with proxy:
            run = await run_with_steps("pd_cluster", cluster, proxy, tmp_path / "run", cluster_steps(cluster),
                                       tidb=True, step_time=3.0)  # fmt: skip
            run.proxy_log = proxy.stop()
        check(run)
        assert run.proxy_log.count(" found (pd)") >= 5
