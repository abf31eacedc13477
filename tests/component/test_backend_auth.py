"""Backend login with caching_sha2_password (what MySQL 8 / TiDB may ask for), against a
scripted server over memory streams: the fast path, full authentication with the server's
RSA key, and an auth switch from caching_sha2 to mysql_native_password."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from proxy.backend import BackendError, Login, connect_backend
from proxy.config import Address
from proxy.netio import StreamChannel
from proxy.protocol.auth import CACHING_SHA2, NATIVE, native_scramble, new_scramble, sha2_scramble
from proxy.protocol.constants import PROXY_CAPABILITIES, Capabilities
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import (
    ServerHandshake,
    lenenc_str,
    make_auth_switch,
    make_eof,
    make_err,
    make_ok,
    make_server_handshake,
    parse_handshake_response,
)

PASSWORD = "s3cret-pw"
KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
PEM = KEY.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


class Sha2Server:
    """Scripted server side of one login. ``mode``: "fast" (password cached), "full" (cache
    empty: RSA full authentication), "switch" (asks the client to switch to native)."""

    def __init__(self, stream, mode: str) -> None:
        self.stream = stream
        self.mode = mode
        self.decoder = PacketDecoder()
        self.steps: list[str] = []

    async def read(self) -> tuple[int, bytes]:
        while (p := self.decoder.next_packet()) is None:
            self.decoder.feed(bytes(await self.stream.receive_some(65536)))
        return p.seq, p.payload

    async def send(self, payload: bytes, seq: int) -> None:
        await self.stream.send_all(encode_packet(payload, seq)[0])

    async def run(self) -> None:
        scramble = new_scramble()
        hs = ServerHandshake("8.0.36-fake", 7, scramble, int(PROXY_CAPABILITIES), 255, 2, CACHING_SHA2)
        await self.send(make_server_handshake(hs), 0)
        seq, payload = await self.read()
        resp = parse_handshake_response(payload)
        assert resp.auth_plugin == CACHING_SHA2
        if self.mode == "switch":
            switch_scramble = new_scramble()
            await self.send(make_auth_switch(NATIVE, switch_scramble), seq + 1)
            seq, answer = await self.read()
            ok = answer == native_scramble(PASSWORD, switch_scramble)
            self.steps.append("switched")
        else:
            assert resp.auth_response == sha2_scramble(PASSWORD, scramble)
            if self.mode == "fast":
                await self.send(b"\x01\x03", seq + 1)
                seq += 1
                ok = True
                self.steps.append("fast")
            else:
                await self.send(b"\x01\x04", seq + 1)  # perform full authentication
                seq, request = await self.read()
                assert request == b"\x02", "client must ask for the public key (no TLS)"
                await self.send(b"\x01" + PEM, seq + 1)
                seq, encrypted = await self.read()
                plain = KEY.decrypt(encrypted, padding.OAEP(padding.MGF1(hashes.SHA1()), hashes.SHA1(), None))
                xored = bytes(b ^ scramble[i % len(scramble)] for i, b in enumerate(plain))
                ok = xored == PASSWORD.encode() + b"\x00"
                self.steps.append("full")
        if not ok:
            await self.send(make_err(1045, "28000", "Access denied"), seq + 1)
            return
        await self.send(make_ok(2), seq + 1)
        seq, query = await self.read()  # the proxy's SELECT @@max_allowed_packet
        assert b"max_allowed_packet" in query
        coldef = lenenc_str(b"def") + b"\x00\x00\x00" + lenenc_str(b"m") + b"\x00\x0c" + bytes(12)
        if resp.capabilities & Capabilities.CLIENT_DEPRECATE_EOF:
            out = [b"\x01", coldef, lenenc_str(b"67108864"), make_ok(2, header=0xFE)]
        else:
            out = [b"\x01", coldef, make_eof(2), lenenc_str(b"67108864"), make_eof(2)]
        for i, p in enumerate(out):
            await self.send(p, seq + 1 + i)


@pytest.mark.parametrize("mode", ["fast", "full", "switch"])
async def test_caching_sha2_backend_login(nursery, mode):
    proxy_side, server_side = trio.testing.memory_stream_pair()
    server = Sha2Server(server_side, mode)
    nursery.start_soon(server.run)

    async def opener(address):
        return StreamChannel(proxy_side, "backend")

    login = Login("app", PASSWORD, None, 45, int(PROXY_CAPABILITIES))
    backend = await connect_backend(Address("10.0.0.1", 3306), login, connect_timeout=5, io_timeout=5, opener=opener)
    assert backend.max_allowed_packet == 64 << 20
    assert server.steps == [{"fast": "fast", "full": "full", "switch": "switched"}[mode]]


async def test_wrong_backend_password_is_a_non_retryable_error(nursery):
    proxy_side, server_side = trio.testing.memory_stream_pair()
    nursery.start_soon(Sha2Server(server_side, "switch").run)

    async def opener(address):
        return StreamChannel(proxy_side, "backend")

    login = Login("app", "wrong", None, 45, int(PROXY_CAPABILITIES))
    with pytest.raises(BackendError) as info:
        await connect_backend(Address("10.0.0.1", 3306), login, connect_timeout=5, io_timeout=5, opener=opener)
    assert not info.value.retryable and info.value.err.code == 1045
