"""A misbehaving backend (issue "hostile peers"): over trio memory streams, autojump clock.

Each case: the affected client gets a clear error within ``backend.io_timeout`` (or the buffer
window), a session opened before (on an honest connection) is unaffected, and nothing is run
again on the strength of a response the proxy could not parse (the fake server saw the
statement once).

Hostile connections come from ``HostileServer``: while ``script`` is set, a new backend
connection runs it instead of the honest fake; misbehaviour inside a session goes through
the fake server's ``intercept`` (it may write raw bytes on the connection, then stall or close).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
import trio.testing

from proxy.netio import StreamChannel
from proxy.protocol.auth import NATIVE, new_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import ServerHandshake, lenenc_str, make_auth_switch, make_eof, make_ok, make_server_handshake
from tests.component.fakes import AUTOCOMMIT, FakeClient, FakeServer, MySQLError, _coldef, make_config
from tests.component.rig import Rig

IO_TIMEOUT = 2.0
BUFFER_WINDOW = 6.0
SLACK = 1.0  # backoff steps and scheduling on top of a timeout
NEVER = 3600.0  # the test's own bound: a proxy that hangs fails the test instead of hanging it


def config(**overrides):
    base = {
        "backend": {"io_timeout": IO_TIMEOUT, "connect_timeout": 1},
        "recovery": {"buffer_window": BUFFER_WINDOW, "backoff_initial": 0.05, "backoff_max": 0.5},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    return make_config(**base)


class HostileServer(FakeServer):
    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(nursery)
        self.script = None  # async (stream) -> None for new connections; None: honest
        self.hostile_connections = 0

    async def opener(self, address):
        if self.script is None:
            return await super().opener(address)
        proxy_side, server_side = trio.testing.memory_stream_pair()
        self.hostile_connections += 1
        self.nursery.start_soon(self.script, server_side)
        return StreamChannel(proxy_side, f"backend {address} (hostile)")


def greeting(conn_id: int = 900) -> bytes:
    hs = ServerHandshake("10.11.0-fake", conn_id, new_scramble(), int(PROXY_CAPABILITIES), 45, AUTOCOMMIT, NATIVE)
    return encode_packet(make_server_handshake(hs), 0)[0]


async def read_packet(stream, decoder: PacketDecoder):
    while (packet := decoder.next_packet()) is None:
        data = await stream.receive_some(65536)
        if not data:
            return None
        decoder.feed(bytes(data))
    return packet


@pytest.fixture
def rig(make_rig: Callable[..., Rig], nursery: trio.Nursery) -> Rig:
    """The proxy in front of a HostileServer: each test scripts what it sends."""
    return make_rig(config(), server=HostileServer(nursery))


async def healthy(c: FakeClient) -> None:
    """The bystander session still works."""
    with trio.fail_after(NEVER):
        await c.must("INSERT INTO t VALUES (77, 'bystander')")
        assert (await c.must("SELECT v FROM t WHERE k = 77")).rows == ["bystander"]
        await c.must("DELETE FROM t WHERE k = 77")


async def login_error(rig: Rig) -> tuple[MySQLError, float]:
    c = await rig.client(login=False)
    t0 = trio.current_time()
    with trio.fail_after(NEVER):
        with pytest.raises(MySQLError) as info:
            await c.login()
    return info.value, trio.current_time() - t0


def stall_on(match: str, before: bytes = b"", then: str = "stall"):
    """Intercept: the first command containing ``match`` gets the raw bytes ``before``,
    then the connection stalls (never answers) or is closed (``then="close"``)."""
    fired = []

    async def intercept(conn, payload: bytes):
        if fired or match.encode() not in payload:
            return None
        fired.append(payload)
        if before:
            await conn.stream.send_all(before)
        if then == "close":
            return "drop"
        await trio.sleep_forever()

    intercept.fired = fired
    return intercept


# ---------------------------------------------------------------------------- login phase


async def test_garbage_after_the_greeting(rig, autojump):
    bystander = await rig.client()

    async def script(stream):
        await stream.send_all(greeting() + b"\x07\x00\x00\x02this is not MySQL at all \xde\xad\xbe\xef")
        await trio.sleep_forever()

    rig.server.script = script
    err, took = await login_error(rig)
    assert err.code == 1105 and "protocol error" in err.message, err
    assert took <= IO_TIMEOUT + SLACK
    rig.server.script = None
    await healthy(bystander)


async def test_auth_switch_to_an_unknown_plugin(rig, autojump):
    bystander = await rig.client()

    async def script(stream):
        await stream.send_all(greeting())
        decoder = PacketDecoder()
        packet = await read_packet(stream, decoder)  # the proxy's handshake response
        await stream.send_all(encode_packet(make_auth_switch("auth_gssapi_client", b"realm"), packet.seq + 1)[0])
        await trio.sleep_forever()

    rig.server.script = script
    err, took = await login_error(rig)
    assert "unsupported auth plugin 'auth_gssapi_client'" in err.message, err
    assert took <= IO_TIMEOUT + SLACK
    assert rig.server.hostile_connections == 1  # not retried: a retry gets the same answer
    rig.server.script = None
    await healthy(bystander)


async def test_rsa_key_that_is_not_a_key(rig, autojump):
    """sha256_password full authentication with garbage where the server's RSA key belongs
    (a ValueError from the key loader used to escape as an internal error)."""
    bystander = await rig.client()

    async def script(stream):
        await stream.send_all(greeting())
        decoder = PacketDecoder()
        packet = await read_packet(stream, decoder)
        await stream.send_all(encode_packet(make_auth_switch("sha256_password", b"s" * 20), packet.seq + 1)[0])
        packet = await read_packet(stream, decoder)  # the proxy asks for the key
        await stream.send_all(encode_packet(b"\x01-----BEGIN PUBLIC KEY-----\nnot base64\n", packet.seq + 1)[0])
        await trio.sleep_forever()

    rig.server.script = script
    err, took = await login_error(rig)
    assert err.code == 1105 and "RSA public key" in err.message, err
    assert took <= IO_TIMEOUT + SLACK
    rig.server.script = None
    await healthy(bystander)


@pytest.mark.parametrize("where", ["in the greeting", "after the greeting", "after the handshake response"])
async def test_server_stops_mid_handshake(rig, autojump, where):
    """The connection closes part-way: retried (a server going down), then an error once the
    buffer window is over."""
    bystander = await rig.client()

    async def script(stream):
        hello = greeting()
        if where == "in the greeting":
            await stream.send_all(hello[:20])
        else:
            await stream.send_all(hello)
            if where == "after the handshake response":
                await read_packet(stream, PacketDecoder())
        await stream.aclose()

    rig.server.script = script
    err, took = await login_error(rig)
    assert err.code == 1105 and "Can't connect to backend" in err.message, err
    assert took <= BUFFER_WINDOW + SLACK
    assert rig.server.hostile_connections >= 2  # retried within the window
    rig.server.script = None
    await healthy(bystander)


@pytest.mark.parametrize("where", ["before the greeting", "after the greeting", "with a 16 MiB header and no body"])
async def test_server_stalls_during_login(rig, autojump, where):
    bystander = await rig.client()

    async def script(stream):
        if where == "after the greeting":
            await stream.send_all(greeting())
        elif where.startswith("with a 16 MiB"):
            await stream.send_all(greeting())
            await read_packet(stream, PacketDecoder())
            await stream.send_all(b"\xff\xff\xff\x02\x00")  # a 16 MiB answer, one byte of it
        await trio.sleep_forever()

    rig.server.script = script
    err, took = await login_error(rig)
    assert err.code == 1105, err
    assert took <= BUFFER_WINDOW + IO_TIMEOUT + SLACK
    rig.server.script = None
    await healthy(bystander)


# ---------------------------------------------------------------------------- in a session


def _result_head(conn) -> bytes:
    """Column count, one column definition, EOF: the start of a text result set."""
    return _result_head_bytes(conn.deprecate_eof, conn.status())


def _result_head_bytes(deprecate_eof: bool = False, status: int = AUTOCOMMIT) -> bytes:
    out = [b"\x01", _coldef("v")]
    if not deprecate_eof:
        out.append(make_eof(status))
    frames, seq = b"", 1
    for p in out:
        f, seq = encode_packet(p, seq)
        frames += f
    return frames


async def test_truncated_result_set_then_close(rig, autojump):
    """Part of the result reached the client: the only clear signal is closing the client
    connection (an ERR now would be read as the rest of a row). Not resent."""
    bystander = await rig.client()
    c = await rig.client()
    fired = []

    async def intercept(conn, payload):
        if b"SELECT v FROM t WHERE k = 1" in payload and not fired:
            fired.append(1)
            row = encode_packet(lenenc_str(b"a" * 40), 4 if not conn.deprecate_eof else 3)[0]
            await conn.stream.send_all(_result_head(conn) + row[:20])
            return "drop"
        return None

    rig.server.intercept = intercept
    t0 = trio.current_time()
    with trio.fail_after(NEVER), pytest.raises(EOFError):
        await c.query("SELECT v FROM t WHERE k = 1")
    assert trio.current_time() - t0 <= IO_TIMEOUT
    assert rig.server.queries.count("SELECT v FROM t WHERE k = 1") == 1
    await healthy(bystander)


async def test_truncated_ok_of_a_write_then_close(rig, autojump):
    """The INSERT's OK was cut after two bytes: they reached the client, so its connection is
    closed (the write may have happened: never run again)."""
    bystander = await rig.client()
    c = await rig.client()
    rig.server.intercept = stall_on("INSERT INTO t VALUES (5", b"\x07\x00\x00\x01\x00\x01", then="close")
    t0 = trio.current_time()
    with trio.fail_after(NEVER), pytest.raises(EOFError):
        await c.query("INSERT INTO t VALUES (5, 'x')")
    assert trio.current_time() - t0 <= IO_TIMEOUT + SLACK
    assert rig.server.queries.count("INSERT INTO t VALUES (5, 'x')") == 1
    await healthy(bystander)


async def test_garbage_response_is_a_connection_error_not_a_replay(rig, autojump):
    """A response the tracker cannot parse (a control packet of several MiB): 1158, session
    ends, the statement is not run again."""
    bystander = await rig.client()
    c = await rig.client()
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (6, 'y')")
    rig.server.intercept = stall_on("UPDATE c", b"\x00\x00\x30\x01\x00")  # a 3 MiB "OK"
    with trio.fail_after(NEVER):
        result = await c.query("UPDATE c SET n = n + 1")
    assert not result.ok and result.code == 1158, result
    assert rig.server.queries.count("UPDATE c SET n = n + 1") == 1
    assert rig.server.queries.count("INSERT INTO t VALUES (6, 'y')") == 1  # the journal was not replayed
    await healthy(bystander)


async def test_ok_where_rows_were_due(rig, autojump):
    """Column definitions, then an OK where the rows should be: for the protocol that is a
    row (a first column of ''), then the server goes quiet -- see the stall case below. Here
    the server closes right after: the client, which already has part of the result, is
    disconnected; nothing is resent."""
    bystander = await rig.client()
    c = await rig.client()
    fired = []

    async def intercept(conn, payload):
        if b"SELECT COUNT(*) FROM t" in payload and not fired:
            fired.append(1)
            ok = encode_packet(make_ok(conn.status()), 4 if not conn.deprecate_eof else 3)[0]
            await conn.stream.send_all(_result_head(conn) + ok)
            return "drop"
        return None

    rig.server.intercept = intercept
    with trio.fail_after(NEVER), pytest.raises(EOFError):
        await c.query("SELECT COUNT(*) FROM t")
    assert rig.server.queries.count("SELECT COUNT(*) FROM t") == 1
    await healthy(bystander)


async def test_wrong_sequence_ids_pass_through_as_sent(rig, autojump):
    """A response with sequence ids out of order reaches the client as the server sent it
    (a real driver then reports "packets out of order", as it would directly); the proxy
    neither rewrites it nor runs anything again, and the session goes on."""
    bystander = await rig.client()
    c = await rig.client()
    fired = []

    async def intercept(conn, payload):
        if b"DELETE FROM t WHERE k = 9" in payload and not fired:
            fired.append(1)
            await conn.stream.send_all(encode_packet(make_ok(conn.status()), 7)[0])
            return "drop"  # answered (wrongly); then the server closes the idle connection
        return None

    rig.server.intercept = intercept
    await c.stream.send_all(encode_packet(b"\x03DELETE FROM t WHERE k = 9", 0)[0])
    with trio.fail_after(NEVER):
        while (packet := c.decoder.next_packet()) is None:
            c.decoder.feed(bytes(await c.stream.receive_some(65536)))
    assert packet.seq == 7 and packet.payload[0] == 0x00
    assert rig.server.queries.count("DELETE FROM t WHERE k = 9") == 1
    await c.must("SELECT COUNT(*) FROM t")
    await healthy(bystander)


@pytest.mark.parametrize("then", ["stall", "close"])
async def test_sixteen_mib_header_with_no_body(rig, autojump, then):
    """A 16 MiB length where the first packet of a response belongs (it can only be a small
    OK / ERR / column count): a protocol error at once -- 1158, not a wait for 16 MiB that
    never come, not a resend -- whether the server then stalls or closes."""
    bystander = await rig.client()
    c = await rig.client()
    rig.server.intercept = stall_on("SELECT v FROM t WHERE k = 2", b"\xff\xff\xff\x01\x01", then=then)
    t0 = trio.current_time()
    with trio.fail_after(NEVER):
        result = await c.query("SELECT v FROM t WHERE k = 2")
    assert not result.ok and result.code == 1158 and "out of sync" in result.message, result
    assert trio.current_time() - t0 <= IO_TIMEOUT
    with trio.fail_after(NEVER), pytest.raises(EOFError):
        await c.query("SELECT 1")  # the session ended
    assert rig.server.queries.count("SELECT v FROM t WHERE k = 2") == 1
    rig.server.intercept = None
    await healthy(bystander)


@pytest.mark.parametrize("before", [b"", _result_head_bytes()], ids=["silent", "mid-result"])
async def test_a_server_silent_after_accepting_a_command_is_waited_for_as_direct(rig, autojump, before):
    """A server that accepts a client's command and goes quiet (before answering, or in the
    middle of a result set) looks exactly like one running a long statement -- TiDB's ADD INDEX
    runs for hours through DM's connection -- so the proxy sets no timeout on a client's own
    command: the client waits, as it would connected directly, until its own read timeout
    closes the connection; then the proxy closes the backend connection too. A server that is
    gone for real (host down, network cut) is noticed by TCP keepalive (proxy/backend.py)."""
    bystander = await rig.client()
    c = await rig.client()
    rig.server.intercept = stall_on("SELECT v FROM t WHERE k = 3", before)
    with trio.move_on_after(BUFFER_WINDOW + IO_TIMEOUT + 600) as waited:
        await c.query("SELECT v FROM t WHERE k = 3")  # EOFError if the proxy closed the client
    assert waited.cancelled_caught and not c.closed  # no error made up, no answer: still waiting
    rig.server.intercept = None
    await healthy(bystander)
    [session] = [s for s in rig.proxy.target.sessions if s.cycle.inflight is not None]
    await c.stream.aclose()  # the client's own read timeout gives up
    with trio.fail_after(5):
        while session in rig.proxy.target.sessions:
            await trio.sleep(0.01)
    assert session.link.backend.channel.closed  # the server's session is let go
    assert rig.server.queries.count("SELECT v FROM t WHERE k = 3") == 1


async def test_unsolicited_garbage_while_idle_replaces_the_connection(rig, autojump):
    """Bytes that are not a response arrive while the client is idle: the connection is
    replaced before the client's next command; nothing is resent."""
    bystander = await rig.client()
    c = await rig.client()
    await c.must("INSERT INTO t VALUES (8, 'z')")
    conn = rig.server.live()[-1]
    await conn.stream.send_all(b"\x05\x00\x00\x09garbage")
    await trio.sleep(0.1)
    with trio.fail_after(NEVER):
        assert (await c.must("SELECT v FROM t WHERE k = 8")).rows == ["z"]
    assert rig.server.queries.count("INSERT INTO t VALUES (8, 'z')") == 1
    await healthy(bystander)


async def test_backend_sockets_notice_a_vanished_host():
    """Keepalive probes (idle connections) and TCP_USER_TIMEOUT (unacknowledged data) bound how
    long a backend connection to a host that vanished stays open."""
    import socket

    from proxy.backend import open_backend_socket
    from proxy.config import Address

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        channel = await open_backend_socket(Address("127.0.0.1", listener.getsockname()[1]))
        sock = channel.sock
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        idle, interval, count = (sock.getsockopt(socket.IPPROTO_TCP, o) for o in
                                 (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT))  # fmt: skip
        assert idle + interval * count <= 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 30_000
        channel.close()
    finally:
        listener.close()
