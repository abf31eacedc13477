"""listen.idle_timeout: a session that sends nothing for that long is closed, its backend
connection with it; a command that runs longer than that, or arrives a byte at a time, is not
idle. Off (0) by default: replicators keep pinned connections idle for hours. And the server's
own wait_timeout: the session it closed reconnects at its next command."""

from __future__ import annotations

import logging

import trio

from proxy.hooks import Hooks
from proxy.protocol.framing import encode_packet
from tests.component.fakes import make_config, trickle_stream_pair
from tests.component.test_admission import admission_rig, closed  # noqa: F401 (a fixture)


async def test_an_idle_session_is_closed_with_its_backend_connection(admission_rig, autojump):
    rig = admission_rig(idle_timeout="30s")
    c = await rig.client()
    await trio.sleep(29)
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]  # 29 s is not idle enough
    assert len(rig.server.live()) == 1
    await trio.sleep(31)
    assert await closed(c.stream)
    assert rig.server.live() == []  # the backend connection went with it
    assert not rig.proxy.target.sessions


async def test_a_command_running_longer_than_the_timeout_is_not_idle(admission_rig, autojump):
    rig = admission_rig(idle_timeout="10s")
    c = await rig.client()

    async def slow(conn, payload: bytes):
        if b"COUNT" in payload:
            await trio.sleep(60)  # the server works on it for a minute
        return None

    rig.server.intercept = slow
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    rig.server.intercept = None
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    assert rig.proxy.target.sessions


async def test_a_command_trickling_in_is_not_idle(make_rig, autojump):
    rig = make_rig(make_config(listen={"idle_timeout": "5s"}), stream_pair=trickle_stream_pair, peer="10.0.0.1:5000")
    c = await rig.client()
    await trio.sleep(4)
    frame = encode_packet(b"\x03SELECT COUNT(*) FROM t", 0)[0]
    for i in range(len(frame)):  # one byte every 3 s: 90 s for the command, never 5 s of silence
        await c.stream.send_all(frame[i : i + 1])
        await trio.sleep(3)
    assert await c._read_packet() == b"\x01"  # the answer begins: one column (EOFError if closed)


async def test_off_by_default(admission_rig, autojump):
    rig = admission_rig()
    c = await rig.client()
    await trio.sleep(48 * 3600)
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_a_session_closed_for_idling_reconnects_at_its_next_command_not_before(rig, autojump):
    """The server closes an idle session after its wait_timeout: a new connection now would be
    closed again after as long, for as long as the client stays away. It comes at the client's
    next command instead; a close before the wait_timeout is a loss, recovered at once."""
    rig.server.wait_timeout = 5
    c = await rig.client()
    await c.must("SET sql_mode = ANSI")
    await trio.sleep(5)
    rig.backend_of().close(clean=True)  # the server's wait_timeout
    await trio.sleep(60)
    assert rig.server.live() == []  # nothing reconnected while the client was away
    with trio.fail_after(3600):
        assert (await c.must("SELECT @@sql_mode")).rows == ["ANSI"]
    assert len(rig.server.live()) == 1
    await trio.sleep(1)
    rig.backend_of().close(clean=True)  # 1 s idle: not the wait_timeout, a server going away
    await trio.sleep(2)
    assert len(rig.server.live()) == 1  # reconnected at once, before any command


async def test_a_command_arriving_with_the_idle_close_goes_to_a_new_connection(make_rig, autojump, caplog):
    """The server's idle close arrives while the proxy handles the client's next command (a
    plugin closes the fake connection then, with no yield before the send): the command is not
    sent into the closed connection, where its loss would look like one in flight; it waits for
    a new connection, as when the close came first."""
    caplog.set_level(logging.INFO)
    rig = None

    class CloseNow:
        def command_received(self, session, command):
            if command.sql == "SELECT @@sql_mode":
                rig.backend_of().close(clean=True)  # the server's wait_timeout, this very moment

    rig = make_rig(hooks=Hooks([("closenow", CloseNow())]))
    rig.server.wait_timeout = 5
    c = await rig.client()
    for mode in ["ANSI", "TRADITIONAL", "ANSI"]:
        await c.must(f"SET sql_mode = {mode}")
        await trio.sleep(5)
        assert (await c.must("SELECT @@sql_mode")).rows == [mode]
    assert caplog.text.count("a new one at the next command") == 3
    assert "(sent)" not in caplog.text  # how a command sent into the closed one is logged
