"""discovery = "dns" against a real DNS server (dnsmasq, tests/lab/dns.py) whose answers the
test changes, and the proxy as it runs (a subprocess):

- the resolver against dnsmasq: A and AAAA records, a change seen at the next lookup, NXDOMAIN
  and a DNS server that stopped answering keeping the last set;
- the DM-like Go workload (8 pinned go-sql-driver connections) while the servers behind one
  name come and go: a scale out (a third address: sessions reach it), a scale in (an address
  removed: its sessions moved between transactions) and a pod back on a new address. The
  "servers" are one MariaDB listening on several loopback addresses, so a session moved from
  one to another writes the same tables and every row is verified exactly; what moved them is
  discovery alone (nothing closes a connection).

The same on a TiDB cluster, with real restarts and PD: tests/chaos/test_discovery_cluster.py.
"""

from __future__ import annotations

import json

import pytest
import trio

from proxy.config import Address, load_config, parse_config
from proxy.discovery import DiscoveryError, DnsSource
from proxy.preflight import preflight
from tests.lab.discovery import Step, discovery_backend, run_with_steps
from tests.lab.dns import DOMAIN, DNSServer, dns_unavailable_reason
from tests.lab.fixtures import require
from tests.lab.proxy import ProxyProcess

pytestmark = [pytest.mark.integration]

NAME = f"tidb-peer.{DOMAIN}"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]


@pytest.fixture
def dns(tmp_path):
    require(dns_unavailable_reason())
    server = DNSServer(tmp_path / "dns")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def source(dns: DNSServer, *names: str, timeout: str = "1s") -> DnsSource:
    config = parse_config({"backend": {"discovery": "dns", "addresses": list(names), "connect_timeout": timeout,
                                       "dns": {"nameservers": [dns.nameserver]}},
                           "users": [{"name": "app", "password": ""}], "admin": {"enabled": False}})  # fmt: skip
    return DnsSource(config.backend)


async def test_the_resolver_follows_what_the_dns_server_answers(dns):
    dns.set(NAME, ["127.0.0.3", "127.0.0.2", "::1"])
    dns.set(f"tidb-0.{NAME}", ["127.0.0.2"])
    peer = source(dns, f"{NAME}:4000", f"tidb-0.{NAME}:4001")
    found = await peer.lookup()
    assert list(found.servers) == [Address("127.0.0.2", 4000), Address("127.0.0.3", 4000), Address("::1", 4000),
                                   Address("127.0.0.2", 4001)]  # fmt: skip
    dns.set(NAME, ["127.0.0.4"])  # the pods of the Service changed
    dns.set(f"tidb-0.{NAME}", [])  # tidb-0 terminating: its name has no record (NXDOMAIN)
    found = await peer.lookup()
    assert list(found.servers) == [Address("127.0.0.4", 4000), Address("127.0.0.2", 4001)]  # tidb-0 kept
    assert "no A or AAAA record" in found.problems[0]
    dns.stop()  # no DNS server answers
    started = trio.current_time()
    found = await peer.lookup()
    assert trio.current_time() - started < 3
    assert list(found.servers) == [Address("127.0.0.4", 4000), Address("127.0.0.2", 4001)]
    assert all("no answer within 1s" in p for p in found.problems), found.problems
    fresh = source(dns, f"{NAME}:4000")
    with pytest.raises(DiscoveryError, match="no answer"):
        await fresh.lookup()


async def test_servers_that_come_and_go_behind_a_name_under_the_dm_like_workload(dns, mariadb_factory, goclient, tmp_path):
    server = mariadb_factory(extra_args=["--bind-address=" + ",".join(["127.0.0.1", *HOSTS])])
    dns.set(NAME, HOSTS[:2])
    proxy = ProxyProcess(tmp_path / "proxy", server.port, log={"level": "info"}, recovery={"buffer_window": "20s"},
                         backend=discovery_backend("dns", addresses=[f"{NAME}:{server.port}"], dns={"nameservers": [dns.nameserver]}))  # fmt: skip
    # replay-proxy check looks the name up and checks every server it finds
    lines = await preflight(load_config(proxy.config_path))
    [found] = [line for line in lines if line.where == "discovery"]
    assert found.level == "ok" and f"found 2: 127.0.0.2:{server.port}, 127.0.0.3:{server.port}" in found.text, found
    assert not [line for line in lines if line.level == "PROBLEM"], lines
    assert {line.where for line in lines} >= {f"127.0.0.2:{server.port}", f"127.0.0.3:{server.port}"}
    steps = [
        Step("scale out: a third address", lambda: dns.set(NAME, HOSTS[:3])),
        Step("scale in: the first address removed", lambda: dns.set(NAME, HOSTS[1:3])),
        Step("a pod back on a new address", lambda: dns.set(NAME, [HOSTS[2], HOSTS[3]])),
    ]
    with proxy:
        run = await run_with_steps("dns_mariadb", server, proxy, tmp_path / "run", steps, settle=2.5)
        run.proxy_log = proxy.stop()
    print(json.dumps(run.summary(), indent=2))
    assert not run.problems(), run.problems()
    port = server.port
    a, b, c, d = (f"{h}:{port}" for h in HOSTS)
    after_out, after_in, after_move = (s["sessions"] for s in run.steps)
    assert after_out.get(c, 0) >= 2, after_out  # sessions opened before the scale out reached it
    assert a not in after_in and after_in.get(c, 0) >= 2, after_in  # none left on the removed address
    assert set(after_move) == {c, d}, after_move  # the pod's old address left, the new one carries sessions
    assert sum(after_move.values()) == 8
    moved = run.moved
    assert any(to == c for _, to in moved)
    assert all(frm != to for frm, to in moved), moved  # no move for nothing
    assert {frm for frm, _ in moved} >= {a, b}
    assert run.recovered == 0  # nothing closed a connection: every change was a move between transactions
    assert "found (dns" in run.proxy_log and "gone (dns" in run.proxy_log
