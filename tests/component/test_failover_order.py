"""Which address a new backend connection tries, and how long it waits there, when one server
of several is going away (measured on a TiDB cluster under a rolling restart with
graceful-wait 0: a dying tidb-server accepts a connection and answers it only when it exits,
seconds later, while the other servers are ready now)."""

from __future__ import annotations

import trio

from proxy.backend import Login
from proxy.config import Address
from proxy.target import Target
from tests.component.fakes import FakeServer, _FakeChannel, make_config

A, B = Address("10.0.0.1", 4000), Address("10.0.0.2", 4000)
LOGIN = Login("app", "apppw", None, 45, 0)


def _config(**backend):
    return make_config(backend={"addresses": [str(A), str(B)], "connect_timeout": "2s", "io_timeout": "30s", **backend})


class _Deaf(_FakeChannel):
    """Greeted, then deaf: the login never reaches the server, which so never answers."""

    __slots__ = ()

    async def send(self, data: bytes) -> None:
        pass


class TwoServers:
    """A works or hangs (greets, then never answers the login), B always works."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.a, self.b = FakeServer(nursery), FakeServer(nursery)
        self.a_hangs = False
        self.tried: list[Address] = []

    async def opener(self, address: Address):
        self.tried.append(address)
        channel = await (self.a if address == A else self.b).opener(address)
        if address == A and self.a_hangs:
            channel.__class__ = _Deaf
        return channel


async def test_a_login_that_hangs_gives_up_after_connect_timeout_while_another_address_is_left(nursery, autojump_clock):
    servers = TwoServers(nursery)
    target = Target(_config(), opener=servers.opener)
    servers.a_hangs = True
    started = trio.current_time()
    backend = await target.connect(LOGIN)
    assert backend.address == B
    # The hanging server cost connect_timeout (2 s), not io_timeout (30 s).
    assert trio.current_time() - started < 2.5
    backend.close()


async def test_the_last_address_left_gets_the_whole_io_timeout(nursery, autojump_clock):
    servers = TwoServers(nursery)
    target = Target(make_config(backend={"addresses": [str(A)], "connect_timeout": "2s", "io_timeout": "30s"}), opener=servers.opener)
    servers.a_hangs = True
    started = trio.current_time()
    try:
        await target.connect(LOGIN)
    except Exception as exc:
        assert "30s" in str(exc)
    else:
        raise AssertionError("a server that never greets cannot log anyone in")
    assert 29 < trio.current_time() - started < 31


async def test_an_address_whose_server_dropped_a_session_is_tried_after_the_others_for_a_while(nursery, autojump_clock):
    servers = TwoServers(nursery)
    target = Target(_config(health_interval="2s"), opener=servers.opener)
    first = await target.connect(LOGIN)
    assert first.address == A  # the first address, while nothing is known
    target.suspect(A)  # its server just closed a session's connection
    second = await target.connect(LOGIN)
    assert second.address == B
    await trio.sleep(4.5)  # twice the health interval later, A is first again
    servers.tried.clear()
    third = await target.connect(LOGIN)
    assert third.address == B  # the last address that worked comes first...
    target._preferred = A
    fourth = await target.connect(LOGIN)
    assert fourth.address == A  # ...and A is no longer held back
    for backend in (first, second, third, fourth):
        backend.close()


async def test_a_failed_login_makes_the_address_suspect(nursery, autojump_clock):
    servers = TwoServers(nursery)
    target = Target(_config(), opener=servers.opener)
    servers.a_hangs = True
    backend = await target.connect(LOGIN)
    assert backend.address == B and target.health_of(A).suspect
    servers.a_hangs = False
    target._preferred = A  # A would be first again by the last-worked rule
    servers.tried.clear()
    again = await target.connect(LOGIN)
    assert servers.tried[0] == B and again.address == B
    backend.close()
    again.close()


async def test_one_address_is_never_suspect():
    target = Target(make_config(backend={"addresses": [str(A)]}))
    target.suspect(A)
    assert not target.health_of(A).suspect


async def test_a_session_whose_server_dropped_it_reconnects_to_another_and_so_do_new_sessions(make_rig, nursery, autojump_clock):
    servers = TwoServers(nursery)
    rig = make_rig(_config(health_interval="0s"), server=servers)
    client = await rig.client()
    assert len(servers.a.live()) == 1 and not servers.b.live()
    servers.a.restart()  # A's server drops every connection and is back at once
    await client.query("SELECT 1")  # answered after the session's recovery
    assert len(servers.b.live()) == 1, "the session went back to the server that had just dropped it"
    newcomer = await rig.client()
    await newcomer.query("SELECT 1")
    assert len(servers.b.live()) == 2 and not servers.a.live()
