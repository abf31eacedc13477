"""One fuzz target per parser the proxy exposes to the network.

A target is a function of raw bytes. It reads its options from the first bytes (so a
coverage-guided fuzzer can flip them too), runs the parser, swallows the codec's own
exceptions and raises ``Finding`` (or lets any other exception escape) when the rule is
broken. The rule:

- no exception but the codec's own: ``ProtocolError`` for packets, ``SqlParseError`` for SQL
  text (``analyze``, ``classify``, ``claim``, ``redact`` raise nothing at all), ``CannotSplit``
  for the INSERT splitter, ``BackendError`` / ``PeerClosed`` for the backend login;
- no unbounded allocation: a length field says what to expect, never what to allocate (the
  runners bound memory: tracemalloc in the short mode, RLIMIT_AS / libFuzzer's RSS limit in
  the long mode);
- no infinite loop and no waiting on a packet the input does not hold: sans-IO code returns
  (the runners bound the time per input); the async readers are run synchronously over a
  channel that ends with PeerClosed, so one that wants more than the input has raises it
  instead of blocking;
- the same answer however the bytes are chunked (framing, the response tracker, intake), and
  with the fingerprint on or off.

Continuation frames need 16 MiB in real life: ``frame_size`` shrinks ``MAX_FRAME`` in the
framing/response/resultset/intake modules for one input, so a few bytes exercise the same
code paths.
"""

from __future__ import annotations

import contextlib
import random
import struct
from collections.abc import Callable, Iterator

import attrs
import trio

from proxy import corebuild
from proxy.backend import Backend, BackendError, Login, connect_backend
from proxy.config import Address
from proxy.netio import PeerClosed
from proxy.protocol import framing, response, resultset
from proxy.protocol.auth import CACHING_SHA2, NATIVE, SHA256, ClientAuth, ServerAuth
from proxy.protocol.constants import MAX_FRAME, PROXY_CAPABILITIES, Capabilities
from proxy.protocol.framing import PacketDecoder, encode_packet
from proxy.protocol.packets import (
    HandshakeResponse,
    ProtocolError,
    Reader,
    ServerHandshake,
    lenenc_str,
    make_eof,
    make_err,
    make_handshake_response,
    make_ok,
    make_server_handshake,
    parse_auth_switch,
    parse_change_user,
    parse_eof,
    parse_err,
    parse_handshake_response,
    parse_ok,
    parse_prepare_ok,
    parse_server_handshake,
)
from proxy.protocol.response import Expect, ResponseTracker
from proxy.relay import reading, responses
from proxy.session import intake
from proxy.sqltext import (
    MARIADB,
    TRIVIA,
    UNKNOWN,
    Dialect,
    Kind,
    SqlParseError,
    analyze,
    classify,
    is_idempotent,
    leading_keywords,
    parse_insert_head,
    parse_set,
    split_statements,
    tokenize,
)
from proxy.sqltext.claims import claim
from proxy.sqltext.idempotence import changes_no_rows
from proxy.sqltext.redact import redact
from proxy.sqltext.split import CannotSplit, count_rows, split_values_statement
from proxy.sqltext.triage import fast_verb, may_pin_session

__all__ = ["TARGETS", "Target", "Finding", "frame_size"]


class Finding(AssertionError):
    """An oracle of a target does not hold."""


def check(cond: bool, message: str) -> None:
    if not cond:
        raise Finding(message)


@attrs.frozen
class Target:
    name: str
    run: Callable[[bytes], None]
    seeds: Callable[[], list[bytes]]
    doc: str


# ----------------------------------------------------------------------------- helpers


class In:
    """Reads options off the front of an input; past the end everything is 0."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        if self.pos < len(self.data):
            self.pos += 1
            return self.data[self.pos - 1]
        return 0

    def u32(self) -> int:
        return self.byte() | self.byte() << 8 | self.byte() << 16 | self.byte() << 24

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out


# MAX_FRAME values a target may run with: the real one, and small ones that make continuation
# frames reachable with a few bytes. The small ones are patched into the modules' globals, which a
# compiled module does not read (its MAX_FRAME is a constant): the compiled core is fuzzed with the
# real one, the interpreted pass (.ci/run) with all four.
_ALL_FRAME_SIZES = (MAX_FRAME, 9, 13, 24)
FRAME_SIZES = (MAX_FRAME,) * 4 if corebuild.mode().startswith("compiled") else _ALL_FRAME_SIZES
_FRAME_MODULES = (framing, response, resultset, intake, reading)


@contextlib.contextmanager
def frame_size(n: int) -> Iterator[None]:
    if n == MAX_FRAME:
        yield
        return
    saved = [m.MAX_FRAME for m in _FRAME_MODULES]
    for m in _FRAME_MODULES:
        m.MAX_FRAME = n
    try:
        yield
    finally:
        for m, v in zip(_FRAME_MODULES, saved):
            m.MAX_FRAME = v


def clamp_frames(stream: bytes, size: int) -> bytes:
    """``stream`` with every frame header's length cut to ``size``: with a small MAX_FRAME, a
    longer frame would be something no real peer can send (3 bytes hold 0xFFFFFF at most)."""
    if size == MAX_FRAME:
        return stream
    out = bytearray(stream)
    pos = 0
    while len(out) - pos >= 4:
        length = min(out[pos] | out[pos + 1] << 8 | out[pos + 2] << 16, size)
        out[pos : pos + 3] = length.to_bytes(3, "little")
        pos += 4 + length
    return bytes(out)


def chunks(data: bytes, sel: int) -> list[bytes]:
    """``data`` cut as ``sel`` says: 0 whole, 1 byte by byte, else pseudo-random sizes."""
    if sel == 0 or not data:
        return [data] if data else []
    if sel == 1:
        return [data[i : i + 1] for i in range(len(data))]
    rng = random.Random(sel)
    top = 1 + (sel % 61)
    out, pos = [], 0
    while pos < len(data):
        n = rng.randint(1, top)
        out.append(data[pos : pos + n])
        pos += n
    return out


def frames(*payloads: bytes, seq: int = 0) -> bytes:
    out = []
    for p in payloads:
        f, seq = encode_packet(p, seq)
        out.append(f)
    return b"".join(out)


def run_sync(coro):
    """Run a coroutine that never really suspends (its channel answers at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise Finding("the coroutine suspended: it waits for something its input cannot give")


class ChunkChannel:
    """The Channel interface over a list of chunks; PeerClosed once they are used up."""

    def __init__(self, parts: list[bytes]) -> None:
        self.decoder = PacketDecoder()
        self._parts = list(reversed(parts))
        self.sent: list[bytes] = []
        self.closed = False
        self.name = "fuzz"

    async def recv(self, size: int = 1 << 18, wait_first: bool = False) -> bytes:
        if not self._parts:
            raise PeerClosed("fuzz: end of input")
        return self._parts.pop()

    async def read_packet(self, max_size: int | None = None):
        while True:
            packet = self.decoder.next_packet()
            if packet is not None:
                return packet
            self.decoder.feed(await self.recv())

    async def send(self, data) -> None:
        self.sent.append(bytes(data))

    def unread(self) -> int:
        return self.decoder.buffered() + sum(len(p) for p in self._parts)

    def close(self) -> None:
        self.closed = True


CAPS = int(PROXY_CAPABILITIES)
C = Capabilities

# ----------------------------------------------------------------------------- framing


def _decode_all(stream: bytes, parts: list[bytes], max_payload: int | None):
    decoder = PacketDecoder(max_payload)
    packets = []
    consumed = 0
    fed = 0
    try:
        for part in parts:
            decoder.feed(part)
            fed += len(part)
            while (packet := decoder.next_packet()) is not None:
                raw = bytes(packet.raw)
                check(raw == stream[consumed : consumed + len(raw)], "raw frames are not the bytes received")
                consumed += len(raw)
                _check_packet(packet, raw, max_payload)
                packets.append((packet.seq, packet.last_seq, bytes(packet.payload), raw))
            check(decoder.buffered() == fed - consumed, "decoder lost or invented bytes")
            header = decoder.peek_header()
            if fed - consumed >= 4:
                rest = stream[consumed:]
                check(header == (rest[0] | rest[1] << 8 | rest[2] << 16, rest[3]), "peek_header disagrees")
            else:
                check(header is None, "peek_header without 4 bytes")
    except ProtocolError:
        check(max_payload is not None, "ProtocolError from a decoder without a size limit")
        return packets, "ProtocolError"
    return packets, None


def _check_packet(packet, raw: bytes, max_payload: int | None) -> None:
    pos, parts, seqs = 0, [], []
    while True:
        length = raw[pos] | raw[pos + 1] << 8 | raw[pos + 2] << 16
        seqs.append(raw[pos + 3])
        parts.append(raw[pos + 4 : pos + 4 + length])
        pos += 4 + length
        if length < framing.MAX_FRAME:
            break
        check(length == framing.MAX_FRAME, "frame longer than MAX_FRAME")
    check(pos == len(raw), "raw holds more than the packet")
    check(b"".join(parts) == packet.payload, "payload is not the frames' payloads")
    check(packet.seq == seqs[0] and packet.last_seq == seqs[-1], "sequence ids")
    if max_payload is not None:
        check(len(packet.payload) <= max_payload, "packet over max_payload accepted")
    # encode_packet of the payload gives the same frames when the ids are consecutive
    if all(s == (seqs[0] + i) & 0xFF for i, s in enumerate(seqs)):
        check(encode_packet(packet.payload, seqs[0])[0] == raw, "encode_packet does not round-trip")


def t_framing(data: bytes) -> None:
    i = In(data)
    opts, sel = i.byte(), i.byte()
    max_payload = (i.byte() * 3) if opts & 4 else None
    size = FRAME_SIZES[opts & 3]
    stream = clamp_frames(i.rest(), size)
    with frame_size(size):
        one = _decode_all(stream, [stream] if stream else [], max_payload)
        many = _decode_all(stream, chunks(stream, sel), max_payload)
    check(one == many, f"chunking changes the packets: {one!r} != {many!r}")


def s_framing() -> list[bytes]:
    big = bytes(range(40))
    return [
        b"\x00\x00" + frames(b"\x03SELECT 1", b"\x0e"),
        b"\x01\x01" + frames(big),  # 5-byte frames: continued
        b"\x02\x07" + frames(big[:8], big[:16], b""),
        b"\x04\x03\x05" + frames(big, b"\x01"),
        b"\x00\x00\xff\xff\xff\x00",  # a 16 MiB header, no body
        b"\x03\x02" + frames(big[:26]) + b"\x0d\x00",
    ]


# ----------------------------------------------------------------------------- handshakes


def _scramble() -> bytes:
    return bytes(range(1, 21))


def t_handshake_response(data: bytes) -> None:
    try:
        resp = parse_handshake_response(data)
    except ProtocolError:
        return
    check(isinstance(resp.username, str) and isinstance(resp.auth_response, bytes), "types")
    if resp.ssl_request:
        return
    auth = ServerAuth(_scramble(), {"app": "apppw", "root": ""}, "127.0.0.1")
    result = auth.start(resp)
    if not result.done:
        auth.on_packet(resp.auth_response)
    # What the proxy builds for the backend from the client's database and attributes.
    attrs_ = dict(resp.connect_attrs, _proxy="replay-proxy")
    out = make_handshake_response(
        HandshakeResponse(
            CAPS | C.CLIENT_CONNECT_WITH_DB, 1 << 30, resp.charset & 0xFF, "app", b"x" * 20, resp.database, NATIVE, attrs_
        )  # fmt: skip
    )
    back = parse_handshake_response(out)
    check(back.database == resp.database and back.connect_attrs == attrs_, "backend login response does not round-trip")


def s_handshake_response() -> list[bytes]:
    out = []
    for caps in (CAPS, CAPS & ~C.CLIENT_PLUGIN_AUTH_LENENC_CLIENT_DATA, CAPS | C.CLIENT_CONNECT_WITH_DB,
                 int(C.CLIENT_PROTOCOL_41 | C.CLIENT_SSL)):  # fmt: skip
        resp = HandshakeResponse(caps, 1 << 24, 45, "app", b"\x01" * 20, "test", NATIVE, {"_client_name": "fuzz", "k": "v"})
        out.append(make_handshake_response(resp))
    out.append(struct.pack("<IIB", CAPS | C.CLIENT_SSL, 1 << 24, 45) + bytes(23))
    out.append(struct.pack("<IIB", CAPS, 1 << 24, 45) + bytes(23) + b"app\x00\xfe" + b"\xff" * 8)  # 2^64 length
    return out


def t_change_user(data: bytes) -> None:
    i = In(data)
    caps = i.u32()
    payload = b"\x11" + i.rest()
    try:
        change = parse_change_user(payload, caps)
    except ProtocolError:
        return
    auth = ServerAuth(_scramble(), {"app": "apppw"}, "127.0.0.1")
    resp = HandshakeResponse(caps, 0, change.charset or 45, change.username, change.auth_response,
                             change.database, change.auth_plugin, change.connect_attrs)  # fmt: skip
    result = auth.start(resp)
    if not result.done:
        auth.on_packet(change.auth_response)


def s_change_user() -> list[bytes]:
    from proxy.protocol.packets import make_change_user

    out = []
    for caps in (CAPS, CAPS & ~C.CLIENT_SECURE_CONNECTION, CAPS & ~C.CLIENT_CONNECT_ATTRS):
        payload = make_change_user("app", b"\x02" * 20, "test", 45, NATIVE, {"a": "b"}, caps)
        out.append(struct.pack("<I", caps) + payload[1:])
    out.append(struct.pack("<I", CAPS) + b"app\x00\x14" + b"x" * 20 + b"db\x00\x2d\x00caching_sha2_password\x00\xfe" + b"\xff" * 8)
    return out


def t_server_handshake(data: bytes) -> None:
    try:
        hs = parse_server_handshake(data)
    except ProtocolError:
        return
    Dialect.from_server_version(hs.server_version)
    ClientAuth("app", "apppw", hs.scramble, hs.auth_plugin).first_response()
    # The proxy greets its clients with the backend's version.
    greeting = ServerHandshake(hs.server_version, 1_000_000_001, _scramble(), CAPS, hs.charset, hs.status, NATIVE)
    back = parse_server_handshake(make_server_handshake(greeting))
    check(back.server_version == hs.server_version and back.scramble == _scramble(), "greeting does not round-trip")


def s_server_handshake() -> list[bytes]:
    out = [make_server_handshake(ServerHandshake(v, 7, bytes(range(65, 85)), CAPS, 45, 2, p))
           for v, p in (("10.11.19-MariaDB", NATIVE), ("8.0.11-TiDB-v8.5.1", CACHING_SHA2), ("5.5.5-10.6.1-MariaDB", SHA256))]  # fmt: skip
    out.append(make_err(1040, "08004", "Too many connections"))
    out.append(b"\x0a5.7.0\x00\x01\x00\x00\x00abcdefgh\x00\xff\xf7")  # pre-4.1 style: no second part
    return out


# ----------------------------------------------------------------------------- single packets


def t_packets(data: bytes) -> None:
    i = In(data)
    sel = i.byte()
    caps = i.u32()
    payload = i.rest()
    which = sel % 8
    try:
        if which == 0:
            ok = parse_ok(payload, caps)
            check(0 <= ok.status < 1 << 16 and 0 <= ok.warnings < 1 << 16, "OK fields out of range")
        elif which == 1:
            err = parse_err(payload)
            str(err)
        elif which == 2:
            parse_eof(payload)
        elif which == 3:
            parse_auth_switch(payload)
        elif which == 4:
            parse_prepare_ok(payload)
        elif which == 5:
            r = Reader(payload)
            while r.remaining():
                op = r.u8() % 6
                if op == 0:
                    r.lenenc_str()
                elif op == 1:
                    r.null_str()
                elif op == 2:
                    r.null_str_or_rest()
                elif op == 3:
                    r.lenenc()
                elif op == 4:
                    r.fixed(r.u8())
                else:
                    r.u24()
        else:  # what the backend task does with bytes that arrive while the client is idle
            responses.unsolicited_err(payload)
            responses.describe_unsolicited(payload)
    except ProtocolError:
        return


def s_packets() -> list[bytes]:
    caps = struct.pack("<I", CAPS)
    return [
        b"\x00" + caps + make_ok(2, 1, 5, 0, b"info"),
        b"\x00" + caps + b"\x00\xfc\x01\x00\xfe" + b"\xff" * 8 + b"\x02\x00\x00\x00\x05hello",
        b"\x01" + caps + make_err(1064, "42000", "syntax"),
        b"\x01" + caps + b"\xff\x15\x04#HY0",
        b"\x02" + caps + make_eof(2),
        b"\x03" + caps + b"\xfecaching_sha2_password\x00" + b"s" * 20 + b"\x00",
        b"\x04" + caps + b"\x00\x01\x00\x00\x00\x02\x00\x03\x00\x00\x00\x00",
        b"\x05" + caps + b"\x00\xfe\xff\xff\xff\xff\xff\xff\xff\x0f",
        b"\x06" + caps + frames(make_err(1927, "70100", "Connection was killed")),
    ]


def t_backend_auth(data: bytes) -> None:
    """The proxy's side of a backend login fed arbitrary server packets."""
    i = In(data)
    sel = i.byte()
    plugin = (NATIVE, CACHING_SHA2, SHA256, "dialog")[sel & 3]
    password = "" if sel & 4 else "apppw"
    auth = ClientAuth("app", password, _scramble(), plugin)
    auth.first_response()
    rest = i.rest()
    pos = 0
    while pos < len(rest):
        n = rest[pos]
        packet = rest[pos + 1 : pos + 1 + n] if n != 0xFF else rest[pos + 1 :]
        pos += 1 + (n if n != 0xFF else len(rest))
        try:
            action, _value = auth.on_packet(packet)
        except ProtocolError:
            return
        check(action in ("send", "ok", "error", "wait"), f"unknown action {action!r}")
        if action in ("ok", "error"):
            return


def _pem() -> bytes:
    return (
        b"-----BEGIN PUBLIC KEY-----\nMFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBAKj34GkxFhD90vcNLYLInFEX6Ppy1tPf\n"
        b"9Cnzj4p4WGeKLs1Pt8QuKUpRKfFLfRYC9AIKjbJTWit+CqvjWYzvQwECAwEAAQ==\n-----END PUBLIC KEY-----\n"
    )


def s_backend_auth() -> list[bytes]:
    def pk(*ps: bytes) -> bytes:
        return b"".join(bytes([len(p)]) + p if len(p) < 0xFF else b"\xff" + p for p in ps)

    return [
        b"\x00" + pk(make_ok(2)),
        b"\x01" + pk(b"\x01\x03", make_ok(2)),
        b"\x01" + pk(b"\x01\x04") + b"\xff\x01" + _pem(),
        b"\x02\xff\x01" + _pem(),
        b"\x00" + pk(b"\xfecaching_sha2_password\x00" + b"s" * 20 + b"\x00", b"\x01\x04") + b"\xff\x01garbage",
        b"\x00" + pk(b"\xfedialog\x00x\x00"),
        b"\x00" + pk(b"\xfesha256_password\x00" + b"s" * 20 + b"\x00") + b"\xff\x01not a key",
        b"\x00" + pk(make_err(1045, "28000", "denied")),
    ]


# ----------------------------------------------------------------------------- response tracker


def _track(expect: Expect, deprecate: bool, fingerprint: bool, parts: list[bytes], total: int):
    tracker = ResponseTracker(expect, deprecate, fingerprint)
    offset = 0
    end = None
    try:
        for part in parts:
            r = tracker.feed(part)
            check(-1 <= r <= len(part), f"feed returned {r} for {len(part)} bytes")
            check((r >= 0) == tracker.done, "feed's answer and done disagree")
            if r >= 0:
                end = offset + r
                break
            offset += len(part)
        if not parts and tracker.done:
            end = 0
    except ProtocolError:
        return ("ProtocolError",)
    if end is not None:
        check(tracker.nbytes == end, f"nbytes {tracker.nbytes} != end {end}")
    else:
        check(tracker.nbytes == total, f"nbytes {tracker.nbytes} != fed {total}")
    return (end, tracker.done, tracker.status, tracker.saw_status, tracker.rows, tracker.results, tracker.error,
            tracker.ok, tracker.prepare_ok, tracker.local_infile, tracker.last_seq, tracker.fingerprint)  # fmt: skip


def t_response(data: bytes) -> None:
    i = In(data)
    opts, sel = i.byte(), i.byte()
    expect = Expect(opts & 7)
    deprecate = bool(opts & 8)
    size = FRAME_SIZES[(opts >> 4) & 3]
    stream = clamp_frames(i.rest(), size)
    whole = [stream] if stream else []
    with frame_size(size):
        one = _track(expect, deprecate, True, whole, len(stream))
        many = _track(expect, deprecate, True, chunks(stream, sel), len(stream))
        plain = _track(expect, deprecate, False, chunks(stream, sel ^ 0x55), len(stream))
    check(one == many, f"chunking changes the result: {one!r} != {many!r}")
    check(one[:-1] == plain[:-1], f"fingerprinting changes the result: {one!r} != {plain!r}")


def s_response() -> list[bytes]:
    col = lenenc_str(b"def") + lenenc_str(b"") * 3 + lenenc_str(b"c") + lenenc_str(b"") + b"\x0c" + bytes(12)
    rows = [lenenc_str(b"1"), b"\xfb", lenenc_str(b"x" * 30)]
    text_eof = frames(b"\x01", col, make_eof(2), *rows, make_eof(2), seq=1)
    text_dep = frames(b"\x01", col, *rows, make_ok(2, header=0xFE), seq=1)
    multi = frames(b"\x01", col, make_eof(2), *rows, make_eof(0x0A), make_ok(2), seq=1)
    prepare = frames(b"\x00" + struct.pack("<IHHBH", 1, 1, 2, 0, 0), col, col, make_eof(2), col, make_eof(2), seq=1)
    prepare_dep = frames(b"\x00" + struct.pack("<IHHBH", 1, 1, 2, 0, 0), col, col, col, seq=1)
    cursor = frames(b"\x01", col, make_eof(0x42), seq=1)
    return [
        bytes([Expect.QUERY, 0]) + frames(make_ok(2, 1, 1), seq=1),
        bytes([Expect.QUERY, 1]) + text_eof,
        bytes([Expect.QUERY | 8, 7]) + text_dep,
        bytes([Expect.QUERY, 9]) + multi,
        bytes([Expect.QUERY, 0]) + frames(b"\xfbfile.csv", seq=1),
        bytes([Expect.QUERY | 0x10, 3]) + frames(b"\x01", col, make_eof(2), b"\x10" + b"y" * 40, make_eof(2), seq=1),
        bytes([Expect.EXECUTE, 2]) + cursor,
        bytes([Expect.EXECUTE, 4]) + frames(b"\x01", col, make_eof(2), b"\x00\x00" + b"\x01" * 8, make_err(1317, "70100", "x"), seq=1),
        bytes([Expect.PREPARE, 5]) + prepare,
        bytes([Expect.PREPARE | 8, 6]) + prepare_dep,
        bytes([Expect.FETCH, 8]) + frames(*rows, make_eof(2), seq=1),
        bytes([Expect.FIELD_LIST, 10]) + frames(col, col, make_eof(2), seq=1),
        bytes([Expect.STRING, 0]) + frames(b"Uptime: 5  Threads: 1", seq=1),
        bytes([Expect.SINGLE, 1]) + frames(make_ok(2), seq=1),
        bytes([Expect.SINGLE, 2]) + b"\x00\x00\x00\x01",
        bytes([Expect.QUERY, 0]) + b"\xff\xff\xff\x01",  # 16 MiB, no body
        bytes([Expect.QUERY, 0]) + frames(b"\xfe" + b"\xff" * 8, seq=1),  # 2^64 columns
        bytes([Expect.NONE, 0]) + frames(make_ok(2), seq=1),
    ]


# ----------------------------------------------------------------------------- SQL text

DIALECTS = (UNKNOWN, MARIADB, Dialect("mariadb", 100500), Dialect("tidb", 80011), Dialect("mysql", 80036),
            Dialect("mysql", 50744), Dialect("mariadb", 110402), Dialect("tidb", 50799))  # fmt: skip


def _sql_input(data: bytes) -> tuple[bytes, str, Dialect, bool, bool]:
    i = In(data)
    opts = i.byte()
    raw = i.rest()
    dialect = DIALECTS[opts & 7]
    nbe = bool(opts & 8)
    multi = bool(opts & 16)
    text = raw.decode("latin-1") if opts & 32 else raw.decode("utf-8", "surrogateescape")
    return raw, text, dialect, nbe, multi


def t_sql_lexer(data: bytes) -> None:
    raw, text, dialect, nbe, multi = _sql_input(data)
    try:
        full = tokenize(text, dialect=dialect, no_backslash_escapes=nbe, trivia=True)
    except SqlParseError as exc:
        full, full_error = None, type(exc)
    else:
        full_error = None
        pos = 0
        for tok in full:
            check(tok.start == pos and text[tok.start : tok.end] == tok.text, f"token {tok!r} is not the text at {pos}")
            pos = tok.end
        check(pos == len(text), "tokens with trivia do not cover the text")
    try:
        bare = tokenize(text, dialect=dialect, no_backslash_escapes=nbe)
    except SqlParseError as exc:
        check(full_error is type(exc), f"trivia changes the error: {full_error} vs {type(exc)}")
    else:
        check(full_error is None, "trivia=True raised, trivia=False did not")
        check(bare == [t for t in full if t.kind not in TRIVIA], "trivia=False tokens differ")
    try:
        spans = split_statements(text, dialect=dialect, no_backslash_escapes=nbe)
    except SqlParseError:
        pass
    else:
        last = 0
        for a, b in spans:
            check(last <= a < b <= len(text), f"bad spans {spans}")
            last = b
    redact(text, dialect, nbe)
    try:
        leading_keywords(text, 3, dialect=dialect, nbe=nbe)
    except SqlParseError:
        pass
    payload = b"\x03" + raw
    verb = fast_verb(payload, multi)
    if verb is not None:
        may_pin_session(payload)


def t_sql_judge(data: bytes) -> None:
    raw, text, dialect, nbe, multi = _sql_input(data)
    analysis = analyze(text, dialect=dialect, no_backslash_escapes=nbe, multi=multi)
    check(len(analysis.statements) == len(analysis.spans) or analysis.unknown is not None, "statements and spans")
    for n, (a, b) in enumerate(analysis.spans):
        part = text[a:b]
        st = classify(part, dialect=dialect, no_backslash_escapes=nbe)
        empty = analysis.first.kind is Kind.EMPTY  # (no statement: the whole text is the span)
        if (analysis.unknown is None or len(analysis.spans) > 1) and not empty:
            check(st == analysis.statements[n], "classify of a span differs from analyze")
        analysis.keywords(n, 3)
        st.writes, st.may_commit, st.may_end_transaction  # noqa: B018
        claim(part, dialect, nbe)
        claim(part, dialect, nbe, [bool(x & 1) for x in raw[:8]])
        is_idempotent(part, dialect=dialect, no_backslash_escapes=nbe)
        changes_no_rows(part, dialect, nbe)
        try:
            parse_set(part, dialect=dialect, no_backslash_escapes=nbe)
        except SqlParseError:
            pass
        try:
            parse_insert_head(part, dialect=dialect, no_backslash_escapes=nbe)
        except SqlParseError:
            pass
    analysis.writes, analysis.read_only, analysis.session_only, analysis.may_commit  # noqa: B018
    # The fast path answers only when the judge would agree.
    payload = b"\x03" + raw
    verb = fast_verb(payload, multi)
    if verb is not None and analysis.unknown is None:
        check(analysis.single and analysis.first.kind is Kind[verb.decode()], f"fast path says {verb!r}, the judge {analysis.statements}")
        # (What it calls -- a stored function -- is judged at recovery, from the journal.)
        first = analysis.first
        check(not (first.implicit_commit or first.xa or first.kind in (Kind.COMMIT, Kind.ROLLBACK)),
              "fast path statement may end a transaction")  # fmt: skip
        reason = first.session_unrestorable
        # (INTO @v in an INSERT/UPDATE/DELETE is a syntax error on the server: nothing assigned.)
        if not may_pin_session(payload) and reason is not None and not reason.startswith("SELECT ... INTO @variable"):
            raise Finding(f"fast path misses {reason}")
    # Split mode reads oversized INSERTs from the network too.
    limit = 16 + (raw[0] if raw else 0) * 4
    try:
        pieces = split_values_statement(raw, limit, no_backslash_escapes=nbe)
    except CannotSplit:
        pass
    else:
        check(bool(pieces), "no pieces")
        if len(pieces) > 1:
            check(all(len(p) + 1 <= limit for p in pieces), "a piece over the limit")
            for p in pieces:
                count_rows(p, no_backslash_escapes=nbe)


def s_sql() -> list[bytes]:
    texts = [
        "SELECT 1", "BEGIN", "COMMIT AND CHAIN", "INSERT INTO t VALUES (1, 'a'), (2, 'b') ON DUPLICATE KEY UPDATE v = VALUES(v)",
        "REPLACE INTO t (k, v) VALUES (1, 'x')", "DELETE FROM t WHERE k = 1 LIMIT 1", "UPDATE t SET v = 2 WHERE k IN (1, 2)",
        "SET NAMES utf8mb4; SET autocommit = 0, @x = 1, sql_mode = CONCAT(@@sql_mode, ',ANSI')",
        "/*!40101 SET @OLD = @@SQL_MODE */; /*M!100100 SELECT 1 */ -- c\n# h\nSELECT 'a''b\\'c', \"q\", `i``d`",
        "SET STATEMENT max_statement_time=1 FOR SELECT GET_LOCK('x', 1)", "SELECT 1 INTO @v", "/*T![clustered_index] x */ SELECT 1",
        "START TRANSACTION READ ONLY, WITH CONSISTENT SNAPSHOT", "XA START 'x'", "CALL p(1)", "WITH a AS (SELECT 1) DELETE FROM t",
        "SELECT x'4142', b'01', 0x1f, 1e5, .5, @@session.x, @`u`, ? FROM t FOR UPDATE", "ROLLBACK TO SAVEPOINT s",
        "INSERT INTO t VALUES ('\\', 1)", "SELECT '", "SELECT /* unterminated", "SELECT 1;;SELECT 2", "ANALYZE SELECT 1",
    ]  # fmt: skip
    out = []
    for n, t in enumerate(texts):
        out.append(bytes([n % 64]) + t.encode())
    out.append(b"\x00" + "SELECT 'é', `ü` FROM 表".encode() + b"\xff\xfe")
    return out


# ----------------------------------------------------------------------------- result sets


def t_resultset(data: bytes) -> None:
    i = In(data)
    sel = i.byte()
    deprecate = bool(sel & 8)
    size = FRAME_SIZES[(sel >> 4) & 3]
    with frame_size(size):
        if sel & 3 == 0:
            try:
                resultset.read_text_result(clamp_frames(i.rest(), size), deprecate)
            except ProtocolError:
                pass
        elif sel & 3 == 1:
            ncols = i.byte()
            try:
                resultset.decode_text_row(i.rest(), ncols)
            except ProtocolError:
                pass
        else:  # build -> read round trip
            ncols = 1 + i.byte() % 4
            rest = i.rest()
            coldefs = [b"\x03def" + bytes([n]) * n for n in range(ncols)]
            rows, pos = [], 0
            while pos < len(rest):
                row = []
                for _ in range(ncols):
                    n = rest[pos] if pos < len(rest) else 0
                    row.append(None if n == 0xFB else rest[pos + 1 : pos + 1 + n])
                    pos += 1 + (0 if n == 0xFB else n)
                rows.append(row)
            built = resultset.build_text_result(coldefs, rows, 2, deprecate)
            got = resultset.read_text_result(built, deprecate)
            check(got == (coldefs, rows), "build_text_result/read_text_result do not round-trip")


def s_resultset() -> list[bytes]:
    col = lenenc_str(b"def") + lenenc_str(b"") * 3 + lenenc_str(b"c") + lenenc_str(b"") + b"\x0c" + bytes(12)
    return [
        b"\x00" + frames(b"\x01", col, make_eof(2), lenenc_str(b"v"), b"\xfb", make_eof(2), seq=1),
        b"\x08" + frames(b"\x02", col, col, lenenc_str(b"a") + lenenc_str(b"b"), make_ok(2, header=0xFE), seq=1),
        b"\x00" + frames(make_err(1146, "42S02", "no table"), seq=1),
        b"\x01\x03" + lenenc_str(b"a") + b"\xfb",
        b"\x01\x02",
        b"\x02\x02\x01a\xfb\x00\x03xyz",
        b"\x12\x01\x0aabcdefghij\x01z",
        b"\x00" + frames(b"\x01", col, make_eof(2), b"\x01", seq=1),
    ]


# ----------------------------------------------------------------------------- backend: login and own queries


class _Opened:
    def __init__(self, channel: ChunkChannel) -> None:
        self.channel = channel

    async def __call__(self, address):
        return self.channel


def t_backend_login(data: bytes) -> None:
    """connect_backend (greeting, authentication, SELECT @@max_allowed_packet) and
    Backend.query against a server that says whatever the input says."""
    i = In(data)
    sel, csel = i.byte(), i.byte()
    stream = i.rest()
    channel = ChunkChannel(chunks(stream, csel))
    login = Login("app", "" if sel & 4 else "apppw", "test" if sel & 8 else None, 45, CAPS | C.CLIENT_DEPRECATE_EOF * (sel & 1))

    async def main():
        try:
            if sel & 2:
                hs = ServerHandshake("10.11.19-MariaDB", 5, _scramble(), CAPS, 45, 2, NATIVE)
                backend = Backend(channel, Address("127.0.0.1", 1), hs, CAPS & ~(C.CLIENT_DEPRECATE_EOF * (sel & 1)), 2, 0.0)
                await backend.query("SELECT @@max_allowed_packet")
            else:
                await connect_backend(Address("127.0.0.1", 1), login, connect_timeout=5, io_timeout=5, opener=_Opened(channel))
        except (BackendError, PeerClosed, ProtocolError):
            pass

    trio.run(main)


def s_backend_login() -> list[bytes]:
    greeting = make_server_handshake(ServerHandshake("10.11.19-MariaDB", 5, _scramble(), CAPS, 45, 2, NATIVE))
    col = lenenc_str(b"def") + lenenc_str(b"") * 3 + lenenc_str(b"c") + lenenc_str(b"") + b"\x0c" + bytes(12)
    mp = frames(b"\x01", col, make_eof(2), lenenc_str(b"67108864"), make_eof(2), seq=1)
    return [
        b"\x00\x00" + frames(greeting) + frames(make_ok(2), seq=2) + mp,
        b"\x10\x03" + frames(greeting) + frames(make_ok(2), seq=2),
        b"\x00\x05"
        + frames(greeting)
        + frames(b"\xfecaching_sha2_password\x00" + b"s" * 20 + b"\x00", seq=2)
        + frames(b"\x01\x04", seq=4)
        + frames(b"\x01garbage", seq=6),
        b"\x00\x00" + frames(greeting) + frames(b"\xfesha256_password\x00" + b"s" * 20 + b"\x00", seq=2) + frames(b"\x01" + _pem(), seq=4),
        b"\x00\x00" + frames(greeting) + frames(b"\xfeunknown_plugin\x00x\x00", seq=2),
        b"\x02\x00" + mp,
        b"\x02\x00" + frames(b"", seq=1),
        b"\x02\x00" + frames(b"\x01", col, make_eof(2), b"", make_eof(2), seq=1),
        b"\x02\x00" + frames(b"\x01", col, make_eof(2), b"\x05ab", make_eof(2), seq=1),
        b"\x00\x00" + frames(b"garbage after the greeting"),
    ]


# ----------------------------------------------------------------------------- intake


def _reference_command(stream: bytes):
    """(frames length, payload, last seq) of the first command, None if incomplete."""
    pos, parts = 0, []
    while True:
        if len(stream) - pos < 4:
            return None
        length = stream[pos] | stream[pos + 1] << 8 | stream[pos + 2] << 16
        seq = stream[pos + 3]
        if len(stream) - pos - 4 < length:
            return None
        parts.append(stream[pos + 4 : pos + 4 + length])
        pos += 4 + length
        if length < intake.MAX_FRAME:
            return pos, b"".join(parts), seq


def t_intake(data: bytes) -> None:
    i = In(data)
    opts, sel = i.byte(), i.byte()
    max_size = 1 + i.byte() * 2
    spool = 1 + i.byte()
    keep = max_size + (i.byte() if opts & 4 else 0)
    size = FRAME_SIZES[opts & 3]
    stream = clamp_frames(i.rest(), size)
    with frame_size(size):
        channel = ChunkChannel(chunks(stream, sel))
        ref = _reference_command(stream)
        whole = intake.whole_command(stream, max_size, spool)  # the stream as one read
        if whole is not None:
            check(ref is not None and ref[0] == len(stream), "whole_command took a read that is not exactly one command")
            check(whole.complete and whole.payload == ref[1] and whole.seq_end == ref[2] and whole.raw == stream, "whole_command's fields")
            check(len(ref[1]) <= max_size, "whole_command took a command over the limit")
        try:
            got = run_sync(reading.read_command(channel, max_size, spool, keep))
        except PeerClosed:
            check(ref is None, "PeerClosed although the command was complete")
            return
        check(ref is not None, f"a command from incomplete input: {got!r}")
        n, payload, seq = ref
        check(channel.unread() == len(stream) - n, "read_command consumed the wrong number of bytes")
        if isinstance(got, intake.Oversized):
            check(len(payload) > keep, "Oversized within the limit")
            check(got.size == len(payload) and got.seq_end == seq and got.code == (payload[0] if payload else -1), "Oversized fields")
            return
        try:
            check(len(payload) <= keep, f"a {len(payload)}-byte command over keep_up_to={keep} kept")
            check(got.size == len(payload) and got.seq_end == seq, "Command size / seq_end")
            check(got.full_payload() == payload, "Command payload")
            if got.complete:
                check(got.payload == payload and bytes(got.raw) == stream[:n], "Command payload / raw")
            else:
                check(got.payload == payload[: intake.HEAD_SIZE], "spooled head")
                check(b"".join(got.frames()) == stream[:n], "spooled frames")
        finally:
            got.release()


def s_intake() -> list[bytes]:
    big = bytes(range(1, 41))
    return [
        b"\x00\x00\x40\xff\x00" + frames(b"\x03SELECT 1") + frames(b"\x0e"),
        b"\x01\x01\x40\x08\x00" + frames(big),
        b"\x05\x03\x02\x04\x30" + frames(b"\x03" + big),
        b"\x02\x09\x01\x01\x00" + frames(big[:16], seq=3),
        b"\x00\x00\x01\x01\x00" + b"\xff\xff\xff\x00",  # a 16 MiB frame, no body
        b"\x00\x00\x40\x40\x00" + b"\x00\x00\x00\x00",  # an empty command
    ]


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target("framing", t_framing, s_framing, "PacketDecoder, continuation frames, arbitrary chunkings"),
        Target("handshake_response", t_handshake_response, s_handshake_response, "client HandshakeResponse41 + ServerAuth"),
        Target("change_user", t_change_user, s_change_user, "COM_CHANGE_USER + ServerAuth"),
        Target("server_handshake", t_server_handshake, s_server_handshake, "backend greeting (protocol v10)"),
        Target("packets", t_packets, s_packets, "OK / ERR / EOF / auth switch / PREPARE_OK / Reader / unsolicited ERR"),
        Target("backend_auth", t_backend_auth, s_backend_auth, "ClientAuth (backend login) fed server packets"),
        Target("response", t_response, s_response, "ResponseTracker: every Expect, chunkings, fingerprint on/off"),
        Target("sql_lexer", t_sql_lexer, s_sql, "tokenize / split_statements / redact / fast path, dialects, NBE"),
        Target("sql_judge", t_sql_judge, s_sql, "analyze / classify / claim / parse_set / insert head / split"),
        Target("resultset", t_resultset, s_resultset, "text result-set reader, rows, build round trip"),
        Target("backend_login", t_backend_login, s_backend_login, "connect_backend and Backend.query over fuzzed server bytes"),
        Target("intake", t_intake, s_intake, "read_command: limits, spooling, continuation, chunkings"),
    ]
}
