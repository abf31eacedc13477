"""TLS on both sides, end to end over memory streams: a TLS client (trio.SSLStream) → the proxy
([listen.tls], TLSStreamChannel) → a fake server that offers TLS (trio.SSLStream), with the
same fake server engine as the recovery tests."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable

import pytest
import trio

from proxy.netio import StreamChannel
from proxy.protocol.auth import native_scramble, new_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import (
    HandshakeResponse,
    ServerHandshake,
    lenenc_str,
    make_err,
    make_handshake_response,
    make_server_handshake,
    parse_err,
    parse_handshake_response,
    parse_server_handshake,
)
from tests.component.fakes import AUTOCOMMIT, FakeClient, FakeConnection, FakeServer, MySQLError, make_config
from tests.component.rig import Rig
from tests.lab.certs import make_certs

SSL = int(Capabilities.CLIENT_SSL)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certs(tmp_path_factory.mktemp("tls"))


class TLSFakeConnection(FakeConnection):
    """The fake server's connection, offering TLS (and optionally requiring it)."""

    def __init__(self, server: TLSFakeServer, stream, conn_id: int) -> None:
        super().__init__(server, stream, conn_id)
        self.raw = stream
        self.secure = False
        self.spoke = False  # sent a handshake response (the proxy's profile probe does not)

    def close(self, *args, **kwargs) -> None:
        stream, self.stream = self.stream, self.raw  # the base class closes the memory streams
        try:
            super().close(*args, **kwargs)
        finally:
            self.stream = stream

    async def _exact(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            try:
                data = await self.raw.receive_some(n - len(out))
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                return None
            if not data:
                return None
            out += data
        return out

    async def run(self) -> None:
        server: TLSFakeServer = self.server  # type: ignore[assignment]
        scramble = new_scramble()
        caps = int(PROXY_CAPABILITIES) | (SSL if server.tls_context is not None else 0)
        hs = ServerHandshake("10.11.0-fake", self.id, scramble, caps, 45, AUTOCOMMIT, "mysql_native_password")
        await self._send([make_server_handshake(hs)], 0)
        # Read the first packet exactly: TLS bytes may follow an SSLRequest at once.
        head = await self._exact(4)
        payload = await self._exact(head[0] | head[1] << 8 | head[2] << 16) if head else None
        if payload is None:
            return self.close()
        seq = head[3]
        self.spoke = True
        resp = parse_handshake_response(payload)
        if resp.ssl_request:
            server.ssl_requests.append(resp.capabilities)
            self.stream = trio.SSLStream(self.raw, server.tls_context, server_side=True)
            try:
                await self.stream.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return self.close()
            self.secure = True
            got = await self._read()
            if got is None:
                return self.close()
            seq, payload = got
            resp = parse_handshake_response(payload)
            assert seq == 2 and resp.capabilities & SSL
        elif server.require_tls:
            await self._send([make_err(3159, "HY000", "Connections using insecure transport are prohibited")], seq + 1)
            return self.close()
        await self.login_and_serve(resp, seq, scramble)


class TLSFakeServer(FakeServer):
    def __init__(self, nursery, certs, *, tls: bool = True, require_tls: bool = True) -> None:
        super().__init__(nursery)
        self.tls_context = None
        if tls:
            self.tls_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls_context.load_cert_chain(certs.server_cert, certs.server_key)
        self.require_tls = require_tls
        self.ssl_requests: list[int] = []

    async def opener(self, address):
        if not self.up:
            raise ConnectionRefusedError(111, "Connection refused")
        proxy_side, server_side = self.stream_pair()
        self.next_id += 1
        conn = TLSFakeConnection(self, server_side, self.next_id)
        self.connections.append(conn)
        self.nursery.start_soon(conn.run)
        return StreamChannel(proxy_side, f"backend {address}")


class TLSClient(FakeClient):
    """FakeClient that switches to TLS after the greeting (``tls=False``: logs in plain)."""

    def __init__(self, stream, ca, tls: bool = True) -> None:
        super().__init__(stream)
        self.raw = stream
        self.ca = ca
        self.tls = tls

    async def login(self, user: str = "app", password: str = "apppw", database: str | None = "test") -> None:
        hs = parse_server_handshake(await self._read_packet())
        caps = int(PROXY_CAPABILITIES) & hs.capabilities & ~int(Capabilities.CLIENT_DEPRECATE_EOF)
        caps |= int(Capabilities.CLIENT_CONNECT_WITH_DB)
        seq = 1
        if self.tls:
            caps |= SSL
            await self.stream.send_all(encode_packet(make_handshake_response(HandshakeResponse(caps, 1 << 24, 45, "", b""))[:32], 1)[0])
            ctx = ssl.create_default_context(cafile=str(self.ca))
            self.stream = trio.SSLStream(self.raw, ctx, server_hostname="localhost")
            await self.stream.do_handshake()
            self.decoder = PacketDecoder()
            seq = 2
        resp = HandshakeResponse(caps, 1 << 24, 45, user, native_scramble(password, hs.scramble), database, "mysql_native_password")
        await self.stream.send_all(encode_packet(make_handshake_response(resp), seq)[0])
        answer = await self._read_packet()
        if answer[0] == 0xFF:
            err = parse_err(answer)
            raise MySQLError(err.code, err.message)


@pytest.fixture
def tls_rig(make_rig: Callable[..., Rig], nursery: trio.Nursery, certs) -> Callable[..., Rig]:
    """``tls_rig(listen_tls=, backend_tls=, server_tls=True, require_tls=True)``: [listen.tls]
    and [backend.tls] as given, a server offering TLS (``server_tls``) and refusing plain logins
    (``require_tls``), TLS clients trusting the lab's CA."""

    def make(*, listen_tls: dict | None = None, backend_tls: dict | None = None, server_tls: bool = True, require_tls: bool = True) -> Rig:
        listen = {"tls": listen_tls} if listen_tls is not None else {}
        backend = {"tls": backend_tls} if backend_tls is not None else {}
        config = make_config(listen=listen, backend=backend, recovery={"backoff_initial": "10ms"})
        server = TLSFakeServer(nursery, certs, tls=server_tls, require_tls=require_tls)
        return make_rig(config, server=server, client_class=functools.partial(TLSClient, ca=certs.ca))

    return make


def listen_tls(certs, require: bool = False) -> dict:
    return {"cert": str(certs.server_cert), "key": str(certs.server_key), "require": require}


def verify_ca(certs, ca=None, mode: str = "verify-ca", **extra) -> dict:
    return {"mode": mode, "ca": str(ca or certs.ca), **extra}


async def test_tls_on_both_sides_and_recovery(tls_rig, autojump, certs):
    rig = tls_rig(listen_tls=listen_tls(certs, require=True), backend_tls=verify_ca(certs))
    c = await rig.client()
    assert isinstance(c.stream, trio.SSLStream)
    assert rig.server.live()[-1].secure and rig.server.ssl_requests
    assert rig.server.ssl_requests[0] & SSL
    await c.must("BEGIN")
    await c.must("INSERT INTO t VALUES (1, 'a')")
    rig.server.restart()  # the backend goes away mid-transaction: reconnect over TLS, replay
    await c.must("INSERT INTO t VALUES (2, 'b')")
    await c.must("COMMIT")
    assert sorted(rig.server.db.rows) == [1, 2]
    logins = [conn for conn in rig.server.connections if conn.spoke]
    assert len(logins) >= 2 and all(conn.secure for conn in logins)  # the first login, the reconnect
    big = "x" * 200_000  # several TLS records each way
    await c.must(f"REPLACE INTO t VALUES (3, '{big}')")
    assert rig.server.db.rows[3] == big
    await c.stream.send_all(encode_packet(b"\x03SELECT v FROM t WHERE k = 3", 0)[0])
    packets = [await c._read_packet() for _ in range(5)]  # count, column, EOF, row, EOF
    assert packets[3] == lenenc_str(big.encode())


async def test_require_refuses_a_plain_client_with_3159(tls_rig, autojump, certs):
    rig = tls_rig(listen_tls=listen_tls(certs, require=True), backend_tls=verify_ca(certs))
    c = await rig.client(tls=False, login=False)
    with pytest.raises(MySQLError) as info:
        await c.login()
    assert info.value.code == 3159
    assert info.value.message == ("Connections using insecure transport are prohibited while --require_secure_transport=ON.")


async def test_plain_client_allowed_without_require(tls_rig, autojump, certs):
    rig = tls_rig(listen_tls=listen_tls(certs), backend_tls=verify_ca(certs))
    c = await rig.client(tls=False)
    assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]


async def test_ssl_request_without_listen_tls_gets_a_clear_error(tls_rig, autojump, certs):
    rig = tls_rig(backend_tls=verify_ca(certs))
    c = await rig.client(login=False)
    caps = parse_server_handshake(await c._read_packet()).capabilities
    assert not caps & SSL  # not offered
    request = make_handshake_response(HandshakeResponse((caps & int(PROXY_CAPABILITIES)) | SSL, 1 << 24, 45, "", b""))
    await c.stream.send_all(encode_packet(request[:32], 1)[0])
    err = parse_err(await c._read_packet())
    assert err.code == 1043 and "no TLS configured" in err.message


async def test_backend_with_an_untrusted_certificate(tls_rig, autojump, certs):
    rig = tls_rig(listen_tls=listen_tls(certs), backend_tls=verify_ca(certs, ca=certs.other_ca))
    c = await rig.client(login=False)
    with pytest.raises(MySQLError) as info:
        with trio.fail_after(5):  # not retried for recovery.buffer_window: a config error
            await c.login()
    assert info.value.code == 1105
    assert "certificate verify failed" in info.value.message and "verify-ca" in info.value.message


@pytest.mark.parametrize("server_name, ok", [(None, False), ("localhost", True), ("db.example.com", False)])
async def test_verify_identity_checks_the_name(tls_rig, autojump, certs, server_name, ok):
    # The fake backend's address is 10.0.0.1 (make_config), checked when no server_name is
    # given; the certificate names localhost and 127.0.0.1.
    extra = {"server_name": server_name} if server_name else {}
    rig = tls_rig(backend_tls=verify_ca(certs, mode="verify-identity", **extra))
    c = await rig.client(tls=False, login=False)
    if ok:
        await c.login()
        assert (await c.must("SELECT COUNT(*) FROM t")).rows == ["0"]
    else:
        with pytest.raises(MySQLError) as info:
            await c.login()
        assert "mismatch" in info.value.message and "verify-identity" in info.value.message


async def test_preferred_uses_tls_when_offered_and_plain_otherwise(tls_rig, autojump):
    rig = tls_rig(backend_tls={"mode": "preferred"})
    c = await rig.client(tls=False)
    await c.must("SELECT COUNT(*) FROM t")
    assert rig.server.live()[-1].secure
    plain = tls_rig(backend_tls={"mode": "preferred"}, server_tls=False, require_tls=False)
    c = await plain.client(tls=False)
    await c.must("SELECT COUNT(*) FROM t")
    assert not plain.server.live()[-1].secure


async def test_required_fails_when_the_server_offers_no_tls(tls_rig, autojump):
    rig = tls_rig(backend_tls={"mode": "required"}, server_tls=False, require_tls=False)
    c = await rig.client(tls=False, login=False)
    with pytest.raises(MySQLError) as info:
        await c.login()
    assert "does not offer TLS" in info.value.message


async def test_mode_off_against_a_server_requiring_tls(tls_rig, autojump):
    rig = tls_rig()  # no [backend.tls]: the server's own refusal reaches the client
    c = await rig.client(tls=False, login=False)
    with pytest.raises(MySQLError) as info:
        await c.login()
    assert info.value.code == 3159
