"""KILLs on a server that does not count them (TiDB: no Com_kill in SHOW GLOBAL STATUS, and a
killed connection gets a FIN without an error packet; measured on v8.5.3).

The proxy tells an operator's KILL from a server going away by Com_kill (proxy/recovery/kills.py).
Without it, the KILLs the proxy itself relays are what it can go by: a session's own KILL in
flight, and one session's KILL of another proxy session (by the greeting's id). Before, on
TiDB, ``BEGIN; INSERT; KILL CONNECTION_ID()`` replayed the transaction and sent the KILL again,
forever; outside a transaction it was a 1158; and a KILL of another session was undone by a
reconnect (its running statement sent again and run to the end).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from tests.component.rig import Rig
from tests.component.test_recovery import drop_once


@pytest.fixture
def rig(make_rig: Callable[..., Rig]) -> Rig:
    """The fake server speaking as TiDB, which has no Com_kill."""
    rig = make_rig()
    rig.server.flavor = "tidb"
    return rig


@pytest.mark.parametrize("in_transaction", [False, True])
async def test_a_sessions_own_kill_ends_it_once(rig, autojump, in_transaction):
    c = await rig.client()
    await trio.sleep(10)  # the server has been up long before: the same instance afterwards
    if in_transaction:
        await c.must("BEGIN")
        await c.must("INSERT INTO t VALUES (1, 'a')")
    with trio.fail_after(60), pytest.raises(EOFError):  # closed without an answer, as TiDB does
        await c.query("KILL CONNECTION_ID()")
    assert rig.server.queries.count("KILL CONNECTION_ID()") == 1  # never sent again
    assert rig.server.db.rows == {}


async def test_a_kill_of_another_idle_session_through_the_proxy_is_not_undone(rig, autojump):
    victim, killer = await rig.client(), await rig.client()
    await trio.sleep(10)
    await killer.must(f"KILL {victim.connection_id}")  # the greeting's id: the proxy translates it
    await trio.sleep(1)
    result = await victim.query("SELECT COUNT(*) FROM t")
    assert result.code == 1927, result
    with pytest.raises(EOFError):
        await victim.query("SELECT 1")
    assert (await killer.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_a_clean_close_without_a_kill_is_still_recovered(rig, autojump):
    c = await rig.client()
    await trio.sleep(10)
    rig.backend_of().close(clean=True)  # a FIN, the server up, no KILL seen: a load balancer, say
    await trio.sleep(0.01)
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_a_refused_kill_is_no_kill_later(rig, autojump):
    """A KILL the server refused killed nothing: when that connection closes later, without a
    KILL, the session is recovered."""
    victim, killer = await rig.client(), await rig.client()
    await trio.sleep(10)
    rig.server.intercept = drop_once("KILL", "error_1095")
    result = await killer.query(f"KILL {victim.connection_id}")
    assert result.code == 1095
    await trio.sleep(60)  # later (past backend.io_timeout)
    rig.backend_of(0).close(clean=True)  # a FIN, the server up: a load balancer, say
    await trio.sleep(0.01)
    assert (await victim.must("SELECT COUNT(*) FROM t")).rows == ["0"]
