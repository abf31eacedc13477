"""backend.discovery's parsing, without a network: the config keys and their errors, DNS
answers (dnspython's, CNAMEs followed), what a name's lookup makes of each kind of answer, PD's
etcd range answer (the topology keys every tidb-server registers) and its endpoints in turn."""

from __future__ import annotations

import base64
import json

import dns.message
import dns.name
import dns.rdataclass
import dns.rdatatype
import dns.resolver
import httpx
import pytest
import trio

from proxy.config import Address, ConfigError, nameserver_address, parse_config
from proxy.discovery import DiscoveryError, DnsSource, NoRecords, PdSource, addresses_of, parse_topology

USERS = [{"name": "app", "password": "pw"}]


def config(**backend):
    return parse_config({"backend": backend, "users": USERS, "admin": {"enabled": False}})


def problems(**backend) -> str:
    with pytest.raises(ConfigError) as info:
        config(**backend)
    return str(info.value)


# -- config -----------------------------------------------------------------------------------


def test_the_modes_and_their_keys():
    assert config(addresses=["127.0.0.1:4000"]).backend.discovery == "static"
    dns_mode = config(discovery="dns", addresses=["basic-tidb-peer.tidb-cluster.svc:4000"], dns={"nameservers": ["10.96.0.10"]})
    assert dns_mode.backend.balancing and dns_mode.backend.discovery_interval == 5
    pd = config(discovery="pd", pd={"endpoints": ["basic-pd:2379", "https://pd2:2379"], "ca": "/ca.pem"}, discovery_interval="2s")
    assert pd.backend.pd.urls() == ["https://basic-pd:2379", "https://pd2:2379"]  # a CA: https
    assert config(discovery="pd", pd={"endpoints": ["pd:2379"]}).backend.pd.urls() == ["http://pd:2379"]
    assert not config(addresses=["a:1"]).backend.balancing
    assert config(addresses=["a:1"], balance="connections").backend.balancing
    assert not config(discovery="dns", addresses=["a:1"], balance="order").backend.balancing


def test_what_each_mode_needs_is_said_by_path():
    assert "$.backend.addresses: required with discovery = 'static'" in problems()
    assert "$.backend.addresses: required with discovery = 'dns'" in problems(discovery="dns")
    assert "$.backend.pd.endpoints: required with discovery = 'pd'" in problems(discovery="pd")
    assert "$.backend.addresses: with discovery = 'pd' PD names the servers" in problems(
        discovery="pd", addresses=["a:1"], pd={"endpoints": ["pd:2379"]}
    )
    assert "$.backend.pd: read only with discovery = 'pd' (it is 'dns')" in problems(
        discovery="dns", addresses=["a:1"], pd={"endpoints": ["pd:2379"]}
    )
    assert "$.backend.dns: read only with discovery = 'dns'" in problems(addresses=["a:1"], dns={})
    assert "$.backend.status_urls: name fixed addresses" in problems(discovery="dns", addresses=["a:1"], status_urls={"a:1": "http://a/"})
    assert "$.backend.tls.server_name: required with verify-identity" in problems(
        discovery="dns", addresses=["a:1"], tls={"mode": "verify-identity"}
    )
    assert "expected one of 'static', 'dns', 'pd', got 'consul'" in problems(discovery="consul", addresses=["a:1"])
    assert "unknown key(s) nameserver (did you mean nameservers?)" in problems(discovery="dns", addresses=["a:1"], dns={"nameserver": []})
    assert "PD endpoint 'ftp://pd:2379'" in problems(discovery="pd", pd={"endpoints": ["ftp://pd:2379"]})
    assert "$.backend.discovery_interval" in problems(discovery="dns", addresses=["a:1"], discovery_interval="10ms")


def test_nameservers():
    assert nameserver_address("10.96.0.10") == ("10.96.0.10", 53)
    assert nameserver_address("127.0.0.1:5353") == ("127.0.0.1", 5353)
    assert nameserver_address("::1") == ("::1", 53)
    assert nameserver_address("[::1]:5353") == ("::1", 5353)
    for bad in ("kube-dns", "127.0.0.1:x", "[::1]x", "127.0.0.1:70000"):
        with pytest.raises(ValueError):
            nameserver_address(bad)
    assert "expected an IP address" in problems(discovery="dns", addresses=["a:1"], dns={"nameservers": ["kube-dns"]})


# -- DNS answers ------------------------------------------------------------------------------


def answer_of(text: str, qname: str, rdtype: str) -> dns.resolver.Answer:
    """dnspython's Answer to a question, from a response written as text (as dig shows it)."""
    response = dns.message.from_text(text)
    return dns.resolver.Answer(dns.name.from_text(qname), dns.rdatatype.from_text(rdtype), dns.rdataclass.IN, response)


HEADLESS = """id 1
opcode QUERY
rcode NOERROR
flags QR AA RD RA
;QUESTION
basic-tidb-peer.tidb-cluster.svc.cluster.local. IN A
;ANSWER
basic-tidb-peer.tidb-cluster.svc.cluster.local. 5 IN A 10.244.1.7
basic-tidb-peer.tidb-cluster.svc.cluster.local. 5 IN A 10.244.2.9
basic-tidb-peer.tidb-cluster.svc.cluster.local. 5 IN A 10.244.3.4
"""

THROUGH_A_CNAME = """id 2
opcode QUERY
rcode NOERROR
flags QR RD RA
;QUESTION
tidb.example.test. IN AAAA
;ANSWER
tidb.example.test. 30 IN CNAME tidb-0.pods.example.test.
tidb-0.pods.example.test. 30 IN AAAA fd00::17
"""


def test_the_addresses_of_an_answer():
    assert addresses_of(answer_of(HEADLESS, "basic-tidb-peer.tidb-cluster.svc.cluster.local.", "A")) == [
        "10.244.1.7",
        "10.244.2.9",
        "10.244.3.4",
    ]
    assert addresses_of(answer_of(THROUGH_A_CNAME, "tidb.example.test.", "AAAA")) == ["fd00::17"]  # the CNAME followed


class FakeResolve:
    """``resolve(name, rdtype)`` from a table: a list, NoRecords, or any other exception."""

    def __init__(self, table: dict) -> None:
        self.table = table
        self.asked: list[tuple[str, str]] = []

    async def __call__(self, name: str, rdtype: str) -> list[str]:
        self.asked.append((name, rdtype))
        answer = self.table.get((name, rdtype), NoRecords(f"{name}: no {rdtype} record"))
        if isinstance(answer, BaseException):
            raise answer
        return answer


def dns_source(table: dict, *names: str) -> tuple[DnsSource, FakeResolve]:
    resolve = FakeResolve(table)
    return DnsSource(config(discovery="dns", addresses=list(names)).backend, resolve=resolve), resolve


async def test_a_name_is_every_a_and_aaaa_record_at_its_port():
    source, _ = dns_source({("peer", "A"): ["10.0.0.9", "10.0.0.2"], ("peer", "AAAA"): ["fd00::1"]}, "peer:4000")
    found = await source.lookup()
    assert list(found.servers) == [Address("10.0.0.2", 4000), Address("10.0.0.9", 4000), Address("fd00::1", 4000)]
    assert {f.origin for f in found.servers.values()} == {"dns peer:4000"} and not found.problems


async def test_a_name_that_fails_keeps_its_last_addresses_and_the_others_go_on():
    table = {("tidb-0.peer", "A"): ["10.0.0.1"], ("tidb-1.peer", "A"): ["10.0.0.2"]}
    source, _ = dns_source(table, "tidb-0.peer:4000", "tidb-1.peer:4000")
    assert list((await source.lookup()).servers) == [Address("10.0.0.1", 4000), Address("10.0.0.2", 4000)]
    table[("tidb-0.peer", "A")] = DiscoveryError("tidb-0.peer A: no answer within 5s")  # its DNS server times out
    table[("tidb-1.peer", "A")] = ["10.0.0.7"]  # the other pod came back on a new address
    found = await source.lookup()
    assert list(found.servers) == [Address("10.0.0.1", 4000), Address("10.0.0.7", 4000)]
    assert found.problems == ("tidb-0.peer: tidb-0.peer A: no answer within 5s; kept its 1 address(es) of the last lookup",)


async def test_no_such_name_or_no_record_is_not_an_empty_set():
    """NXDOMAIN, or a name with no record (every pod not ready): the last set stays; a
    lookup where no name has any address is a failure."""
    table = {("peer", "A"): ["10.0.0.1"]}
    source, _ = dns_source(table, "peer:4000")
    await source.lookup()
    del table[("peer", "A")]
    found = await source.lookup()
    assert list(found.servers) == [Address("10.0.0.1", 4000)] and "no A or AAAA record" in found.problems[0]
    fresh, _ = dns_source({}, "peer:4000")
    with pytest.raises(DiscoveryError, match="peer: no A or AAAA record"):
        await fresh.lookup()


async def test_an_address_given_as_a_name_is_itself():
    source, resolve = dns_source({}, "127.0.0.2:4000", "[::1]:4000")
    assert list((await source.lookup()).servers) == [Address("127.0.0.2", 4000), Address("::1", 4000)]
    assert resolve.asked == []


async def test_the_resolver_reads_nameservers_and_the_search_list(tmp_path):
    from proxy.discovery import DnsResolver

    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 10.96.0.10\nsearch tidb-cluster.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n")
    resolver = DnsResolver([], 2.0, str(conf)).resolver
    assert [getattr(n, "address", n) for n in resolver.nameservers] == ["10.96.0.10"] and resolver.ndots == 5
    assert [str(d) for d in resolver.search][:1] == ["tidb-cluster.svc.cluster.local."]
    mine = DnsResolver(["127.0.0.1:5353"], 2.0, str(conf)).resolver  # the search list stays
    assert [(n.address, n.port) for n in mine.nameservers] == [("127.0.0.1", 5353)] and resolver.search == mine.search
    with pytest.raises(DiscoveryError, match="set backend.dns.nameservers"):
        DnsResolver([], 2.0, str(tmp_path / "none"))


# -- PD ---------------------------------------------------------------------------------------


def kv(key: str, value: object = None, lease: bool = False) -> dict:
    out = {"key": base64.b64encode(key.encode()).decode(), "create_revision": "34", "mod_revision": "265", "version": "2"}
    if value is not None:
        raw = value if isinstance(value, bytes) else json.dumps(value).encode() if not isinstance(value, str) else value.encode()
        out["value"] = base64.b64encode(raw).decode()
    if lease:
        out["lease"] = "2309399122344700938"
    return out


# What PD v8.5's etcd gateway answered in the lab for one tidb-server on 127.0.0.2 (captured).
CAPTURED = {
    "header": {"cluster_id": "18126410644363892606", "member_id": "4776639847118839820", "revision": "281", "raft_term": "2"},
    "kvs": [
        {"key": "L3RvcG9sb2d5L3RpZGIvMTI3LjAuMC4yOjIzOTAwL2luZm8=", "create_revision": "34", "mod_revision": "265", "version": "2",
         "value": "eyJ2ZXJzaW9uIjoidjguNS4zIiwiZ2l0X2hhc2giOiIyNjhlMWRmOGY4ZmRmODM0ZjdmYTQ1YzJiMzI0NmQ2YWRmYjQ3ZjUwIiwiaXAiOiIxMjcuMC4wLjIi"
                  "LCJzdGF0dXNfcG9ydCI6MjM5MTAsImRlcGxveV9wYXRoIjoiL3Jvb3QvLmNhY2hlL3JlcGxheS1wcm94eS9iaW4iLCJzdGFydF90aW1lc3RhbXAiOjE3OTY0Mzkw"
                  "MzEsImxhYmVscyI6e319"},
        {"key": "L3RvcG9sb2d5L3RpZGIvMTI3LjAuMC4yOjIzOTAwL3R0bA==", "create_revision": "35", "mod_revision": "266", "version": "2",
         "value": "MTc5NjQzOTAzMTI3NDU5OTAxMA==", "lease": "2309399122344700938"},
    ],
    "count": "2",
}  # fmt: skip


def test_the_topology_keys_of_a_live_server():
    servers, problems = parse_topology(CAPTURED)
    [(address, found)] = servers.items()
    assert address == Address("127.0.0.2", 23900) and found.status_port == 23910 and found.origin == "pd" and not problems


def test_a_server_whose_ttl_expired_is_gone_and_bad_keys_are_told():
    answer = {
        "header": {},
        "kvs": [
            kv("/topology/tidb/10.0.0.1:4000/info", {"status_port": 10080}),
            kv("/topology/tidb/10.0.0.1:4000/ttl", "1796439031274599010", lease=True),
            kv("/topology/tidb/10.0.0.2:4000/info", {"status_port": 10080}),  # its lease expired: no ttl
            kv("/topology/tidb/[fd00::3]:4000/info", {"status_port": 10080}),
            kv("/topology/tidb/[fd00::3]:4000/ttl", "1", lease=True),
            kv("/topology/tidb/10.0.0.4:4000/info", "{not json"),
            kv("/topology/tidb/10.0.0.4:4000/ttl", "1", lease=True),
            kv("/topology/tidb/no-port/info", {"status_port": "x"}),
            kv("/topology/tidb/no-port/ttl", "1", lease=True),
        ],
    }
    servers, problems = parse_topology(answer)
    assert list(servers) == [Address("10.0.0.1", 4000), Address("fd00::3", 4000)]
    assert servers[Address("10.0.0.1", 4000)].status_port == 10080
    assert any("10.0.0.4:4000/info: unreadable info" in p for p in problems)
    assert any("/topology/tidb/no-port" in p for p in problems)


def test_answers_that_are_not_a_range():
    assert parse_topology({"header": {"revision": "3"}}) == ({}, [])  # nothing registered
    for bad, match in (([], "not an etcd range"), ({"error": "etcdserver: user name is empty", "code": 3}, "user name is empty"),
                       ({"kvs": "x", "header": {}}, "not a list"), ({"foo": 1}, "no 'kvs'")):  # fmt: skip
        with pytest.raises(DiscoveryError, match=match):
            parse_topology(bad)


async def test_pd_endpoints_are_tried_in_turn_from_the_last_that_answered():
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        body = json.loads(request.content)
        assert base64.b64decode(body["key"]) == b"/topology/tidb/" and base64.b64decode(body["range_end"]) == b"/topology/tidb0"
        if request.url.host == "pd1":
            return httpx.Response(503, text="no leader")
        return httpx.Response(200, json=CAPTURED)

    backend = config(discovery="pd", pd={"endpoints": ["pd1:2379", "http://pd2:2379"]}).backend
    source = PdSource(backend, transport=httpx.MockTransport(handler))
    try:
        found = await source.lookup()
        assert list(found.servers) == [Address("127.0.0.2", 23900)]
        assert asked == ["http://pd1:2379/v3/kv/range", "http://pd2:2379/v3/kv/range"]
        asked.clear()
        await source.lookup()
        assert asked == ["http://pd2:2379/v3/kv/range"]  # the one that answered, first
    finally:
        await source.aclose()


async def test_pd_failures_say_what_each_endpoint_did():
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "pd1":
            raise httpx.ConnectError("Connection refused")
        return httpx.Response(200, json={"header": {"revision": "9"}})

    backend = config(discovery="pd", pd={"endpoints": ["pd1:2379", "pd2:2379"]}).backend
    source = PdSource(backend, transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(DiscoveryError) as info:
            await source.lookup()
        assert "http://pd1:2379: ConnectError: Connection refused" in str(info.value)
        assert "http://pd2:2379: no tidb-server registered" in str(info.value)
    finally:
        await source.aclose()


async def test_a_pd_that_never_answers_costs_its_timeout(autojump_clock):
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep_forever()

    backend = config(discovery="pd", pd={"endpoints": ["pd1:2379"]}, connect_timeout="2s").backend
    source = PdSource(backend, transport=httpx.MockTransport(handler))
    try:
        started = trio.current_time()
        with pytest.raises(DiscoveryError, match="no answer within 2s"):
            await source.lookup()
        assert trio.current_time() - started == pytest.approx(2, abs=0.1)
    finally:
        await source.aclose()
