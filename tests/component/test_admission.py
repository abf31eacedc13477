"""Before login: capped handshake packets, limits on connections that have not logged in,
failed logins per host, and max_connections counting logged-in sessions only."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import parse_err
from tests.component.fakes import MySQLError, make_config
from tests.component.rig import Rig


@pytest.fixture
def admission_rig(make_rig: Callable[..., Rig]) -> Callable[..., Rig]:
    """``admission_rig(**listen)``: the proxy with these [listen] options; clients connect from
    10.0.0.1 unless a test says."""
    return lambda **listen: make_rig(make_config(listen=listen), peer="10.0.0.1:5000")


async def first_packet(stream: trio.StapledStream) -> bytes:
    decoder = PacketDecoder()
    while (packet := decoder.next_packet()) is None:
        data = await stream.receive_some(65536)
        if not data:
            raise EOFError
        decoder.feed(bytes(data))
    return packet.payload


async def closed(stream: trio.StapledStream) -> bool:
    with trio.move_on_after(5):
        while True:
            try:
                if not await stream.receive_some(65536):
                    return True
            except trio.BrokenResourceError:
                return True
    return False


async def test_an_oversized_handshake_response_closes_the_connection(admission_rig, autojump):
    rig = admission_rig()
    stream = rig.connect()
    await first_packet(stream)  # the greeting
    await stream.send_all(encode_packet(b"\x00" * (200 * 1024), 1)[0])
    assert await closed(stream)
    assert rig.proxy.admission.pending == 0
    await rig.client()  # the next client logs in as usual


async def test_silent_sockets_cannot_lock_users_out(admission_rig, autojump):
    rig = admission_rig(max_pending_logins=3, max_pending_per_host=2)
    silent = [rig.connect("10.0.0.9:1"), rig.connect("10.0.0.9:2")]
    for s in silent:
        await first_packet(s)
    third = rig.connect("10.0.0.9:3")  # the same host: refused at once
    assert parse_err(await first_packet(third)).code == 1040
    await rig.client("10.0.0.2:1")  # another host still gets in
    await trio.sleep(11)  # handshake_timeout: the silent ones are gone
    assert all([await closed(s) for s in silent])
    await rig.client("10.0.0.9:4")


async def test_max_connections_counts_logged_in_sessions(admission_rig, autojump):
    rig = admission_rig(max_connections=1)
    first = await rig.client()
    silent = rig.connect("10.0.0.3:1")
    await first_packet(silent)  # a socket that never logs in takes no session slot
    with pytest.raises(MySQLError) as refused:
        await rig.client("10.0.0.4:1")
    assert refused.value.code == 1040
    assert (await first.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_failed_logins_block_a_host_for_a_while(admission_rig, autojump):
    rig = admission_rig(failed_login_limit=3, failed_login_window="60s")
    for _ in range(3):
        with pytest.raises(MySQLError) as denied:
            await rig.client("10.0.0.5:1", password="wrong")
        assert denied.value.code == 1045
    blocked = rig.connect("10.0.0.5:2")
    err = parse_err(await first_packet(blocked))
    assert err.code == 1129 and "blocked" in err.message
    await rig.client("10.0.0.6:1")  # other hosts are not
    await trio.sleep(61)
    await rig.client("10.0.0.5:3")


async def test_session_ids_start_over_within_their_range_skipping_open_sessions(admission_rig, autojump):
    """Session ids are the greeting's 4-byte connection id: after the last id of the range the
    numbering starts over at the first, and an id still in use is skipped."""
    from proxy.worker_identity import SESSION_ID_BASE, SESSION_ID_SPAN

    rig = admission_rig()
    first = await rig.client()  # id SESSION_ID_BASE, stays open
    rig.proxy._next_id = SESSION_ID_BASE + SESSION_ID_SPAN - 1
    await rig.client()  # the last id of the range
    third = await rig.client()
    ids = sorted(s.id for s in rig.proxy.target.sessions)
    assert ids == [SESSION_ID_BASE, SESSION_ID_BASE + 1, SESSION_ID_BASE + SESSION_ID_SPAN - 1]
    assert max(ids) < 2**32
    assert (await third.must("SELECT COUNT(*) FROM t")).rows == ["0"] and not first.closed
