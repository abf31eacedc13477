"""A backend that answers no one (a partition, a hung server whose kernel still ACKs): the
health checks get no answer for ``backend.dead_after``, and the connections opened to it
before then are cut, so each session recovers as after any loss instead of waiting on a dead
socket. A server that answers something -- a refusal, an ERR, its checks -- cuts nothing: a
long statement is never taken for a dead server. Memory streams, autojump clock.
"""

from __future__ import annotations

import logging

import pytest
import trio

from proxy.config import Address
from proxy.health import HealthChecker
from tests.component.fakes import FakeServer, make_config
from tests.component.rig import Rig
from tests.component.test_hostile_backend import stall_on

A, B = "10.0.0.1:4000", "10.0.0.2:4000"
DEAD_AFTER = 10.0
INTERVAL = 2.0  # health_interval: a silent check takes as long again (its timeout)
NOTICE = DEAD_AFTER + 3 * INTERVAL  # the last check before the cut began within an interval
NEVER = 3600.0


class PartitionedServer(FakeServer):
    """The fake server reached at several addresses; ``cut_off`` holds the ones no packet
    reaches: a connect never completes (its SYN is dropped) and a connection opened before
    gets no answer to anything."""

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(nursery)
        self.cut_off: set[Address] = set()
        self.address_of: dict[int, Address] = {}  # connection id -> where it was opened
        self.intercept = self._silent_when_cut_off

    async def opener(self, address: Address):
        if address in self.cut_off:
            await trio.sleep_forever()  # read_greeting's connect_timeout ends it
        channel = await super().opener(address)
        self.address_of[self.connections[-1].id] = address
        return channel

    async def _silent_when_cut_off(self, conn, payload: bytes):
        if self.address_of.get(conn.id) in self.cut_off:
            await trio.sleep_forever()
        return None

    def on(self, address: str) -> list:
        return [c for c in self.live() if self.address_of.get(c.id) == Address.parse(address)]


def config(addresses: list[str], **recovery):
    return make_config(
        backend={"addresses": addresses, "health_interval": INTERVAL, "dead_after": DEAD_AFTER, "connect_timeout": 5, "io_timeout": 5},
        recovery={"buffer_window": 60, "backoff_initial": 0.05, "backoff_max": 0.5, **recovery},
    )


@pytest.fixture
def partitioned(nursery):
    return PartitionedServer(nursery)


async def checked_rig(nursery, cfg, server) -> Rig:
    """A rig whose target runs its health checks and background moves, as ``Proxy.serve``'s."""
    rig = Rig(nursery, cfg, server=server)
    rig.proxy.target.nursery = nursery
    await nursery.start(HealthChecker(rig.proxy.target).run)
    return rig


async def test_a_statement_in_flight_to_a_partitioned_server_is_answered_by_another(nursery, partitioned, autojump):
    """The server at A stops answering anyone while a read waits on it: the checks see
    silence, the connection is cut at ``dead_after``, and the read runs again on B -- in
    seconds, not TCP's 30 (or never, where a hung server's kernel still ACKs)."""
    rig = await checked_rig(nursery, config([A, B]), partitioned)
    c = await rig.client()
    await c.must("INSERT INTO t VALUES (1, 'one')")
    [session] = rig.proxy.target.sessions
    assert str(session.link.backend.address) == A
    await trio.sleep(2 * INTERVAL)  # A checked up
    partitioned.cut_off.add(Address.parse(A))
    t0 = trio.current_time()
    with trio.fail_after(NEVER):
        result = await c.must("SELECT v FROM t WHERE k = 1")
    waited = trio.current_time() - t0
    assert result.rows == ["one"]
    assert DEAD_AFTER <= waited <= NOTICE, waited
    assert str(session.link.backend.address) == B
    assert partitioned.queries.count("SELECT v FROM t WHERE k = 1") == 2  # once on A (never answered), once on B


async def test_an_idle_session_on_a_partitioned_server_moves_before_its_next_command(nursery, partitioned, autojump):
    """Idle and outside a transaction: it moves to B between commands (the address is down),
    so its next command does not wait at all."""
    rig = await checked_rig(nursery, config([A, B]), partitioned)
    c = await rig.client()
    await c.must("SET sql_mode = ANSI")
    [session] = rig.proxy.target.sessions
    await trio.sleep(2 * INTERVAL)
    partitioned.cut_off.add(Address.parse(A))
    await trio.sleep(NOTICE)
    t0 = trio.current_time()
    with trio.fail_after(NEVER):
        assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]
    assert trio.current_time() - t0 < 1
    assert str(session.link.backend.address) == B


async def test_with_one_server_a_transaction_cut_off_is_recovered_when_it_answers_again(nursery, partitioned, autojump):
    """One address, a session idle in a transaction when the server goes silent for 30 s:
    its connection is cut at ``dead_after``, the session reconnects once the server answers,
    and the client's next statement in the transaction gets the answer a lost transaction
    gets (its journal is replayed where it proves the transaction did not commit, as after
    any loss) -- at once, not after TCP's timeout."""
    rig = await checked_rig(nursery, config([A]), partitioned)
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (2, 'two')")
    [session] = rig.proxy.target.sessions
    first = session.link.connection_id
    await trio.sleep(2 * INTERVAL)
    partitioned.cut_off.add(Address.parse(A))
    await trio.sleep(NOTICE)
    assert session.link.connection_id == first or not session.link.up  # cut: recovery is reconnecting
    assert not session.link.up, session.link.state
    await trio.sleep(30 - NOTICE)
    partitioned.cut_off.clear()
    await trio.sleep(2)  # the reconnect's backoff (at most backoff_max) and the restore
    assert session.link.up and session.link.connection_id != first
    t0 = trio.current_time()
    with trio.fail_after(NEVER):
        await c.must("INSERT INTO t VALUES (3, 'three')")
        await c.must("COMMIT")
    assert trio.current_time() - t0 < 1
    assert partitioned.db.rows == {2: "two", 3: "three"}  # the journal replayed once, nothing twice


async def test_a_server_that_refuses_connections_does_not_cut_a_long_statement(nursery, partitioned, autojump):
    """New connections refused (an answer: something is there) while one statement runs long:
    not silence, nothing is cut; the statement is waited for as direct."""
    partitioned.intercept = stall_on("SELECT v FROM t WHERE k = 9")
    rig = await checked_rig(nursery, config([A]), partitioned)
    c = await rig.client()
    [session] = rig.proxy.target.sessions
    first = session.link.connection_id
    partitioned.up = False
    with trio.move_on_after(10 * DEAD_AFTER) as waited:
        await c.query("SELECT v FROM t WHERE k = 9")
    assert waited.cancelled_caught and not c.closed
    assert session.link.up and session.link.connection_id == first
    assert rig.proxy.target.health_of(Address.parse(A)).silent_since is None


async def test_dead_after_zero_turns_the_cut_off(nursery, partitioned, autojump):
    cfg = make_config(backend={"addresses": [A], "health_interval": INTERVAL, "dead_after": 0, "connect_timeout": 5})
    rig = await checked_rig(nursery, cfg, partitioned)
    c = await rig.client()
    await c.must("SET @x = 1")
    [session] = rig.proxy.target.sessions
    first = session.link.connection_id
    partitioned.cut_off.add(Address.parse(A))
    await trio.sleep(10 * DEAD_AFTER)
    assert rig.proxy.target.health_of(Address.parse(A)).silent_since is not None
    assert session.link.up and session.link.connection_id == first


async def test_a_login_that_succeeds_ends_the_silence_its_checks_saw(nursery, partitioned, autojump):
    """The checks of A have been silent for a while (a partition, or checks too slow on a
    loaded machine) when a session logs in there: that login is an answer. When A goes silent
    again, the connection it opened is cut like any other (it was left alone for good: it was
    opened after the silence began, the cut takes only connections older than the silence)."""
    rig = await checked_rig(nursery, config([A]), partitioned)
    a = Address.parse(A)
    partitioned.cut_off.add(a)
    await trio.sleep(DEAD_AFTER / 2)
    assert rig.proxy.target.health_of(a).silent_since is not None
    partitioned.cut_off.discard(a)
    c = await rig.client()  # between two checks: none of them answered
    await c.must("SET sql_mode = ANSI")
    [session] = rig.proxy.target.sessions
    first = session.link.connection_id
    partitioned.cut_off.add(a)
    await trio.sleep(NOTICE + INTERVAL)
    partitioned.cut_off.discard(a)
    assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]
    assert session.link.connection_id != first, "the connection to the silent address was never cut"


async def test_a_session_recovered_elsewhere_does_not_move_again(nursery, partitioned, autojump, caplog):
    """In a transaction on A when A goes silent: asked to move off A (after its COMMIT), then
    cut and recovered on another server. That recovery is the move: after the COMMIT the
    session stays where recovery put it (a move then went on to a third server, and the
    next partition found none of the sessions it should have cut)."""
    caplog.set_level(logging.INFO)
    C = "10.0.0.3:4000"
    rig = await checked_rig(nursery, config([A, B, C]), partitioned)
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (3, 'three')")
    [session] = rig.proxy.target.sessions
    assert str(session.link.backend.address) == A
    await trio.sleep(2 * INTERVAL)
    partitioned.cut_off.add(Address.parse(A))
    await trio.sleep(NOTICE)
    assert session.link.move_requested or session.link.up  # asked while in the transaction
    with trio.fail_after(NEVER):
        await c.must("INSERT INTO t VALUES (4, 'four')")
        await c.must("COMMIT")
    recovered_on = str(session.link.backend.address)
    assert recovered_on != A and session.recoveries == 1
    await trio.sleep(3 * INTERVAL)
    assert str(session.link.backend.address) == recovered_on and not session.link.move_requested
    assert "moved from" not in caplog.text
    assert partitioned.db.rows == {3: "three", 4: "four"}
