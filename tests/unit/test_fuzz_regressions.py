"""Golden regression tests for what the fuzzers found (tests/fuzz; issue "hostile peers").

Each case is the smallest input that broke the rule, with the behaviour it must have now.
The proxy/backend.py cases were fixed by that module's owner.
"""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from proxy.backend import Backend, BackendError, Login, connect_backend
from proxy.config import Address
from proxy.netio import PeerClosed
from proxy.protocol.auth import CACHING_SHA2, NATIVE, SHA256, ClientAuth
from proxy.protocol.constants import PROXY_CAPABILITIES
from proxy.protocol.packets import ProtocolError, ServerHandshake, lenenc_str, make_eof, make_ok, make_server_handshake
from proxy.protocol.response import Expect, ResponseTracker
from proxy.protocol.resultset import decode_text_row
from proxy.sqltext import analyze, classify
from tests.fuzz.targets import TARGETS, ChunkChannel, _Opened, chunks, frames

CAPS = int(PROXY_CAPABILITIES)

# ---------------------------------------------------------------------------- auth.py


def _pem(key) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


@pytest.mark.parametrize(
    "key",
    [
        b"garbage",
        b"-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----\n",
        _pem(ec.generate_private_key(ec.SECP256R1())),  # not RSA: no .encrypt(..., OAEP)
        _pem(rsa.generate_private_key(65537, 1024)),  # too small for OAEP with this password?
    ],
    ids=["garbage", "bad-base64", "ec-key", "rsa-1024"],
)
@pytest.mark.parametrize("plugin", [SHA256, CACHING_SHA2])
def test_unusable_rsa_key_from_the_server_is_a_protocol_error(plugin, key):
    """Found by backend_auth: a ValueError from the PEM loader escaped ClientAuth (and
    connect_backend, as an internal error)."""
    auth = ClientAuth("app", "apppw" * 30, bytes(range(1, 21)), plugin)
    auth.first_response()
    if plugin == CACHING_SHA2:
        assert auth.on_packet(b"\x01\x04") == ("send", b"\x02")  # perform full authentication
    try:
        action, value = auth.on_packet(b"\x01" + key)
    except ProtocolError as exc:
        assert "RSA public key" in str(exc)
    else:  # a usable key: the encrypted password
        assert action == "send" and isinstance(value, bytes) and len(value) >= 128


# ---------------------------------------------------------------------------- response.py


@pytest.mark.parametrize("sel", [0, 1, 2, 7])
def test_empty_packet_completes_a_single_response_however_chunked(sel):
    """Found by response (chunking oracle): a zero-length packet whose header came in pieces
    waited for more bytes instead of completing the response."""
    stream = b"\x00\x00\x00\x01"
    tracker = ResponseTracker(Expect.SINGLE)
    ends = [tracker.feed(part) for part in chunks(stream, sel)]
    assert tracker.done and ends[-1] >= 0 and tracker.nbytes == 4


@pytest.mark.parametrize("sel", [0, 1, 3])
def test_empty_packet_after_more_results_is_an_error_however_chunked(sel):
    stream = frames(make_ok(0x000A), seq=1) + b"\x00\x00\x00\x02"  # MORE_RESULTS, then nothing valid
    tracker = ResponseTracker(Expect.QUERY)
    with pytest.raises(ProtocolError):
        for part in chunks(stream, sel):
            tracker.feed(part)


# ---------------------------------------------------------------------------- resultset.py


@pytest.mark.parametrize("payload, ncols", [(b"", 1), (b"\x01a", 2), (b"\xfb", 3)])
def test_short_text_row_is_a_protocol_error(payload, ncols):
    """Found by resultset: an IndexError for a row with fewer columns than announced."""
    with pytest.raises(ProtocolError):
        decode_text_row(payload, ncols)


# ---------------------------------------------------------------------------- sqltext


@pytest.mark.parametrize("text", ["START", "start ", "START;", "START -- x", "/*!START*/"])
def test_start_alone_is_unknown_not_a_crash(text):
    """Found by sql_judge: classify('START') raised IndexError (classify never raises)."""
    assert classify(text).unknown is not None
    assert analyze(text).unknown is not None
    assert analyze(f"{text}\nSELECT 1").unknown is not None


# ---------------------------------------------------------------------------- fuzz inputs, as found

GOLDEN = [
    (
        "backend_auth",
        "002cfe63616368696e675f736861325f70617373776f726400737373737373737373737373737373737373737300020104ff0167617262616765",
    ),
    ("response", "010200000001"),
    ("response", "0200070000010001010d0000ff00000000"),
    ("response", "12ee00000001"),
    ("resultset", "01030161fb"),
    ("sql_judge", "0c535441525420"),
    ("sql_judge", "033b3b3b"),
]


@pytest.mark.parametrize("target, data", GOLDEN)
def test_fuzz_input(target, data):
    TARGETS[target].run(bytes.fromhex(data))


# ---------------------------------------------------------------------------- backend.py (fixed by its owner)


async def _query(server_bytes: bytes):
    hs = ServerHandshake("10.11.19-MariaDB", 5, bytes(range(1, 21)), CAPS, 45, 2, NATIVE)
    backend = Backend(ChunkChannel([server_bytes]), Address("127.0.0.1", 1), hs, CAPS & ~(1 << 24), 2, 0.0)
    return await backend.query("SELECT @@max_allowed_packet")


_COL = lenenc_str(b"def") + lenenc_str(b"") * 3 + lenenc_str(b"c") + lenenc_str(b"") + b"\x0c" + bytes(12)


@pytest.mark.parametrize(
    "server_bytes",
    [frames(b"", seq=1), frames(b"\x01", _COL, make_eof(2), b"", make_eof(2), seq=1)],
    ids=["empty-first-packet", "empty-row"],
)
async def test_backend_query_empty_packet(server_bytes):
    """Found by backend_login: Backend.query read payload[0] of an empty packet (IndexError)."""
    with pytest.raises((BackendError, ProtocolError, PeerClosed)):
        await _query(server_bytes)


async def test_backend_login_non_numeric_max_allowed_packet():
    """Found by backend_login: int() of a non-numeric @@max_allowed_packet escaped
    connect_backend as a ValueError (an internal error in the session). The proxy cannot size
    its packets without the server's limit: the login fails with a BackendError saying so, not
    retried (the same server answers the same), and the connection is closed."""
    greeting = make_server_handshake(ServerHandshake("10.11.19-MariaDB", 5, bytes(range(1, 21)), CAPS, 45, 2, NATIVE))
    row = b"".join(lenenc_str(v) for v in (b"lots", b"28800", b"h", b"3306", b"1700000000"))
    answer = frames(b"\x05", *[_COL] * 5, make_eof(2), row, make_eof(2), seq=1)
    channel = ChunkChannel([frames(greeting), frames(make_ok(2), seq=2), answer])
    login = Login("app", "apppw", None, 45, CAPS & ~(1 << 24))
    with pytest.raises(BackendError) as info:
        await connect_backend(Address("127.0.0.1", 1), login, connect_timeout=5, io_timeout=5, opener=_Opened(channel))
    message = str(info.value)
    assert message.startswith("127.0.0.1:1: @@max_allowed_packet is ") and "lots" in message, message
    assert message.endswith(", not a number"), message
    assert info.value.retryable is False
    assert channel.closed
