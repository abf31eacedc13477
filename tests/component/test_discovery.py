"""backend.discovery against fake servers: the real Proxy, its health checks and its discovery
task, a scripted source in place of DNS or PD (what the source answers is the test's), one
fake server reached at every address (the tidb-servers of a cluster share their data). Memory
streams, autojump clock.

- scale out: a server appears under load, is checked, and sessions opened before it move to it
  between transactions (balance by connections) -- one inside a transaction after its COMMIT;
- scale in: a server disappears; its sessions move between transactions, none lost, none
  opened there again;
- an address that changes under a name: the sessions follow it;
- a failed lookup, or one that finds nothing, keeps the last set (logged, counted, retried);
- with no server found yet (PD not answering at start), a login waits for the first one.
"""

from __future__ import annotations

import logging

import pytest
import trio

from proxy.config import Address
from proxy.discovery import Discovery, DiscoveryError, Found, Lookup
from proxy.health import HealthChecker
from tests.component.fakes import FakeServer, make_config
from tests.component.rig import Rig

A, B, C = Address("10.1.0.1", 4000), Address("10.1.0.2", 4000), Address("10.1.0.3", 4000)
NAME = "tidb-peer.cluster.test:4000"
INTERVAL = 1.0
SETTLE = 3 * INTERVAL  # a lookup, the new address's check, the moves


class Cluster(FakeServer):
    """One fake server at every address; ``address_of`` says where each connection went."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(nursery)
        self.address_of: dict[int, Address] = {}
        self.refused: set[Address] = set()

    async def opener(self, address: Address):
        if address in self.refused:
            raise ConnectionRefusedError(111, "Connection refused")
        channel = await super().opener(address)
        self.address_of[self.connections[-1].id] = address
        return channel


class ScriptedSource:
    """What DNS or PD answers, as the test sets it: ``servers`` found, or ``fail`` (a reason)."""

    def __init__(self, mode: str, servers: list[Address]) -> None:
        self.mode = mode
        self.servers = list(servers)
        self.fail: str | None = None
        self.lookups = 0

    def describe(self) -> str:
        return f"{self.mode} {NAME}"

    async def lookup(self) -> Lookup:
        self.lookups += 1
        if self.fail:
            raise DiscoveryError(self.fail)
        if not self.servers:
            raise DiscoveryError("no tidb-server registered")
        return Lookup({a: Found(a, self.describe()) for a in self.servers})

    async def aclose(self) -> None:
        pass


def discovery_config(mode: str = "dns", **backend):
    base = {"addresses": [NAME]} if mode == "dns" else {"addresses": [], "pd": {"endpoints": ["127.0.0.1:2379"]}}
    return make_config(
        backend={"discovery": mode, "discovery_interval": INTERVAL, "health_interval": INTERVAL, "connect_timeout": 2,
                 "io_timeout": 5, **base, **backend},
        recovery={"buffer_window": 30, "backoff_initial": 0.05, "backoff_max": 0.5},
    )  # fmt: skip


async def started(nursery, servers: list[Address], mode: str = "dns", **backend) -> tuple[Rig, ScriptedSource, Cluster]:
    """The rig, its target's health checks and discovery running as ``Proxy.serve`` runs them."""
    cluster = Cluster(nursery)
    rig = Rig(nursery, discovery_config(mode, **backend), server=cluster)
    target = rig.proxy.target
    target.nursery = nursery
    source = ScriptedSource(mode, servers)
    checker = HealthChecker(target)
    await nursery.start(checker.run)
    await nursery.start(Discovery(target, checker, make=lambda backend: source).run)
    await trio.sleep(SETTLE)
    return rig, source, cluster


def placement(rig: Rig) -> dict[Address, list[str]]:
    """Which client (by its address) each server carries."""
    out: dict[Address, list[str]] = {}
    for session in rig.proxy.target.sessions:
        out.setdefault(session.link.backend.address, []).append(session.parts.client_address)
    return {a: sorted(v) for a, v in sorted(out.items(), key=lambda kv: str(kv[0]))}


def counts(rig: Rig) -> dict[Address, int]:
    return {a: len(v) for a, v in placement(rig).items()}


def where(rig: Rig, client: str) -> Address:
    [session] = [s for s in rig.proxy.target.sessions if s.parts.client_address == client]
    return session.link.backend.address


async def clients(rig: Rig, n: int, first: int = 0) -> dict[str, object]:
    out = {}
    for i in range(first, first + n):
        peer = f"127.0.0.1:{5000 + i}"
        out[peer] = await rig.client(peer)
    return out


async def test_a_server_that_appears_gets_new_sessions_and_some_of_the_old_ones(nursery, autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    rig, source, cluster = await started(nursery, [A, B])
    assert rig.proxy.target.addresses == [A, B]
    cs = await clients(rig, 6)
    assert counts(rig) == {A: 3, B: 3}  # the fewest connections first
    # A session inside a transaction, on A.
    busy_peer = next(p for p in cs if where(rig, p) == A)
    busy = cs[busy_peer]
    await busy.must("BEGIN")
    await busy.must("INSERT INTO t VALUES (1, 'one')")
    source.servers = [A, B, C]
    await trio.sleep(SETTLE)
    assert rig.proxy.target.addresses == [A, B, C]
    assert rig.proxy.target.health_of(C).state == "up"
    assert counts(rig) == {A: 2, B: 2, C: 2}, placement(rig)
    assert where(rig, busy_peer) == A  # idle sessions went first
    for peer, c in cs.items():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok, peer
    await busy.must("COMMIT")
    assert cluster.db.rows == {1: "one"}
    # New sessions balance over the three.
    await clients(rig, 3, first=6)
    assert counts(rig) == {A: 3, B: 3, C: 3}
    text = caplog.text
    assert f"backend {C} found (dns {NAME})" in text
    assert f"balancing by connections: moving 2 session(s) from {A}, {B} to {C} between transactions" in text
    assert text.count(" moved from ") == 2
    metrics = rig.proxy.target.stats.render().decode()
    assert 'replay_proxy_discovery_changes_total{change="added",target="fake"} 3.0' in metrics
    assert 'replay_proxy_backend_addresses{target="fake"} 3.0' in metrics
    assert 'replay_proxy_discovery_lookups_total{mode="dns",outcome="ok",target="fake"}' in metrics


async def test_a_server_that_disappears_is_drained_between_transactions(nursery, autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    rig, source, cluster = await started(nursery, [A, B, C])
    cs = await clients(rig, 6)
    assert counts(rig) == {A: 2, B: 2, C: 2}
    on_c = [p for p in cs if where(rig, p) == C]
    busy = cs[on_c[0]]
    await busy.must("BEGIN")
    await busy.must("INSERT INTO t VALUES (7, 'seven')")
    source.servers = [A, B]
    await trio.sleep(SETTLE)
    target = rig.proxy.target
    assert target.addresses == [A, B] and C not in target.health
    assert where(rig, on_c[1]) != C  # the idle one moved at once
    assert where(rig, on_c[0]) == C  # the busy one stays until its transaction ends
    await busy.must("INSERT INTO t VALUES (8, 'eight')")
    await busy.must("COMMIT")
    await trio.sleep(0.5)
    assert where(rig, on_c[0]) != C
    assert not [c for c in cluster.live() if cluster.address_of.get(c.id) == C]  # every connection there closed
    assert cluster.db.rows == {7: "seven", 8: "eight"}
    for c in cs.values():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok
    await clients(rig, 4, first=6)
    assert C not in counts(rig)  # never again
    assert f"backend {C} gone (dns {NAME})" in caplog.text
    assert caplog.text.count(" moved from ") == 2
    assert "could not move" not in caplog.text


async def test_an_address_that_changes_under_a_name_is_followed(nursery, autojump_clock, caplog):
    """One pod behind one name comes back on a new address: the sessions on the old one (still
    serving while it terminates) move to the new one between transactions."""
    caplog.set_level(logging.INFO)
    rig, source, cluster = await started(nursery, [A])
    cs = await clients(rig, 3)
    assert counts(rig) == {A: 3}
    source.servers = [C]
    await trio.sleep(SETTLE)
    assert counts(rig) == {C: 3}
    for c in cs.values():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok
    assert rig.proxy.target.addresses == [C]


async def test_a_failed_lookup_keeps_the_servers_known(nursery, autojump_clock, caplog):
    caplog.set_level(logging.INFO)
    rig, source, cluster = await started(nursery, [A, B])
    cs = await clients(rig, 2)
    source.fail = "tidb-peer.cluster.test A: no answer within 2s"
    before = source.lookups
    await trio.sleep(12 * INTERVAL)
    assert source.lookups - before >= 10  # asked again every interval
    assert rig.proxy.target.addresses == [A, B]
    assert counts(rig) == {A: 1, B: 1}
    source.fail = None
    source.servers = []  # an answer that finds nothing is no better
    await trio.sleep(SETTLE)
    assert rig.proxy.target.addresses == [A, B]
    source.servers = [B]
    await trio.sleep(SETTLE)
    assert rig.proxy.target.addresses == [B] and counts(rig) == {B: 2}
    for c in cs.values():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok
    text = caplog.text
    assert text.count("discovery (dns) failed: tidb-peer") == 1  # the first, then every 10th
    assert "failed 10 times in a row" in text
    assert "keeping the 2 known address(es) (10.1.0.1:4000, 10.1.0.2:4000)" in text
    assert "answers again after" in text
    metrics = rig.proxy.target.stats.render().decode()
    assert 'replay_proxy_discovery_lookups_total{mode="dns",outcome="failed",target="fake"}' in metrics


async def test_before_the_first_server_is_found_a_login_waits_for_it(nursery, autojump_clock):
    """PD does not answer yet when the proxy starts: nothing is known, /readyz says not ready,
    and a client's login waits (recovery.buffer_window) until a server is found."""
    rig, source, cluster = await started(nursery, [], mode="pd")
    target = rig.proxy.target
    assert target.addresses == [] and not target.ready()
    logged_in = trio.Event()

    async def login() -> None:
        await rig.client()
        logged_in.set()

    nursery.start_soon(login)
    await trio.sleep(5)
    assert not logged_in.is_set()
    source.servers = [B]
    with trio.fail_after(SETTLE):
        await logged_in.wait()
    assert counts(rig) == {B: 1} and target.ready()


async def test_a_server_found_that_refuses_logins_costs_nothing(nursery, autojump_clock):
    """A server registered before it serves: checked down at once; sessions stay and new ones
    go elsewhere."""
    rig, source, cluster = await started(nursery, [A])
    cs = await clients(rig, 2)
    cluster.refused.add(C)
    source.servers = [A, C]
    await trio.sleep(SETTLE)
    assert rig.proxy.target.health_of(C).state == "down"
    await clients(rig, 2, first=2)
    assert counts(rig) == {A: 4}
    for c in cs.values():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok


@pytest.mark.parametrize("balance", ["order", "connections"])
async def test_static_addresses_removed_by_a_reload_are_drained_too(nursery, autojump_clock, balance):
    cluster = Cluster(nursery)
    config = make_config(backend={"addresses": [str(A), str(B)], "health_interval": INTERVAL, "balance": balance})
    rig = Rig(nursery, config, server=cluster)
    target = rig.proxy.target
    target.nursery = nursery
    await nursery.start(HealthChecker(target).run)
    await trio.sleep(SETTLE)
    cs = await clients(rig, 4)
    assert counts(rig) == ({A: 4} if balance == "order" else {A: 2, B: 2})
    rig.proxy.reload(make_config(backend={"addresses": [str(B)], "health_interval": INTERVAL, "balance": balance}), rig.proxy.target.hooks)
    await trio.sleep(1)
    assert counts(rig) == {B: 4}
    for c in cs.values():
        assert (await c.must("SELECT COUNT(*) FROM t")).ok


async def test_a_move_goes_elsewhere_when_another_server_is_as_good(nursery, autojump_clock, caplog):
    """A move between transactions (a rebalance, here asked directly) while both servers carry
    as many sessions: the new connection goes to the other one, not back where it was."""
    caplog.set_level(logging.INFO)
    rig, _source, _cluster = await started(nursery, [A, B])
    peers = await clients(rig, 2)
    assert counts(rig) == {A: 1, B: 1}
    [session] = [s for s in rig.proxy.target.sessions if s.link.backend.address == A]
    session.request_move()
    await trio.sleep(0.5)
    assert session.link.backend.address == B
    assert f"moved from {A} to {B}" in caplog.text and f"moved from {A} to {A}" not in caplog.text
    for client in peers.values():
        assert (await client.must("SELECT COUNT(*) FROM t")).rows == ["0"]
