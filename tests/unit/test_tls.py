"""proxy.tls: the TLS channel variants over real non-blocking sockets (socketpair) and memory
streams, and the TLS config keys."""

from __future__ import annotations

import os
import socket
import ssl

import pytest
import trio
import trio.testing

from proxy.config import ConfigError, parse_config
from proxy.netio import Channel, PeerClosed, StreamChannel
from proxy.protocol.framing import encode_packet
from proxy.tls import TLSChannel, TLSError, TLSStreamChannel, backend_tls, check_files, describe, server_context, start_tls
from tests.lab.certs import make_certs


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


def server_ctx(certs) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(certs.server_cert, certs.server_key)
    return ctx


def client_ctx(ca) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(ca))
    return ctx


async def tls_pair(certs, stream: bool = False) -> tuple[Channel, Channel]:
    """(server, client) TLS channels over a socketpair (or memory streams)."""
    if stream:
        a, b = trio.testing.memory_stream_pair()
        plain_s, plain_c = StreamChannel(a, "server"), StreamChannel(b, "client")
    else:
        a, b = socket.socketpair()
        plain_s, plain_c = Channel(a, "server"), Channel(b, "client")
    out: dict[str, Channel] = {}
    async with trio.open_nursery() as nursery:

        async def side(name, plain, **kw):
            out[name] = await start_tls(plain, **kw)

        nursery.start_soon(lambda: side("s", plain_s, context=server_ctx(certs), server_side=True))
        nursery.start_soon(lambda: side("c", plain_c, context=client_ctx(certs.ca), server_side=False, server_hostname="localhost"))
    return out["s"], out["c"]


@pytest.mark.parametrize("stream", [False, True], ids=["socket", "stream"])
async def test_round_trip_and_packets(certs, stream):
    server, client = await tls_pair(certs, stream)
    assert isinstance(server, TLSStreamChannel if stream else TLSChannel)
    assert describe(client).startswith("TLSv1.")
    await client.send(encode_packet(b"\x03SELECT 1", 0)[0])
    packet = await server.read_packet()
    assert packet.payload == b"\x03SELECT 1"
    await server.send(b"pong")
    assert await client.recv(wait_first=True) == b"pong"
    client.close()  # sends close_notify
    with pytest.raises(PeerClosed):
        await server.recv()
    server.close()


async def test_wait_first_and_data_pending_see_buffered_tls_bytes(certs):
    """Bytes that already sit decrypted in the SSL object, or encrypted in the incoming BIO,
    are not visible on the socket: recv(wait_first=True) must not park on it."""
    server, client = await tls_pair(certs)
    blob = os.urandom(60_000)  # several TLS records, sent at once
    await client.send(blob)
    first = await server.recv(100)  # leaves most of it buffered on our side of the socket
    assert first == blob[:100]
    assert server.data_pending()
    got = first
    with trio.fail_after(2):  # parking on the socket would hang: the peer sends nothing more
        while len(got) < len(blob):
            got += await server.recv(wait_first=True)
    assert got == blob
    assert not server.data_pending()
    # A record read whole but only partly consumed: decrypted bytes in SSLObject.pending().
    await client.send(b"x" * 1000)
    assert (await server.recv(10, wait_first=True)) == b"x" * 10
    assert server.tls.pending() and server.data_pending()
    with trio.fail_after(2):
        assert await server.recv(wait_first=True) == b"x" * 990
    server.close()
    client.close()


async def test_bytes_behind_the_ssl_request_start_the_handshake(certs):
    """A client that sends its ClientHello right behind the SSLRequest, in one segment: the
    plain channel's decoder holds the first TLS bytes after reading the request."""
    a, b = socket.socketpair()
    server_plain = Channel(a, "server")
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_ctx(certs.ca).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    ssl_request = encode_packet(b"\x00" * 32, 1)[0]
    b.sendall(ssl_request + outgoing.read())  # one send: request + ClientHello
    await trio.sleep(0.05)
    packet = await server_plain.read_packet()
    assert packet.payload == b"\x00" * 32 and server_plain.decoder.buffered()

    async def client_side():
        b.setblocking(False)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    b.sendall(outgoing.read())
                await trio.lowlevel.wait_readable(b)
                incoming.write(b.recv(65536))
        if outgoing.pending:
            b.sendall(outgoing.read())
        tls.write(b"hello")
        b.sendall(outgoing.read())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client_side)
        server = await start_tls(server_plain, server_ctx(certs), server_side=True)
    assert server_plain.closed and not server.closed  # the plain channel is detached
    assert await server.recv() == b"hello"
    server.close()
    b.close()


async def test_big_transfers_both_ways_at_once(certs):
    server, client = await tls_pair(certs)
    up, down = os.urandom(3 << 20), os.urandom(3 << 20)

    async def pump(src, data):
        await src.send(data)

    async def drain(dst, n, into):
        buf = bytearray()
        while len(buf) < n:
            buf += await dst.recv()
        into.append(bytes(buf))

    got_up, got_down = [], []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, client, up)
            nursery.start_soon(pump, server, down)
            nursery.start_soon(drain, server, len(up), got_up)
            nursery.start_soon(drain, client, len(down), got_down)
    assert got_up == [up] and got_down == [down]
    server.close()
    client.close()


async def test_two_tasks_sending_at_once_keep_the_records_whole(certs):
    """A task parked mid-send (socket full) and another task writing meanwhile (as a read
    that answers a TLS KeyUpdate does): the encrypted bytes must go out in order."""
    server, client = await tls_pair(certs)
    a, b = b"a" * (2 << 20), b"b" * (2 << 20)
    received = bytearray()

    async def drain():
        await trio.sleep(0.2)  # let both senders fill the socket buffer and park
        while len(received) < len(a) + len(b):
            received.extend(await server.recv())

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.send, a)
            nursery.start_soon(client.send, b)
            nursery.start_soon(drain)
    assert received.count(b"a") == len(a) and received.count(b"b") == len(b)  # no bad record
    server.close()
    client.close()


async def test_untrusted_certificate_is_a_verify_error(certs):
    a, b = socket.socketpair()
    results = {}

    async def srv():
        try:
            await start_tls(Channel(a, "server"), server_ctx(certs), server_side=True)
        except PeerClosed as exc:
            results["server"] = exc

    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv)
        with pytest.raises(TLSError) as info:
            await start_tls(Channel(b, "backend"), client_ctx(certs.other_ca), server_side=False, server_hostname="localhost")
    assert info.value.verify
    assert "certificate verify failed" in str(info.value)
    assert "unknown ca" in str(results["server"]).lower()


async def test_hostname_is_checked_when_asked(certs):
    ctx = client_ctx(certs.ca)  # check_hostname is on for PROTOCOL_TLS_CLIENT
    a, b = socket.socketpair()

    async def srv():
        with pytest.raises(PeerClosed):
            await start_tls(Channel(a, "server"), server_ctx(certs), server_side=True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(srv)
        with pytest.raises(TLSError, match="mismatch"):
            await start_tls(Channel(b, "backend"), ctx, server_side=False, server_hostname="db.example.com")


def test_plain_channel_hot_path_is_untouched():
    """TLS is a subclass: the plain Channel's methods are its own, with no TLS branch."""
    for name in ("recv", "send", "read_packet", "data_pending", "send_nowait", "close"):
        assert name in Channel.__dict__ or name == "read_packet"
        assert "tls" not in Channel.__dict__[name].__code__.co_names
    assert TLSChannel.recv is not Channel.recv and TLSChannel.read_packet is Channel.read_packet


# ---------------------------------------------------------------------------- config

BASE = {"backend": {"addresses": ["127.0.0.1:3306"]}, "users": [{"name": "app", "password": "pw"}]}


def test_config_keys(certs):
    cfg = parse_config(
        {
            **BASE,
            "listen": {"tls": {"cert": str(certs.server_cert), "key": str(certs.server_key), "require": True}},
            "backend": {
                "addresses": ["127.0.0.1:3306"],
                "tls": {"mode": "verify-identity", "ca": str(certs.ca), "server_name": "db.example"},
            },
        }
    )
    assert cfg.listen.tls.require
    assert server_context(cfg.listen.tls) is server_context(cfg.listen.tls)  # built once
    backend = backend_tls(cfg.backend.tls)
    assert backend.context.check_hostname and backend.context.verify_mode == ssl.CERT_REQUIRED
    assert backend.hostname_for("10.0.0.1") == "db.example"
    assert parse_config(BASE).listen.tls is None and backend_tls(parse_config(BASE).backend.tls) is None
    for mode, verify, names in (
        ("preferred", ssl.CERT_NONE, False),
        ("required", ssl.CERT_NONE, False),
        ("verify-ca", ssl.CERT_REQUIRED, False),
    ):
        extra = {"ca": str(certs.ca)} if mode == "verify-ca" else {}
        ctx = backend_tls(
            parse_config({**BASE, "backend": {"addresses": ["127.0.0.1:1"], "tls": {"mode": mode, **extra}}}).backend.tls
        ).context
        assert (ctx.verify_mode, ctx.check_hostname) == (verify, names)


@pytest.mark.parametrize(
    "section, value, message",
    [
        ("listen", {"cert": "/nonexistent.pem", "key": "/nonexistent.key"}, "$.listen.tls: cert/key: cannot read"),
        ("listen", {"cert": "CERT"}, "$.listen.tls.key: required key missing"),
        ("listen", {"cert": "CERT", "key": "KEY", "required": True}, "unknown key(s) required"),
        ("backend", {"mode": "verify-full"}, "$.backend.tls.mode: expected one of"),
        ("backend", {"ca": "CA"}, "ca given but mode is 'off'"),
        ("backend", {"mode": "required", "ca": "CA"}, "ca is only used by mode"),
        ("backend", {"mode": "verify-ca", "ca": "/nonexistent.pem"}, "$.backend.tls: ca: cannot read"),
        ("backend", {"mode": "verify-ca", "ca": "CERT"}, None),
        ("backend", {"mode": "required", "key": "KEY"}, "key given without cert"),
    ],
)
def test_config_errors(certs, section, value, message):
    subst = {"CERT": str(certs.server_cert), "KEY": str(certs.server_key), "CA": str(certs.ca)}
    value = {k: subst.get(v, v) if isinstance(v, str) else v for k, v in value.items()}
    data = dict(BASE)
    data[section] = {**data.get(section, {}), "tls": value}
    if message is None:
        check_files(parse_config(data))
        return
    with pytest.raises(ConfigError) as info:
        check_files(parse_config(data))  # the shape is parse_config's, the files check_files's
    assert message in str(info.value)


def test_building_a_config_reads_no_file(tmp_path):
    missing = str(tmp_path / "absent.pem")
    cfg = parse_config(
        {
            **BASE,
            "listen": {"tls": {"cert": missing, "key": missing}},
            "backend": {"addresses": ["127.0.0.1:1"], "tls": {"mode": "verify-ca", "ca": missing}},
        }
    )
    with pytest.raises(ConfigError) as info:
        check_files(cfg)
    assert "$.listen.tls: cert/key: cannot read" in str(info.value) and "$.backend.tls: ca: cannot read" in str(info.value)
