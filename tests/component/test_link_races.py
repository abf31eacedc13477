"""The backend link's state machine against the two races that used to run past it: a client's
COM_CHANGE_USER while recovery is bringing the connection back, and a server's error on the
old connection while a move is opening the new one. Each is one recovery or one move, on one
backend connection at the end."""

from __future__ import annotations

import trio

from proxy.protocol.auth import native_scramble
from proxy.protocol.packets import make_change_user, make_err
from proxy.protocol.response import Expect
from proxy.relay.link import LinkState


def only_session(rig):
    (session,) = rig.proxy.target.sessions
    return session


async def test_a_change_of_user_during_a_recovery_waits_for_it(nursery, rig, autojump):
    c = await rig.client()
    await c.must("SET @a = 1")
    session = only_session(rig)
    rig.server.up = False
    rig.server.restart()  # the idle session's connection ends: recovery waits for the server
    await trio.sleep(1)
    assert session.link.state in (LinkState.LOST, LinkState.RESTORING)

    async def come_back():
        await trio.sleep(5)
        rig.server.up = True

    nursery.start_soon(come_back)
    change = make_change_user("app", native_scramble("apppw", session.scramble), "test", 45, "mysql_native_password", {},
                              session.client_caps)  # fmt: skip
    answer = await c.command(change, Expect.SINGLE)
    assert answer.ok, answer
    assert session.link.up and session.link.recoveries == 1
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    (live,) = rig.server.live()  # the recovered connection closed, the new login's open
    assert live.id == session.link.connection_id


async def test_a_server_error_during_a_move_waits_for_the_move(nursery, rig, autojump):
    c = await rig.client()
    await c.must("SET @a = 1")
    session = only_session(rig)
    target = rig.proxy.target
    target.nursery = nursery  # moves run in the proxy's nursery (Proxy.serve sets it)
    old = rig.backend_of()
    opened, opening = trio.Event(), target.opener

    async def slow_opener(address):
        await opened.wait()
        return await opening(address)

    target.opener = slow_opener
    session.request_move()
    await trio.sleep(1)
    assert session.link.state is LinkState.MOVING
    # The draining server goes away meanwhile, with a word to its idle connections.
    await old._send([make_err(1053, "08S01", "Server shutdown in progress")], 0)
    old.close(clean=True)
    await trio.sleep(1)
    opened.set()
    await trio.sleep(1)
    assert session.link.up and session.link.recoveries == 0  # moved, not recovered
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    (live,) = rig.server.live()  # the old connection closed, the move's open
    assert live is not old and live.id == session.link.connection_id
